"""The ONNX backend node tests against the compiled CPU backend (import → optimize → lower →
LLVM code). Every node test that is not excluded below must pass.

Exclusions: everything the reference suite excludes (out of the frontend's contract, out of
scope, not implemented in the IR: see test_onnx_node_reference.py), plus the known failures of
lowered operators (listed in CPU_KNOWN_FAILURES, each with the reason). The CPU backend lowers
every op of the IR; a case it has no code for raises UnsupportedError naming the node, never a
wrong answer.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

from vtakit.compiler.onnx_backend import CpuBackend

# The reference suite's exclusion tables, loaded by path (tests are not a package).
_spec = importlib.util.spec_from_file_location(
    "_onnx_node_reference", Path(__file__).with_name("test_onnx_node_reference.py"))
assert _spec is not None and _spec.loader is not None
_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ref)
OUT_OF_SCOPE, NOT_IMPLEMENTED = _ref.OUT_OF_SCOPE, _ref.NOT_IMPLEMENTED
_outside_contract = _ref._outside_contract

# Known failures of lowered operators, with the reason.
CPU_KNOWN_FAILURES: dict[str, list[str]] = {
    # float16 softmax/matmul are computed in float32 and rounded once; the expected values
    # round every float16 step, so 2 of 192 values differ by one float16 ulp (rtol 1e-3).
    "float16 intermediate rounding": [r"^test_attention_4d(_causal)?_fp16(_expanded)?_cpu$"],
}

backend_test = onnx.backend.test.BackendTest(CpuBackend, __name__)
backend_test.include(r"_cpu$")
for _table in (OUT_OF_SCOPE, NOT_IMPLEMENTED, CPU_KNOWN_FAILURES):
    for _patterns in _table.values():
        for _p in _patterns:
            backend_test.exclude(_p)
for _case in load_model_tests(kind="node"):
    if _outside_contract(_case.model):
        backend_test.exclude("^" + re.escape(_case.name) + "_cpu$")

globals().update({k: v for k, v in backend_test.test_cases.items() if "Node" in k})
