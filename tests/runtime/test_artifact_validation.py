"""Artifacts are validated, never trusted: checksums, the plan, the CPU object's machine, the
accelerator files' configuration hashes; and a fuzz test (fixed seeds) that flips bytes,
truncates, drops members and edits the plan, and finds every load either refused with an
`ArtifactError` or identical in its result, never another exception and never a crash."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vtakit import digits, models
from vtakit.compiler.compile import compile_model
from vtakit.driver.program import Program
from vtakit.runtime import Artifact, ArtifactError, GraphExecutor
from vtakit.runtime.artifact import FORMAT_VERSION
from vtakit.runtime.cpu.runner import host_object_meta
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_sim import RunImage

Files = dict[str, bytes]


@pytest.fixture(scope="module")
def mlp() -> bytes:
    return compile_model(models.mlp(), threads=2).to_bytes()


@pytest.fixture(scope="module")
def vta() -> bytes:
    return compile_model(digits.load_model(), target="vta", quantize=True,
                         calib=digits.calibration_set()).to_bytes()


def _unzip(data: bytes) -> Files:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(files: Files, resign: bool = True) -> bytes:
    """An artifact of `files`; with `resign` the manifest's checksums are made to match them,
    so that what the loader sees is the edit itself, not a checksum mismatch."""
    files = dict(files)
    if resign:
        manifest = json.loads(files["manifest.json"])
        manifest["members"] = {n: {"size_bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                               for n, b in files.items() if n != "manifest.json"}
        files["manifest.json"] = json.dumps(manifest).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n, b in files.items():
            z.writestr(n, b)
    return out.getvalue()


def _edit_plan(data: bytes, change: Callable[[dict], Any], resign: bool = True) -> bytes:
    files = _unzip(data)
    plan = json.loads(files["plan.json"])
    change(plan)
    files["plan.json"] = json.dumps(plan).encode()
    return _zip(files, resign)


def _input(plan_inputs: list) -> np.ndarray:
    _, dt, shape = plan_inputs[0]
    return np.random.default_rng(7).standard_normal(shape).astype(dt)


def _run(art: Artifact) -> np.ndarray:
    ex = GraphExecutor(art)
    try:
        ex.set_input(0, _input(art.plan.inputs))
        ex.run()
        return ex.get_output(0)
    finally:
        ex.close()


# ---- checksums and the format version ----------------------------------------------------

def test_every_member_has_a_checksum_and_a_changed_one_is_named(mlp: bytes) -> None:
    files = _unzip(mlp)
    listed = json.loads(files["manifest.json"])["members"]
    assert set(listed) == set(files) - {"manifest.json"}
    for name, entry in listed.items():
        assert entry == {"size_bytes": len(files[name]),
                         "sha256": hashlib.sha256(files[name]).hexdigest()}
    obj = bytearray(files["cpu/host.o"])
    obj[len(obj) // 2] ^= 0x10  # garbage in the object code: never loaded, never run
    with pytest.raises(ArtifactError, match=r"member cpu/host\.o: SHA-256 [0-9a-f]{16}\.\.\. of "
                                            r"\d+ bytes, expected [0-9a-f]{16}\.\.\. of \d+ "
                                            r"\(the manifest's\): the member is corrupt"):
        Artifact.load(_zip({**files, "cpu/host.o": bytes(obj)}, resign=False))
    with pytest.raises(ArtifactError, match=r"member\(s\) \['cpu/module\.ll'\] listed in the "
                                            r"manifest are missing"):
        Artifact.load(_zip({n: b for n, b in files.items() if n != "cpu/module.ll"},
                           resign=False))
    with pytest.raises(ArtifactError, match=r"member\(s\) \['cpu/extra\.o'\] are not listed"):
        Artifact.load(_zip({**files, "cpu/extra.o": b"x"}, resign=False))


@pytest.mark.parametrize("version", [2, 1, 99])
def test_other_format_versions_are_refused_saying_which(mlp: bytes, version: int) -> None:
    files = _unzip(mlp)
    m = json.loads(files["manifest.json"])
    m["format_version"] = version
    files["manifest.json"] = json.dumps(m).encode()
    older = r" \(older versions carry no member checksums\)" if version < 3 else ""
    with pytest.raises(ArtifactError, match=rf"format version {version} is not supported: this "
                                            rf"vtakit reads version {FORMAT_VERSION}{older}; "
                                            rf"recompile"):
        Artifact.load(_zip(files, resign=False))


# ---- the plan, before any native code runs ----------------------------------------------

def _shrink_weight(files: Files) -> Files:
    with np.load(io.BytesIO(files["params.npz"])) as z:
        params = {k: z[k] for k in z.files}
    params["p0_packed_b"] = params["p0_packed_b"][:1]
    buf = io.BytesIO()
    np.savez(buf, **params)
    return {**files, "params.npz": buf.getvalue()}


def _plan_change(change: Callable[[dict], Any]) -> Callable[[Files], Files]:
    def edit(files: Files) -> Files:
        plan = json.loads(files["plan.json"])
        change(plan)
        return {**files, "plan.json": json.dumps(plan).encode()}
    return edit


def _manifest_change(files: Files, change: Callable[[dict], Any]) -> Files:
    manifest = json.loads(files["manifest.json"])
    change(manifest)
    return {**files, "manifest.json": json.dumps(manifest).encode()}


def _set(path: str, value: Any) -> Callable[[Files], Files]:
    """Set a field of plan.json by a dotted path ("buffers.3.offset")."""
    def change(plan: dict) -> None:
        *head, last = path.split(".")
        node: Any = plan
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value
    return _plan_change(change)


# Each edit is re-signed: the plan must be refused for what it says, not for its checksum.
# Buffers of the MLP: 0 input, 1 const p0_packed_b (2, 784, 64), 3 and 4 arena, 12 output.
REFUSED = [
    ("shrunk weight", _shrink_weight,
     r"buffer 1 \(const\): parameter 'p0_packed_b': expected dtype float32, shape "
     r"\(2, 784, 64\), got dtype float32, shape \(1, 784, 64\)"),
    ("threads 0", _set("threads", 0), r"plan threads: expected an int in \[1, 1024\], got 0"),
    ("threads null", _set("threads", None), r"plan threads: expected an int .*, got None"),
    ("arena offset past the end", _set("buffers.4.offset", 1 << 20),
     r"buffer 4 \(arena\) offset: expected a multiple of 64 with its 512 bytes inside the arena "
     r"of \d+, got 1048576"),
    ("arena offset misaligned", _set("buffers.4.offset", 3100),
     r"buffer 4 \(arena\) offset: expected a multiple of 64"),
    ("arena too big", _set("arena_bytes", 1 << 40), r"plan arena_bytes: expected at most \d+"),
    ("shape", _set("buffers.3.shape", [1, 785, 1]),
     r"buffer 3 \(arena\) nbytes: expected 3140 \(shape \(1, 785, 1\) of float32\), got 3136"),
    ("negative dim", _set("buffers.3.shape", [1, -784, 1]),
     r"buffer 3 \(arena\) shape: expected a list of at most 32 dimensions, ints >= 0"),
    ("object dtype", _set("buffers.3.dtype", "|O"),
     r"buffer 3 \(arena\) dtype: expected a numpy dtype of numbers or booleans"),
    ("input signature", _set("buffers.0.shape", [2, 392]),
     r"buffer 0 \(input\) dtype and shape: expected those of input 0 \('input'\): float32 "
     r"\(1, 784\), got float32 \(2, 392\)"),
    ("output index", _set("buffers.12.index", 1),
     r"buffer 12 \(output\) index: expected an index < 1 \(the graph's outputs\), got 1"),
    ("argument offset", _set("steps.1.calls.0.args.0", ["b", 3, 3136 + 64]),
     r"step 1 \('relu_4'\) call 0 \(gemm_packed\) argument 0 offset: expected a multiple of 4 "
     r"within buffer 3's 3136 bytes"),
    ("argument kind", _set("steps.1.calls.0.args.0", ["i", 5]),
     r"argument 0 kind: expected an argument for signature letter 'p' \(an int only as a null "
     r"pointer"),
    ("argument buffer", _set("steps.1.calls.0.args.1", ["b", 99, 0]),
     r"argument 1 buffer: expected an index < 13, got \('b', 99, 0\)"),
    ("signature letter", _set("steps.1.calls.0.sig", "ppppllllllllfl"),
     r"argument 13 kind: expected an argument for signature letter 'l'"),
    ("step backend", _set("steps.0.backend", "gpu"),
     r"step 0 \('relu_4:pack'\) backend: expected one of the plan's sections \['cpu'\], "
     r"got 'gpu'"),
    ("extent", _set("steps.0.extent", -1), r"step 0 .* extent: expected an int >= 0, got -1"),
    ("buffer kind", _set("buffers.2.kind", "global"), r"buffer 2 kind: expected one of"),
    ("manifest signature", lambda f: _manifest_change(f, lambda m: m["inputs"][0].update(
        shape=[1, 783])), r"manifest.json inputs: expected the plan's \[\{'name': 'input', "
     r"'dtype': '<f4', 'shape': \[1, 784\]\}\], got \[\{.*\[1, 783\]"),
    ("object for another machine", _plan_change(lambda p: p["sections"]["cpu"]["objects"][
        "host.o"].update(triple="aarch64-unknown-linux-gnu")),
     r"cpu/host\.o: the object is for ELF machine 62 \(x86_64\), 64-bit, little-endian; its "
     r"metadata says triple 'aarch64-unknown-linux-gnu', expected ELF machine 183 \(aarch64\)"),
    ("objects not an object", _set("sections.cpu.objects", []),
     r"the cpu section's 'objects' must be an object"),
    ("params not an npz", lambda f: {**f, "params.npz": b"\x93NUMPY garbage"},
     r"member params.npz is corrupt"),
    ("plan not JSON", lambda f: {**f, "plan.json": b"\xff{"}, r"member plan.json is not JSON"),
]


@pytest.mark.parametrize("edit, message", [(e, m) for _, e, m in REFUSED],
                         ids=[n for n, _, _ in REFUSED])
def test_a_plan_is_refused_for_what_it_says(mlp: bytes, edit: Callable[[Files], Files],
                                            message: str) -> None:
    if "x86_64" in message and not host_object_meta()["triple"].startswith("x86_64"):
        pytest.skip("the message names this host's machine: written for x86_64")
    with pytest.raises(ArtifactError, match=message):
        Artifact.load(_zip(edit(_unzip(mlp))))


def test_calls_are_checked_against_the_functions_the_ir_defines(mlp: bytes) -> None:
    """Checked when the executor is built, before the code is loaded: a call with one argument
    fewer than the function takes would read a register the plan never set."""
    def drop_last_arg(p: dict) -> None:
        c = p["steps"][1]["calls"][0]
        c["sig"], c["args"] = c["sig"][:-1], c["args"][:-1]

    art = Artifact.load(_edit_plan(mlp, drop_last_arg))
    with pytest.raises(ArtifactError, match=r"step 'relu_4' call 0 \(gemm_packed\) sig: "
                                            r"cpu/module.ll defines k0_gemm_packed with "
                                            r"parameters 'ppppllllllllff', the plan calls it "
                                            r"with 'ppppllllllllf'"):
        GraphExecutor(art)
    art = Artifact.load(_edit_plan(mlp, lambda p: p["steps"][1]["calls"][0].update(kernel=7)))
    with pytest.raises(ArtifactError, match=r"kernel: expected an index < 1 \(the cpu "
                                            r"section's kernels\), got 7"):
        GraphExecutor(art)
    art = Artifact.load(_edit_plan(mlp, lambda p: p["steps"][1]["calls"][0].update(
        fname="nope")))
    with pytest.raises(ArtifactError, match=r"cpu/module.ll defines no function 'k0_nope'"):
        GraphExecutor(art)


def test_a_plan_changed_after_loading_is_checked_again(mlp: bytes) -> None:
    art = Artifact.load(mlp)
    art.plan.threads = 0
    with pytest.raises(ArtifactError, match=r"the artifact's plan: plan threads: expected an "
                                            r"int in \[1, 1024\], got 0"):
        GraphExecutor(art)


def test_profile_needs_a_positive_repeat(mlp: bytes) -> None:
    ex = GraphExecutor(Artifact.load(mlp))
    for bad in (0, -3):
        with pytest.raises(ValueError, match=rf"profile: repeat={bad}, expected an int >= 1"):
            ex.profile(repeat=bad)
    with pytest.raises(TypeError, match="profile: repeat must be an int, got float"):
        ex.profile(repeat=1.5)  # type: ignore[arg-type]
    assert len(ex.profile(repeat=1)) == len(ex.plan.steps)


def _other_triple() -> tuple[str, str]:
    """A triple that is not this host's, and its short name for `compile_model`."""
    if host_object_meta()["triple"].startswith("aarch64"):
        return "x86_64-unknown-linux-gnu", "x86_64-unknown-linux-gnu"
    return "aarch64-unknown-linux-gnu", "aarch64"


def test_an_object_for_another_machine_is_never_loaded(mlp: bytes) -> None:
    triple, short = _other_triple()
    cross = compile_model(models.mlp(), threads=2, options={"triple": short})
    name = next(iter(cross.plan.sections["cpu"].meta["objects"]))
    # Honest metadata: the object is not for this host, so the IR is compiled here instead.
    art = Artifact.load(cross.to_bytes())
    ex = GraphExecutor(art)
    assert ex.runners["cpu"].code_source == "ir"
    np.testing.assert_allclose(_run(art), _run(Artifact.load(mlp)), rtol=1e-5, atol=1e-6)
    # Metadata that claims this host: refused when loaded (the ELF header says otherwise) ...
    files = _unzip(cross.to_bytes())
    plan = json.loads(files["plan.json"])
    plan["sections"]["cpu"]["objects"][name] = host_object_meta()
    files["plan.json"] = json.dumps(plan).encode()
    with pytest.raises(ArtifactError, match=rf"cpu/{name}: the object is for ELF machine \d+ "
                                            rf"\(\w+\), 64-bit, little-endian; its metadata says "
                                            rf"triple '{host_object_meta()['triple']}'"):
        Artifact.load(_zip(files))
    # ... and when run, if the metadata was changed after loading.
    art.plan.sections["cpu"].meta["objects"][name] = host_object_meta()
    with pytest.raises(ArtifactError, match=rf"the artifact's cpu section cannot be run: "
                                            rf"cpu/{name}: the object is for ELF machine \d+ "
                                            rf"\(\w+\), 64-bit, little-endian; its metadata says "
                                            rf"triple '{host_object_meta()['triple']}'"):
        GraphExecutor(art)
    assert triple in cross.plan.sections["cpu"].meta["objects"][name]["triple"]


# ---- accelerator files: their configuration and its hash ---------------------------------

def _program_npz(cfg_change: dict | None = None, hash_of: str | None = None) -> io.BytesIO:
    cfg = preset("default")
    prog = Program.from_insns(cfg, [isa.FinishInsn()])
    buf = io.BytesIO()
    prog.save(buf)
    if cfg_change is None and hash_of is None:
        buf.seek(0)
        return buf
    with np.load(io.BytesIO(buf.getvalue())) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    meta["config"].update(cfg_change or {})
    if hash_of is not None:
        meta["config_hash"] = hash_of
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    out = io.BytesIO()
    np.savez(out, **arrays)
    out.seek(0)
    return out


def test_a_program_carries_its_configuration_hash() -> None:
    cfg = preset("default")
    assert Program.load(_program_npz(), cfg).cfg == cfg
    with pytest.raises(ValueError, match=r"program: its configuration hashes to [0-9a-f]{8}, "
                                         r"but it says '[0-9a-f]{8}': the file is corrupt"):
        Program.load(_program_npz({"log_uop_buff_size": 14}))
    other = cfg.replace(log_acc_buff_size=cfg.log_acc_buff_size - 1)
    with pytest.raises(ValueError, match=rf"program: built for configuration {cfg.hash} "
                                         rf"\(.*\), expected {other.hash}"):
        Program.load(_program_npz(), other)
    with pytest.raises(ValueError, match=r"program: not a saved vtakit program \(BadZipFile"):
        Program.load(io.BytesIO(b"PK\x03\x04 not really"))


def test_a_run_image_carries_its_configuration_hash(tmp_path: Path) -> None:
    cfg = preset("default")
    stream = isa.encode_stream([isa.FinishInsn()], cfg)
    dram = np.zeros(4096, np.uint8)
    dram[:len(stream)] = np.frombuffer(stream, np.uint8)
    path = tmp_path / "run.npz"
    RunImage(cfg, dram, 0, 1).save(path)
    assert RunImage.load(path, cfg).cfg == cfg
    other = cfg.replace(log_acc_buff_size=cfg.log_acc_buff_size - 1)
    with pytest.raises(ValueError, match=rf"built for configuration {cfg.hash} \(.*\), "
                                         rf"expected {other.hash}"):
        RunImage.load(path, other)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["config"] = np.array(other.to_json())
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=rf"its configuration hashes to {other.hash}, but it "
                                         rf"says '{cfg.hash}': the file is corrupt"):
        RunImage.load(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"not a readable run image \("):
        RunImage.load(path)


# ---- fuzz ---------------------------------------------------------------------------------

def _flip(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def _random_plan_edit(plan: dict, rng: random.Random) -> str:
    """Change one field of plan.json to a value the plan must be refused for."""
    bufs, steps = plan["buffers"], plan["steps"]
    i = rng.randrange(len(bufs))
    b = bufs[i]
    calls = [(s, c) for s in steps for c in s["calls"]]
    s, c = rng.choice(calls)
    choice = rng.randrange(12)
    if choice == 0:
        plan["threads"] = rng.choice([0, -1, None, "2", 2.0, True, 1 << 20])
    elif choice == 1:
        b["shape"] = [b["shape"][0] + rng.choice([-1, 1, 7])] + b["shape"][1:] \
            if b["shape"] else [2]
    elif choice == 2:
        b["nbytes"] += rng.choice([-4, 4, 1 << 30])
    elif choice == 3:
        arena = [x for x in bufs if x["kind"] == "arena"]
        x = rng.choice(arena)
        x["offset"] = rng.choice([plan["arena_bytes"] + 64, x["offset"] + 1, -64, 1 << 62])
    elif choice == 4:
        b["dtype"] = rng.choice(["|O", "<f8" if b["dtype"] != "<f8" else "|i1", "V4", "zz",
                                 ">i4", "<U4"])
    elif choice == 5:
        # (never to "arena": a buffer moved into the arena is a valid, different plan)
        b["kind"] = rng.choice([k for k in ("input", "output", "const", "heap")
                                if k != b["kind"]])
        if b["kind"] in ("input", "output"):
            b["index"] = 5
        elif b["kind"] == "const":
            b["name"] = "no_such_param"
    elif choice == 6:
        bi = rng.choice([j for j, a in enumerate(c["args"]) if a[0] == "b"])
        a = c["args"][bi]
        c["args"][bi] = rng.choice([["b", len(bufs), 0], ["b", -1, 0], ["b", a[1], -4],
                                    ["b", a[1], bufs[a[1]]["nbytes"] + 1], ["b", a[1]],
                                    ["i", 12345], ["f", 1.0], ["lo"]])
    elif choice == 7:
        c["sig"] = rng.choice([c["sig"][:-1], c["sig"] + "l", c["sig"].replace("p", "l", 1)
                               if "p" in c["sig"] else "x" + c["sig"][1:], ""])
    elif choice == 8:
        s["backend"] = rng.choice(["gpu", "", "plan", None])
    elif choice == 9:
        s["extent"] = rng.choice([-1, None, 1.5, 1 << 63])
    elif choice == 10:
        plan["arena_bytes"] = rng.choice([-1, 1 << 45, None])
    else:
        io_list = plan[rng.choice(["inputs", "outputs"])]
        io_list[0][rng.choice([1, 2])] = rng.choice(["<f8", "|O", [1, 2, 3], [-1], "bad"])
    return f"plan edit {choice}"


def _cases(data: bytes, seed: int, n: int) -> list[tuple[str, bytes]]:
    """`n` corrupted versions of `data` (seeded): flipped bytes, truncations, dropped members,
    changed members (with valid zip CRCs, so only the checksum can tell), plan edits (with the
    checksums redone, so the plan must be refused for what it says), and harmless ones."""
    rng = random.Random(seed)
    files = _unzip(data)
    names = list(files)
    cases: list[tuple[str, bytes]] = []
    for i in range(n):
        kind = i % 8
        if kind == 0:
            cases.append(("flip zip bytes", _flip(data, rng)))
        elif kind == 1:
            cases.append(("truncate", data[:rng.randrange(len(data))]))
        elif kind == 2:
            drop = rng.choice(names)
            kept = {k: v for k, v in files.items() if k != drop}
            cases.append((f"drop {drop}", _zip(kept, resign=False)))
        elif kind == 3:
            drop = rng.choice([x for x in names if x != "manifest.json"])
            kept = {k: v for k, v in files.items() if k != drop}
            cases.append((f"drop {drop}, re-signed", _zip(kept)))
        elif kind == 4:
            name = rng.choice(names)
            cases.append((f"flip member {name}", _zip({**files, name: _flip(files[name], rng)},
                                                     resign=False)))
        elif kind == 5:
            name = rng.choice(names)
            cut = files[name][:rng.randrange(max(len(files[name]), 1))]
            cases.append((f"truncate member {name}", _zip({**files, name: cut}, resign=False)))
        elif kind == 6:
            plan = json.loads(files["plan.json"])
            what = _random_plan_edit(plan, rng)
            edited = {**files, "plan.json": json.dumps(plan).encode()}
            resign = rng.random() < 0.8
            cases.append((what + (", re-signed" if resign else ""), _zip(edited, resign)))
        else:
            # Harmless: a step's name and op, and the JSON's layout.
            plan = json.loads(files["plan.json"])
            s = rng.choice(plan["steps"])
            s["name"] += "~"
            s["op"] = "renamed"
            cases.append(("harmless edit, re-signed",
                          _zip({**files, "plan.json": json.dumps(plan, indent=1).encode()})))
    return cases


def _same(a: Artifact, b: Artifact) -> bool:
    """Whether two loaded artifacts hold the same manifest, plan, parameters and members."""
    pa, pb = a.plan, b.plan
    return (a.manifest == b.manifest and pa.to_json() == pb.to_json()
            and pa.params.keys() == pb.params.keys()
            and all(pa.params[k].dtype == pb.params[k].dtype
                    and np.array_equal(pa.params[k], pb.params[k]) for k in pa.params)
            and {k: v.members for k, v in pa.sections.items()}
            == {k: v.members for k, v in pb.sections.items()})


_RUNNER = """
import json, sys, numpy as np
from vtakit.runtime import Artifact, ArtifactError, GraphExecutor
ref, inp, paths = np.load(sys.argv[1]), np.load(sys.argv[2]), sys.argv[3:]
for p in paths:
    print("start", p, flush=True)
    try:
        ex = GraphExecutor(Artifact.load(p))
    except ArtifactError:  # refused when built, before anything ran
        print("refused", flush=True)
        continue
    ex.set_input(0, inp); ex.run()
    same = np.array_equal(ex.get_output(0), ref)
    ex.close()
    print("same" if same else "DIFFERENT", flush=True)
"""


def _run_isolated(tmp_path: Path, art: Artifact, cases: list[tuple[str, bytes]]
                  ) -> list[str]:
    """Build and run each case in one child process (native code may crash a process), and
    return one outcome per case; a crash fails the test, naming the case."""
    x = _input(art.plan.inputs)
    np.save(tmp_path / "ref.npy", _run(art))
    np.save(tmp_path / "in.npy", x)
    paths = []
    for k, (_, data) in enumerate(cases):
        p = tmp_path / f"case{k}.vtak"
        p.write_bytes(data)
        paths.append(str(p))
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(tmp_path / "ref.npy"),
                           str(tmp_path / "in.npy"), *paths], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    lines = proc.stdout.splitlines()
    started = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("start ")]
    assert proc.returncode == 0, (
        f"the child crashed (exit {proc.returncode}) on {started[-1] if started else '?'}: "
        f"{cases[paths.index(started[-1])][0] if started else ''}\n{proc.stderr[-3000:]}")
    return [ln for ln in lines if not ln.startswith("start ")]


@pytest.mark.parametrize("which, seed, n", [("mlp", 1, 160), ("vta", 2, 160)])
def test_fuzz_corrupt_artifacts_are_refused_or_identical(which: str, seed: int, n: int,
                                                        request: pytest.FixtureRequest,
                                                        tmp_path: Path) -> None:
    data: bytes = request.getfixturevalue(which)
    original = Artifact.load(data)
    outcomes: Counter[str] = Counter()
    to_run: list[tuple[str, bytes]] = []
    for what, case in _cases(data, seed, n):
        try:
            art = Artifact.load(case)
        except ArtifactError:
            outcomes["refused (ArtifactError)"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - the point of the test: name the escape
            pytest.fail(f"{which} {what}: {type(e).__name__} escaped Artifact.load: {e}")
        assert not what.startswith("plan edit") or not what.endswith("re-signed"), \
            f"{which} {what}: an invalid plan was loaded"
        if _same(art, original):
            outcomes["loaded, identical"] += 1  # same bytes in, same result out
        else:
            to_run.append((what, case))
    results = _run_isolated(tmp_path, original, to_run) if to_run else []
    for (what, _), result in zip(to_run, results, strict=True):
        assert result in ("same", "refused"), f"{which} {what}: {result}"
        outcomes["loaded, ran identically" if result == "same" else
                 "loaded, refused by the executor (ArtifactError)"] += 1
    print(f"\n{which}: {n} cases: {dict(outcomes)}")
    assert sum(outcomes.values()) == n
    assert outcomes["refused (ArtifactError)"] > n // 2
