"""The ``vta`` section of an artifact validated as data at `Artifact.load`: each corruption an
`ArtifactError` naming the member and the field, before any device work; and the class: no
artifact that loads can make a device write outside the slots its streams may write."""

from __future__ import annotations

import dataclasses
import io
import json
import random

import numpy as np
import pytest
from watched_sim import WatchedSim

from vtakit import digits
from vtakit.compiler.compile import compile_model
from vtakit.driver.devices.sim import SimDevice
from vtakit.driver.program import Program, Reloc
from vtakit.runtime import Artifact, ArtifactError
from vtakit.runtime.executor import GraphExecutor
from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset


@pytest.fixture(scope="module")
def good() -> bytes:
    art = compile_model(digits.load_model(), target="vta", quantize=True,
                        calib=digits.calibration_set())
    return art.to_bytes()


def _edited(good: bytes, edit) -> bytes:
    """The artifact with `edit(art)` applied and its checksums made anew (so only the
    section's own checks can refuse it)."""
    art = Artifact.load(good)
    edit(art)
    return Artifact(art.manifest, art.plan).to_bytes()


def _vta(art):
    return art.plan.sections["vta"]


def _region(art):
    return _vta(art).meta["regions"][0]


def _program(art, member="region0.npz") -> Program:
    return Program.load(io.BytesIO(_vta(art).members[member]))


def _store(art, prog: Program, member="region0.npz") -> None:
    buf = io.BytesIO()
    prog.save(buf)
    _vta(art).members[member] = buf.getvalue()


def _slot(art, kind):
    reg = _region(art)
    ins = {m["slot"] for m in reg["inputs"]}
    outs = {lm["output"] for lm in reg["layers"]}
    for name in reg["slots"]:
        if kind == "weight" and name.endswith(":w"):
            return name
        if kind == "inner" and name in outs and name not in {m["slot"] for m in
                                                               reg["outputs"]}:
            return name
        if kind == "input" and name in ins:
            return name
    raise AssertionError(kind)


def _first(prog: Program, opcode, memory_type=None) -> int:
    for i, insn in enumerate(prog.insns()):
        if insn.opcode == opcode and (memory_type is None or insn.memory_type == memory_type):
            return i
    raise AssertionError(opcode)


def _retarget(art, opcode, slot_kind=None, **change) -> None:
    """Change the relocation of the region stream's first `opcode` instruction."""
    prog = _program(art)
    i = _first(prog, opcode, change.pop("memory_type", None))
    k = next(k for k, r in enumerate(prog.relocs) if r.index == i)
    if slot_kind is not None:
        change["slot"] = _slot(art, slot_kind)
    prog.relocs[k] = dataclasses.replace(prog.relocs[k], **change)
    _store(art, prog)


def _set_hw_ver(art, member: str, ver) -> None:
    with np.load(io.BytesIO(_vta(art).members[member])) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    meta["hw_ver"] = ver
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    _vta(art).members[member] = buf.getvalue()


def _mismatched_constant(art) -> None:
    prog = _program(art, "region0_layer0.npz")
    name = next(iter(prog.constants))
    prog.constants[name] = prog.constants[name] ^ np.uint32(1)
    _store(art, prog, "region0_layer0.npz")


def _step(art, **change):
    st = next(s for s in art.plan.steps if s.backend == "vta")
    st.calls[0] = dataclasses.replace(st.calls[0], **change)


def _shrink(art, kind):
    info = _region(art)["slots"][_slot(art, kind)]
    info["shape"] = [1] * (len(info["shape"]) - 1) + [info["shape"][-1]]


CASES = {
    # item 1: every DMA inside its own slot
    "a STORE onto a weight slot": (
        lambda a: _retarget(a, isa.Opcode.STORE, "weight", elem_bytes=16),
        r"vta/region0\.npz: instruction #\d+ STORE OUT: writes slot 'r0\.\w+:w', which the "
        r"stream may only read"),
    "a STORE onto an input slot": (
        lambda a: _retarget(a, isa.Opcode.STORE, "input"),
        r"vta/region0\.npz: .*writes slot 'r0\.a0', which the stream may only read"),
    "a negative offset": (
        lambda a: _retarget(a, isa.Opcode.STORE, elem_offset=-3),
        r"vta/region0\.npz: .*starts at element -3"),
    "an offset past every slot": (
        lambda a: _retarget(a, isa.Opcode.STORE, elem_offset=1 << 24),
        r"vta/region0\.npz: instruction #\d+ STORE OUT: bytes \d+\.\.\d+ of slot '\S+' leave "
        r"its \d+ bytes"),
    "an element size not the memory type's": (
        lambda a: _retarget(a, isa.Opcode.LOAD, memory_type=isa.MemType.WGT, elem_bytes=16),
        r"vta/region0\.npz: .*LOAD WGT: its relocation counts elements of 16 bytes; a WGT "
        r"element is 256 bytes"),
    "a relocation onto a GEMM word": (
        lambda a: (lambda p: (p.relocs.append(Reloc(_first(p, isa.Opcode.GEMM), "r0.a1", 0,
                                                    16)), _store(a, p)))(_program(a)),
        r"vta/region0\.npz: relocation \d+ .*a GEMM, which addresses no DRAM"),
    "two relocations for one instruction": (
        lambda a: (lambda p: (p.relocs.append(p.relocs[-1]), _store(a, p)))(_program(a)),
        r"vta/region0\.npz: .*has a second relocation"),
    "a LOAD with no relocation": (
        lambda a: (lambda p: (p.relocs.pop(0), _store(a, p)))(_program(a)),
        r"vta/region0\.npz: instruction #\d+ .* with no relocation"),
    "an emptied micro-op constant": (
        lambda a: (lambda p: (p.constants.update({next(iter(p.constants)): np.zeros(0, "<u4")}),
                              _store(a, p)))(_program(a)),
        r"vta/region0\.npz: micro-op constant 'uop:\w+' is empty"),
    # item 2: the section as data
    "an input read from a buffer of another dtype": (
        lambda a: _region(a)["inputs"][0].update(arg=["b", 0, 0]),
        r"regions\[0\]\.inputs\[0\]\.arg: buffer 0 holds float32, expected int8"),
    "no inputs": (lambda a: _region(a).update(inputs=[]),
                  r"regions\[0\]\.inputs: expected at least one entry"),
    "no outputs": (lambda a: _region(a).update(outputs=[]),
                   r"regions\[0\]\.outputs: expected at least one entry"),
    "a weight slot marked param: false": (
        lambda a: _region(a)["slots"][_slot(a, "weight")].update(param=False),
        r"vta/region0\.npz: instruction #\d+ LOAD WGT reads slot 'r0\.\w+:w', which holds "
        r"nothing yet"),
    "a region whose program is a layer's stream": (
        lambda a: _region(a).update(program="region0_layer0.npz"),
        r"regions\[0\]\.layers\[0\]\.program: 'region0_layer0\.npz' is already the stream of "
        r"regions\[0\]\.program"),
    "a shrunk activation slot": (
        lambda a: _shrink(a, "inner"),
        r"vta/region0\.npz: instruction #\d+ \w+ \w+: bytes \d+\.\.\d+ of slot 'r0\.a\d+' "
        r"leave its \d+ bytes"),
    "a shrunk input slot": (
        lambda a: _shrink(a, "input"),
        r"regions\[0\]\.inputs\[0\]: slot 'r0\.a0' is \[.*\], but its host array .* packs to"),
    "a negative argument offset": (
        lambda a: _region(a)["outputs"][0].update(arg=["b", 2, -8]),
        r"regions\[0\]\.outputs\[0\]: expected slot .*arg \['b', buffer, offset >= 0\]"),
    "an argument past its buffer": (
        lambda a: _region(a)["outputs"][0].update(arg=["b", 2, 60]),
        r"regions\[0\]\.outputs\[0\]\.arg: 10 bytes at offset 60 leave buffer 2's 10 bytes"),
    "channels that do not match the slot": (
        lambda a: _region(a)["outputs"][0].update(channels=16),
        r"regions\[0\]\.outputs\[0\]: shape \[1, 10\] is not rows of 16 channels"),
    "an im2col with a zero stride": (
        lambda a: _region(a)["inputs"][0]["im2col"].__setitem__(2, 0),
        r"regions\[0\]\.inputs\[0\]\.im2col: expected .*strides >= 1"),
    "an im2col with enormous pads": (
        lambda a: _region(a)["inputs"][0]["im2col"].__setitem__(4, 1 << 40),
        r"regions\[0\]\.inputs\[0\]\.im2col: expected .*pads 0\.\.15"),
    "no regions": (lambda a: _vta(a).meta.update(regions=[]),
                   r"sections\.vta\.regions: expected at least one region"),
    "no layers": (lambda a: _region(a).update(layers=[]),
                  r"regions\[0\]\.layers: expected at least one entry"),
    "an unknown call name": (lambda a: _step(a, fname="layer99"),
                             r"step \d+ \('\w+'\): calls 'layer99', which region 0 does not "
                             r"have"),
    "a call of a region that does not exist": (
        lambda a: _step(a, kernel=3), r"step \d+ .*kernel 3, but the vta section has 1 region"),
    "a stream of another ISA version": (
        lambda a: _set_hw_ver(a, "region0_layer2.npz", [0, 0, 1]),
        r"vta/region0_layer2\.npz: built for ISA \[0, 0, 1\]"),
    "a missing configuration hash": (
        lambda a: a.manifest.pop("hw_config_hash"),
        r"manifest\.json has no hw_config_hash"),
    "a configuration that does not hash to its hash": (
        lambda a: a.manifest["hw_config"].update(log_uop_buff_size=14),
        r"manifest\.json hw_config hashes to \w+, but hw_config_hash says"),
    "micro-op constants of one name and two contents": (
        _mismatched_constant,
        r"vta/region0(_layer\d+)?\.npz: micro-op constant 'uop:\w+' differs from the one of "
        r"that name in vta/region0(_layer\d+)?\.npz"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_corruption_is_an_artifact_error_naming_the_field(good, name, monkeypatch):
    edit, message = CASES[name]
    data = _edited(good, edit)
    ran = []
    monkeypatch.setattr(SimDevice, "run", lambda *a: ran.append(a))
    with pytest.raises(ArtifactError, match=r"<bytes>: vta section: .*" + message):
        Artifact.load(data)
    assert not ran


def test_the_artifact_itself_loads(good):
    Artifact.load(good)


# ---- the class ----------------------------------------------------------------------------

def _fuzz(rng: random.Random, art) -> None:
    prog = _program(art)
    insns = prog.insns()
    slots = list(_region(art)["slots"])
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(len(prog.relocs))
        r = prog.relocs[k]
        what = rng.choice(["slot", "slot", "offset", "bytes", "index", "size", "stride",
                           "opcode"])
        if what == "slot":
            prog.relocs[k] = dataclasses.replace(r, slot=rng.choice(slots))
        elif what == "offset":
            prog.relocs[k] = dataclasses.replace(r, elem_offset=r.elem_offset + rng.choice(
                [-1, 1, 4, 16, 1000]))
        elif what == "bytes":
            prog.relocs[k] = dataclasses.replace(r, elem_bytes=rng.choice([4, 16, 64, 256]))
        elif what == "index":
            prog.relocs[k] = dataclasses.replace(r, index=rng.randrange(len(insns)))
        elif isinstance(insns[r.index], isa.MemInsn):
            insn = insns[r.index]
            if what == "size":
                insns[r.index] = dataclasses.replace(insn, x_size=insn.x_size + rng.randint(1, 8))
            elif what == "stride":
                insns[r.index] = dataclasses.replace(insn, x_stride=insn.x_stride + 64,
                                                     y_size=max(insn.y_size, 2))
            else:
                insns[r.index] = dataclasses.replace(
                    insn, opcode=isa.Opcode.STORE if insn.opcode == isa.Opcode.LOAD else
                    isa.Opcode.LOAD, memory_type=isa.MemType.OUT
                    if insn.opcode == isa.Opcode.LOAD else isa.MemType.INP)
    _store(art, Program.from_insns(prog.cfg, insns, prog.relocs, prog.constants))


def test_no_artifact_that_loads_writes_outside_its_writable_slots(good):
    """80 seeded corruptions of the region stream's relocations and transfers: each is refused
    at load, or runs (into a simulator error, maybe) changing device memory only inside the
    slots the stream may write (layer outputs: never weights, inputs, micro-ops, the
    instruction stream or free memory)."""
    rng = random.Random(4040)
    x, _ = digits.test_split()
    refused = ran = 0
    for _ in range(80):
        try:
            art = Artifact.load(_edited(good, lambda a: _fuzz(rng, a)))
        except ArtifactError:
            refused += 1
            continue
        dev = WatchedSim(preset("default"), dram_bytes=1 << 22)
        ex = GraphExecutor(art, runner_options={"vta": {"device": dev, "timeout_s": 10}})
        try:
            ex.set_input(0, x[:1])
            ex.run()
        except Exception:  # noqa: BLE001 - a device error; what the run wrote is checked
            pass
        region = ex.runners["vta"].regions[0]
        reg = _region(art)
        writable = [region.arrays[lm["output"]] for lm in reg["layers"]]
        outside = [int(b) for b in getattr(dev, "changed", []) if not any(
            a.addr <= b < a.addr + a.nbytes for a in writable)]
        ex.close()
        assert not outside, f"a loaded artifact's stream wrote bytes {outside[:4]} outside " \
                            f"its writable slots"
        ran += 1
    assert refused >= 40 and ran >= 5, (refused, ran)
