"""`vtakit compare` states the offload: the accelerator's share of the model's MACs and steps,
the CPU fallbacks with their reasons, the MAC-bearing nodes no accelerator pattern took, and
``--require-offload PCT``."""

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from vtakit import digits
from vtakit.cli import main
from vtakit.compare import OffloadResult, check_percent, compare, node_macs

# the digits CNN: 3x3 convolutions 1->16, 16->32, 32->16 on 8x8, 4x4; dense 256->64, 64->10
DIGITS_MACS = 9 * 64 * (16 + 16 * 32) + 9 * 16 * 32 * 16 + 256 * 64 + 640
GROUPED_MACS = 16 * 64 * 8 * 9     # a 3x3 convolution 16->16 in 2 groups on 8x8
POINTWISE_MACS = 16 * 64 * 16      # then a 1x1 convolution 16->16
DYNAMIC_MACS = 8 * 64 * 4 * 9      # a 3x3 convolution 4->8 whose weights are an input


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _strict_json(path):
    def refuse(name):
        raise AssertionError(f"{path}: non-standard JSON literal {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def _model(nodes, name, inputs, output, inits=()):
    g = helper.make_graph(nodes, name,
                          [helper.make_tensor_value_info(k, TensorProto.FLOAT, s)
                           for k, s in inputs],
                          [helper.make_tensor_value_info(output[0], TensorProto.FLOAT,
                                                         output[1])],
                          [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def grouped_model():
    """A grouped convolution (the accelerator leaves it to the CPU: a fallback with a reason)
    before a 1x1 convolution the accelerator runs: 18% of the MACs offloaded."""
    rng = np.random.default_rng(0)
    w1 = (0.2 * rng.standard_normal((16, 8, 3, 3))).astype(np.float32)
    w2 = (0.2 * rng.standard_normal((16, 16, 1, 1))).astype(np.float32)
    return _model([helper.make_node("Conv", ["x", "w1"], ["a"], group=2, pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["a"], ["b"]),
                   helper.make_node("Conv", ["b", "w2"], ["y"])],
                  "grouped_net", [("x", [1, 16, 8, 8])], ("y", [1, 16, 8, 8]),
                  [("w1", w1), ("w2", w2)])


def dynamic_model():
    """A convolution whose weights come from an input: the quantiser keeps it in float, no
    accelerator pattern applies, nothing is offloaded (the plan has no accelerator section)."""
    return _model([helper.make_node("Reshape", ["wflat", "shape"], ["w"]),
                   helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                  "dynamic_net", [("x", [1, 4, 8, 8]), ("wflat", [1, 288])],
                  ("y", [1, 8, 8, 8]), [("shape", np.array([8, 4, 3, 3], np.int64))])


@pytest.fixture(scope="module")
def grouped_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("grouped")
    onnx.save(grouped_model(), d / "grouped.onnx")
    return cli("compare", d / "grouped.onnx", "--samples", 2, "--out", d / "out",
               "--require-offload", 50), d / "out"


def test_digits_is_all_offloaded_and_passes_99(tmp_path):
    r = cli("compare", digits.model_path(), "--samples", 2, "--out", tmp_path,
            "--require-offload", 99)
    assert r.exit_code == 0, r.output
    assert (f"offload: the accelerator ran 100.00% of the model's MACs ({DIGITS_MACS:,} of "
            f"{DIGITS_MACS:,}) and 6 of 8 steps (75.00%)") in r.output
    assert "CPU fallback" not in r.output and "no accelerator pattern" not in r.output
    off = _strict_json(tmp_path / "report.json")["offload"]
    assert off == {"macs": DIGITS_MACS, "accelerator_macs": DIGITS_MACS, "mac_share": 1.0,
                   "steps": 8, "accelerator_steps": 6, "step_share": 0.75, "fallback": [],
                   "no_pattern": []}


def test_digits_offload_counts_what_the_backend_counts():
    r = compare(digits.model_path(), samples=1)
    # node_macs over the integer graph == the accelerator layers' own "macs"
    assert r.offload.accelerator_macs == r.offload.macs == r.accelerator.model_macs
    assert r.offload.mac_share == 1.0 and r.offload.shortfall(100) is None


class TestGroupedConvolutionStaysOnTheCpu:
    def test_fails_require_offload_50_with_the_shares(self, grouped_run):
        r, _ = grouped_run
        assert r.exit_code == 1, r.output
        share = f"{100 * POINTWISE_MACS / (GROUPED_MACS + POINTWISE_MACS):.2f}%"
        assert share == "18.18%"
        error = [line for line in r.output.splitlines() if line.startswith("Error:")]
        assert error == [
            f"Error: offload: the accelerator ran {share} of the model's MACs "
            f"({POINTWISE_MACS:,} of {GROUPED_MACS + POINTWISE_MACS:,}), below the 50% "
            f"required (--require-offload 50); on the CPU: a:acc (conv_integer, "
            f"{GROUPED_MACS:,} MACs, fallback)"]

    def test_prints_what_ran_where_and_why(self, grouped_run):
        r, _ = grouped_run
        out = r.output
        assert (f"offload: the accelerator ran 18.18% of the model's MACs ({POINTWISE_MACS:,} "
                f"of {GROUPED_MACS + POINTWISE_MACS:,}) and 1 of 5 steps (20.00%)") in out
        assert f"CPU fallback, with the compiler's reason: 1 node, {GROUPED_MACS:,} MACs" in out
        line = next(x for x in out.splitlines() if x.strip().startswith("a:acc conv_integer"))
        assert f"{GROUPED_MACS:,} MACs  group=2 (a grouped or depthwise convolution" in line
        assert "no accelerator pattern" not in out
        # the per-layer table: the CPU step's MACs and its reason
        row = next(x for x in out.splitlines() if x.startswith("a:acc "))
        assert "cpu" in row and f"{GROUPED_MACS:,}" in row and "group=2" in row

    def test_report_json_written_before_the_failure(self, grouped_run):
        _, out = grouped_run
        saved = _strict_json(out / "report.json")
        off = saved["offload"]
        assert (off["macs"], off["accelerator_macs"]) == (GROUPED_MACS + POINTWISE_MACS,
                                                          POINTWISE_MACS)
        assert off["mac_share"] == pytest.approx(2 / 11)
        assert (off["steps"], off["accelerator_steps"], off["step_share"]) == (5, 1, 0.2)
        assert [(f["name"], f["op"], f["macs"]) for f in off["fallback"]] == \
            [("a:acc", "conv_integer", GROUPED_MACS)]
        assert off["fallback"][0]["reason"].startswith("group=2 (")
        assert off["no_pattern"] == []
        assert saved["accelerator"]["cpu_fallback"] == {"a:acc": off["fallback"][0]["reason"]}


def test_float_convolution_no_pattern_and_no_accelerator_section(tmp_path):
    r = compare(dynamic_model(), samples=1)
    off = r.offload
    assert (off.macs, off.accelerator_macs, off.mac_share) == (DYNAMIC_MACS, 0, 0.0)
    assert (off.steps, off.accelerator_steps) == (3, 0) and off.fallback == []
    [node] = off.no_pattern
    assert (node.name, node.op, node.macs) == ("y", "conv", DYNAMIC_MACS)
    assert node.reason == ("float32: kept in float by the quantiser (unsupported); the "
                           "accelerator runs int8 layers")
    table = r.table()
    assert (f"offload: the accelerator ran 0.00% of the model's MACs (0 of {DYNAMIC_MACS:,}) "
            f"and 0 of 3 steps (0.00%)") in table
    assert (f"on the CPU because no accelerator pattern applies: 1 node, {DYNAMIC_MACS:,} "
            f"MACs") in table
    assert off.shortfall(50) == (
        f"offload: the accelerator ran 0.00% of the model's MACs (0 of {DYNAMIC_MACS:,}), "
        f"below the 50% required (--require-offload 50); on the CPU: y (conv, "
        f"{DYNAMIC_MACS:,} MACs, no pattern)")
    assert off.shortfall(0) is None
    assert json.loads(r.to_json())["offload"]["no_pattern"][0]["name"] == "y"


@pytest.mark.parametrize("value", ["-1", "101", "abc", "nan", "inf", ""])
def test_bad_require_offload_is_one_line_exit_2(tmp_path, value):
    r = cli("compare", digits.model_path(), "--out", tmp_path / "out", "--require-offload",
            value)
    assert r.exit_code == 2
    assert r.output == (f"Error: --require-offload: got {value!r}; expected a percentage, a "
                        f"number from 0 to 100 (e.g. 90)\n")
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_check_percent():
    assert check_percent("99.5") == 99.5 and check_percent(0) == 0 and check_percent(100) == 100
    with pytest.raises(ValueError, match=r"require_offload: got 100.5; expected a percentage, "
                                         r"a number from 0 to 100"):
        check_percent(100.5)
    with pytest.raises(TypeError, match=r"require_offload: got NoneType None; expected a "
                                        r"percentage"):
        check_percent(None)
    with pytest.raises(TypeError, match=r"got bool True"):
        check_percent(True)


def test_shortfall_thresholds():
    half = OffloadResult(200, 100, 0.5, 4, 2, 0.5)
    assert half.shortfall(50) is None and half.shortfall(0) is None
    assert half.shortfall(50.01) == ("offload: the accelerator ran 50.00% of the model's MACs "
                                     "(100 of 200), below the 50.01% required "
                                     "(--require-offload 50.01)")
    almost = OffloadResult(100_000, 99_999, 0.99999, 4, 3, 0.75)
    assert almost.headline().startswith("offload: the accelerator ran 99.99% ")  # not 100.00%
    nothing = OffloadResult(0, 0, None, 2, 0, 0.0)
    assert nothing.shortfall(0) is None
    assert nothing.shortfall(10) == ("offload: the model has no convolution / matmul MACs to "
                                     "offload, below the 10% required (--require-offload 10)")
    with pytest.raises(ValueError, match=r"require_pct: got -1"):
        half.shortfall(-1)


def test_mismatch_and_shortfall_in_one_error(monkeypatch, tmp_path):
    import dataclasses

    import vtakit.compare

    r = compare(digits.model_path(), samples=1)
    bad = dataclasses.replace(
        r, accelerator=dataclasses.replace(r.accelerator, bit_identical=False,
                                           mismatched_samples=1),
        offload=dataclasses.replace(r.offload, accelerator_macs=0, mac_share=0.0))
    monkeypatch.setattr(vtakit.compare, "compare", lambda *args, **kw: bad)
    out = cli("compare", digits.model_path(), "--out", tmp_path, "--require-offload", 1)
    assert out.exit_code == 1
    [error] = [line for line in out.output.splitlines() if line.startswith("Error:")]
    assert "MISMATCH: int8-CPU vs accelerator differ on 1 of 1 samples" in error
    assert "; offload: the accelerator ran 0.00% of the model's MACs" in error


def _node(op, shape, src=(), attrs=None):
    from vtakit.compiler.ir.dtypes import DType
    from vtakit.compiler.ir.ops import NO_ATTRS, Node

    return Node(op, DType.FLOAT32, tuple(shape), tuple(src), attrs or NO_ATTRS)


def test_node_macs_formulas():
    from vtakit.compiler.ir.ops import ConvAttrs, ConvTransposeAttrs, GemmAttrs, Op

    x = _node(Op.INPUT, (2, 8, 10, 10))
    w = _node(Op.INPUT, (12, 4, 3, 3))  # 8 -> 12 channels in 2 groups
    conv = _node(Op.CONV, (2, 12, 5, 5), (x, w), ConvAttrs((3, 3), (2, 2), (1, 1, 1, 1),
                                                           (1, 1), group=2))
    assert node_macs(conv) == 2 * 12 * 5 * 5 * (8 // 2) * 3 * 3  # N*OC*OH*OW*IC/g*KH*KW
    a, b = _node(Op.INPUT, (3, 5, 7)), _node(Op.INPUT, (7, 11))
    assert node_macs(_node(Op.MATMUL, (3, 5, 11), (a, b))) == 15 * 11 * 7  # M*N*K
    at, bt = _node(Op.INPUT, (7, 5)), _node(Op.INPUT, (7, 11))
    assert node_macs(_node(Op.GEMM, (5, 11), (at, bt), GemmAttrs(trans_a=True))) == 5 * 11 * 7
    xt, wt = _node(Op.INPUT, (1, 4, 5, 5)), _node(Op.INPUT, (4, 6, 3, 3))
    ct = _node(Op.CONV_TRANSPOSE, (1, 6, 11, 11), (xt, wt),
               ConvTransposeAttrs((3, 3), (2, 2), (0, 0, 0, 0), (1, 1), (0, 0)))
    assert node_macs(ct) == 4 * 5 * 5 * 6 * 3 * 3
    assert node_macs(_node(Op.RELU, (2, 8, 10, 10), (x,))) == 0
