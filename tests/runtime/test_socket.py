"""The backend socket, end to end, with a backend that lives only in this test: a lowering
registered by name that takes the ReLU nodes, and a runner of the same name. Everything else
falls back to the CPU backend; steps interleave in graph order; the artifact keeps one section
per backend; `profile()` names the backend of each step; the runtime imports no compiler."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from vtakit.compiler.backend import PlanSection, available_backends, get_backend, register_backend
from vtakit.compiler.compile import compile_model, lower_model
from vtakit.compiler.ir.ops import Op
from vtakit.runtime import Artifact, ArtifactError, GraphExecutor, Runner, Segment, register_runner
from vtakit.runtime.plan import Call, Section, Step
from vtakit.vta_hw.config import preset

ROOT = Path(__file__).parents[2]


@register_backend("toyrelu")
def _lower_toy(g, opts, plan) -> PlanSection:
    """Takes every RELU (a test backend)."""
    taken = []
    for i, n in enumerate(g.nodes):
        if n.op is Op.RELU and n.dtype.np.str == "<f4":
            with plan.lowering(n, "toyrelu"):
                plan.add_step(Step(n.name, "relu", [Call(0, "relu", "pp", (
                    plan.ptr(n.src[0]), plan.out(n)))], backend="toyrelu"))
                plan.add_step(Step(n.name + ":shape", "shape", [], backend="toyrelu"))
            taken.append(i)
    cfg = preset("default")
    return PlanSection("toyrelu", frozenset(taken), Section({"relus": len(taken)}),
                       emit=lambda sec: {"kernel.txt": b"relu"},
                       hw_config=cfg.to_dict(), hw_config_hash=cfg.hash)


@register_runner("toyrelu")
class _ToyRunner(Runner):
    segments = 0

    @classmethod
    def check_section(cls, section: Section) -> None:
        if section.members.get("kernel.txt") != b"relu":
            raise ValueError("the toyrelu section has no kernel.txt")

    def segment(self, steps) -> Segment:
        type(self).segments += 1
        fns = []
        for s in steps:
            for c in s.calls:
                src, dst = c.args
                shape = self.plan.buffers[src[1]].shape
                size = self.plan.buffers[src[1]].nbytes // 4
                x = self.memory.view(src, "<f4", (size,))
                y = self.memory.view(dst, "<f4", (size,))
                fns.append(lambda x=x, y=y: np.maximum(x, 0, out=y))
                del shape
        per_step = [(lambda: None) for _ in steps]

        def run() -> None:
            for f in fns:
                f()

        return Segment(run, per_step)


def _model() -> bytes:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["r1"], name="relu1"),
             helper.make_node("MatMul", ["r1", "w2"], ["b"], name="mm2"),
             helper.make_node("Relu", ["b"], ["y"], name="relu2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     (1, 16))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8))],
                          [w1, w2])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _reference(x: np.ndarray, model: bytes) -> np.ndarray:
    import onnx

    m = onnx.load_from_string(model)
    w = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    return np.maximum(np.maximum(x @ w["w1"], 0) @ w["w2"], 0)


def test_registry_lists_backends_and_rejects_unknown_targets() -> None:
    assert {"cpu", "toyrelu"} <= set(available_backends())
    assert get_backend("cpu").name == "cpu"
    with pytest.raises(ValueError, match=r"unknown target 'tpu'; the registered backends are "
                                         r"\[.*'cpu'.*\]"):
        get_backend("tpu")
    with pytest.raises(ValueError, match="already registered"):
        register_backend("toyrelu")(lambda g, o, p: None)


def test_nodes_the_target_does_not_take_fall_back_to_cpu() -> None:
    model = _model()
    plan = lower_model(model, target="toyrelu", optimize=False, threads=1)
    runs = [b for i, b in enumerate(s.backend for s in plan.steps)
            if i == 0 or plan.steps[i - 1].backend != b]
    assert runs == ["cpu", "toyrelu", "cpu", "toyrelu"]
    assert [s.name for s in plan.steps if s.backend == "toyrelu"] == [
        "r1", "r1:shape", "y", "y:shape"]
    assert sorted(plan.sections) == ["cpu", "toyrelu"]
    ex = GraphExecutor(plan)
    x = np.random.default_rng(1).standard_normal((1, 16)).astype(np.float32)
    ex.set_input("x", x)
    ex.run()
    np.testing.assert_allclose(ex.get_output("y"), _reference(x, model), rtol=1e-5, atol=1e-5)
    prof = ex.profile()
    assert [(p.name, p.backend) for p in prof] == [(s.name, s.backend) for s in plan.steps]
    assert {p.backend for p in prof} == {"cpu", "toyrelu"}


def test_artifact_keeps_one_section_per_backend_and_the_hw_config(tmp_path) -> None:
    model = _model()
    art = compile_model(model, target="toyrelu", optimize=False, threads=1)
    m = art.manifest
    assert m["backends"] == ["toyrelu", "cpu"] and m["target"] == "toyrelu"
    assert m["hw_config_hash"] == preset("default").hash
    assert m["hw_config"] == preset("default").to_dict()
    path = tmp_path / "m.vtak"
    art.save(path)
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
    assert {"toyrelu/kernel.txt", "cpu/module.ll", "cpu/host.o"} <= names
    loaded = Artifact.load(path)
    x = np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32)
    ex = GraphExecutor(loaded)
    ex.set_input(0, x)
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), _reference(x, model), rtol=1e-5, atol=1e-5)


def _rewrite(data: bytes, edit) -> bytes:
    """The artifact with its members edited, and the manifest's checksums made to match (so
    that what is refused is the edit, not the checksum)."""
    with zipfile.ZipFile(io.BytesIO(data)) as src:
        files = {n: edit(n, src.read(n)) for n in src.namelist()}
    files = {n: b for n, b in files.items() if b is not None}
    manifest = json.loads(files.pop("manifest.json"))
    manifest["members"] = {n: {"size_bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                           for n, b in files.items()}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        dst.writestr("manifest.json", json.dumps(manifest))
        for n, b in files.items():
            dst.writestr(n, b)
    return out.getvalue()


def test_an_artifact_with_a_backend_nobody_runs_is_refused() -> None:
    data = compile_model(_model(), target="toyrelu", optimize=False, threads=1).to_bytes()

    def rename(n: str, body: bytes) -> bytes:
        if n in ("manifest.json", "plan.json"):
            return body.replace(b'"toyrelu"', b'"npu9000"')
        return body

    bad = _rewrite(data, rename)
    with pytest.raises(ArtifactError, match=r"no runtime runner for backend 'npu9000'; this "
                                            r"vtakit has runners for \[.*'cpu'.*\]"):
        Artifact.load(bad)
    no_kernel = _rewrite(data, lambda n, b: None if n == "toyrelu/kernel.txt" else b)
    with pytest.raises(ArtifactError, match="toyrelu section has no kernel.txt"):
        Artifact.load(no_kernel)
    no_ir = _rewrite(data, lambda n, b: None if n == "cpu/module.ll" else b)
    with pytest.raises(ArtifactError, match=r"the cpu section has no module.ll"):
        Artifact.load(no_ir)


def test_corrupt_plans_are_refused_with_the_reason() -> None:
    data = compile_model(_model(), threads=1).to_bytes()

    def edit_plan(change):
        def edit(n: str, body: bytes) -> bytes:
            if n != "plan.json":
                return body
            plan = json.loads(body)
            change(plan)
            return json.dumps(plan).encode()
        return _rewrite(data, edit)

    def bad_buffer(p):
        p["steps"][0]["calls"][0]["args"][0] = ["b", 999, 0]

    def bad_backend(p):
        p["steps"][0]["backend"] = "gpu"

    def bad_sig(p):
        p["steps"][0]["calls"][0]["sig"] = "zz"

    with pytest.raises(ArtifactError, match=r"argument 0 buffer: expected an index < \d+, got "
                                            r"\('b', 999, 0\)"):
        Artifact.load(edit_plan(bad_buffer))
    with pytest.raises(ArtifactError, match=r"backend: expected one of the plan's sections "
                                            r"\['cpu'\], got 'gpu'"):
        Artifact.load(edit_plan(bad_backend))
    with pytest.raises(ArtifactError, match=r"expected one of 'plf' per argument"):
        Artifact.load(edit_plan(bad_sig))
    with pytest.raises(ArtifactError, match=r"plan version 7 is not supported"):
        Artifact.load(edit_plan(lambda p: p.update(version=7)))


def test_runtime_sources_import_nothing_from_the_compiler() -> None:
    import ast

    offenders = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        depth = len(path.relative_to(ROOT / "runtime").parts)  # 1: runtime/x.py
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level >= depth + 1:  # climbs out of runtime/ into the vtakit package
                    names = [f"vtakit.{mod}" if mod else "vtakit"] + [
                        f"vtakit.{a.name}" for a in node.names if not mod]
                elif node.level == 0:
                    names = [mod]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
                    "import_module", "__import__"):
                names = [a.value for a in node.args if isinstance(a, ast.Constant)
                         and isinstance(a.value, str)]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n == "vtakit.compiler" or n.startswith("vtakit.compiler.")
                          or n.split(".")[0] == "compiler"]
    assert offenders == []


def test_a_deployed_model_runs_without_the_compiler(tmp_path) -> None:
    path = tmp_path / "m.vtak"
    compile_model(_model(), threads=1).save(path)
    code = f"""
import pkgutil, sys, importlib
import numpy as np
import vtakit.runtime as rt
for m in pkgutil.walk_packages(rt.__path__, "vtakit.runtime."):
    importlib.import_module(m.name)
sess = rt.InferenceSession({str(path)!r})
(y,) = sess.run(None, {{"x": np.ones((1, 16), np.float32)}})
assert y.shape == (1, 8)
bad = [m for m in sys.modules if m.startswith("vtakit.compiler")]
assert not bad, bad
"""
    subprocess.run([sys.executable, "-c", code], check=True)
