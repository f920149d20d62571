"""ONNX import: what is accepted, how it maps to the IR, and the errors for what is not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_reference import reference_session

from vtakit.compiler.errors import InvalidModelError, NonConstantError, UnsupportedError
from vtakit.compiler.frontend import import_onnx
from vtakit.compiler.ir import DType, Op, run, verify
from vtakit.models import mlp


def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets)


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def test_symbolic_batch_is_fixed_at_import():
    g = verify(import_onnx(mlp(), batch_size=3))
    assert g.inputs[0].shape == (3, 784) and g.outputs[0].shape == (3, 10)
    assert g.input_names == ("input",)


def test_accepts_bytes_and_paths(tmp_path):
    m = mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(m, path)
    for source in (m.SerializeToString(), path, str(path)):
        assert len(import_onnx(source).nodes) == len(import_onnx(m).nodes)


def _external_data_model():
    """An MLP-like model with a Constant node too (attribute tensors can be external as well)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Constant", [], ["w2"], value=_init("w2", rng.standard_normal(
                 (3, 16)).astype(np.float32))),
             helper.make_node("Gemm", ["r", "w2"], ["y"], transB=1)]
    inits = [_init("w1", rng.standard_normal((16, 8)).astype(np.float32)),
             _init("b1", rng.standard_normal(16).astype(np.float32))]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 3])], inits, opset=13)
    m.ir_version = 8  # readable by onnxruntime
    return m


@pytest.mark.parametrize("as_str", [False, True])
def test_external_data_is_loaded_from_the_model_folder(tmp_path, as_str):
    from onnx.external_data_helper import convert_model_to_external_data

    pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")
    m = _external_data_model()
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    (want,) = reference_session(m).run(None, {"x": x})
    convert_model_to_external_data(m, all_tensors_to_one_file=True, location="weights.bin",
                                   size_threshold=0, convert_attribute=True)
    onnx.save_model(m, tmp_path / "m.onnx")
    assert (tmp_path / "weights.bin").stat().st_size > (tmp_path / "m.onnx").stat().st_size
    path = tmp_path / "m.onnx"
    g = verify(import_onnx(str(path) if as_str else path))
    np.testing.assert_allclose(run(g, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_external_data_saved_with_save_model(tmp_path):
    m = mlp()
    expected = numpy_helper.to_array(m.graph.initializer[0])
    onnx.save_model(m, tmp_path / "mlp.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    g = import_onnx(tmp_path / "mlp.onnx")
    assert np.array_equal(g.constants["fc_w_1"], expected)


def test_missing_external_data_file_is_named(tmp_path):
    onnx.save_model(mlp(), tmp_path / "mlp.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(InvalidModelError, match=r"tensor 'fc_w_1' is stored in the external data "
                                                r"file 'weights.bin', and .*weights.bin does not "
                                                r"exist \(external files are looked up next to "
                                                r"the model\)"):
        import_onnx(tmp_path / "mlp.onnx")


def test_truncated_external_data_file(tmp_path):
    onnx.save_model(mlp(), tmp_path / "mlp.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(InvalidModelError, match=r"cannot load tensor '.*' from the external data "
                                                r"file .*weights.bin"):
        import_onnx(tmp_path / "mlp.onnx")


def test_external_data_not_loaded_into_a_model_proto(tmp_path):
    onnx.save_model(mlp(), tmp_path / "mlp.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    m = onnx.load(tmp_path / "mlp.onnx", load_external_data=False)
    with pytest.raises(InvalidModelError, match=r"tensor 'fc_w_1' is stored in the external data "
                                                r"file 'weights.bin', which is not loaded; pass "
                                                r"the model's path"):
        import_onnx(m)
    with pytest.raises(InvalidModelError, match=r"which is not loaded"):
        import_onnx(m.SerializeToString())


def test_shape_subgraphs_fold_into_constants():
    # Reshape x to [N, -1] with the target shape computed from Shape(x).
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
             helper.make_node("Concat", ["n", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [_init("zero", np.array([0])), _init("one", np.array([1])),
             _init("minus1", np.array([-1]))]
    g = verify(import_onnx(_model(nodes, [_vi("x", ["N", 3, 4])], [_vi("y", ["N", 12])], inits),
                           batch_size=2))
    assert g.outputs[0].op is Op.RESHAPE and g.outputs[0].shape == (2, 12)


def test_split_becomes_slices():
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1)]
    m = _model(nodes, [_vi("x", [1, 5])], [_vi("a", [1, 2]), _vi("b", [1, 3])],
               [_init("sizes", np.array([2, 3]))])
    g = verify(import_onnx(m))
    assert [n.op for n in g.outputs] == [Op.SLICE, Op.SLICE]
    x = np.arange(5, dtype=np.float32).reshape(1, 5)
    out = run(g, {"x": x})
    np.testing.assert_array_equal(out["b"], x[:, 2:])


def test_constant_nodes_become_constants():
    c = helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0])
    m = _model([c, helper.make_node("Add", ["x", "c"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    g = verify(import_onnx(m))
    assert g.outputs[0].src[1].op is Op.CONST and g.outputs[0].src[1].dtype is DType.FLOAT32


# -- errors ----------------------------------------------------------------------------------------

def test_unsupported_operator_names_node_and_op():
    node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], name="roi")
    m = _model([node], [_vi("x", [1, 1, 4, 4]), _vi("rois", [1, 4]),
                        _vi("batch", [1], TensorProto.INT64)], [_vi("y", [1, 1, 1, 1])])
    with pytest.raises(UnsupportedError,
                       match=r"node 'roi' \(RoiAlign\): operator 'RoiAlign' is not "
                             r"supported; supported operators: Abs, .*Conv,"):
        import_onnx(m)


def test_unnamed_node_is_named_by_index():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["y"])]
    m = _model(nodes, [_vi("x", [2, 2])], [_vi("y", [2, "nonzero"], TensorProto.INT64)])
    with pytest.raises(UnsupportedError, match=r"node #1 \(NonZero\): operator 'NonZero'"):
        import_onnx(m)


def test_unsupported_attribute_value():
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="mirror", name="p")
    m = _model([node], [_vi("x", [3])], [_vi("y", [5])], [_init("pads", np.array([1, 1]))])
    # The checker does not validate mode, so the frontend must.
    with pytest.raises(UnsupportedError, match=r"node 'p' \(Pad\): mode='mirror' is not "
                                               r"supported; supported: constant, reflect"):
        import_onnx(m)


def test_unsupported_dtype():
    m = _model([helper.make_node("Identity", ["x"], ["y"])], [_vi("x", [2], TensorProto.BFLOAT16)],
               [_vi("y", [2], TensorProto.BFLOAT16)])
    with pytest.raises(UnsupportedError, match=r"graph input 'x': BFLOAT16 is not supported; "
                                               r"supported: float16, float32"):
        import_onnx(m)


def test_cast_to_unsupported_dtype():
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN, name="c")
    m = _model([node], [_vi("x", [2])], [_vi("y", [2], TensorProto.FLOAT8E4M3FN)], opset=21)
    with pytest.raises(UnsupportedError, match=r"node 'c' \(Cast\): cast to FLOAT8E4M3FN"):
        import_onnx(m)


def test_other_domain_rejected():
    node = helper.make_node("Foo", ["x"], ["y"], domain="com.example", name="f")
    m = _model([node], [_vi("x", [2])], [_vi("y", [2])], domains=["com.example"])
    with pytest.raises(UnsupportedError, match=r"node 'f' \(Foo\): domain 'com.example' is not "
                                               r"supported"):
        import_onnx(m)


def test_old_opset_is_converted():
    # Opsets 7 to 12 are converted to 13 (tests/compiler/frontend/test_upgrade_opset.py).
    node = helper.make_node("Squeeze", ["x"], ["y"], axes=[0])
    m = _model([node], [_vi("x", [1, 2])], [_vi("y", [2])], opset=11)
    assert verify(import_onnx(m)).outputs[0].shape == (2,)


def test_value_dependent_input_must_be_constant():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")
    m = _model([node], [_vi("x", [2, 3]), _vi("shape", [2], TensorProto.INT64)],
               [_vi("y", [3, 2])])
    with pytest.raises(NonConstantError, match=r"node 'r' \(Reshape\): input 1 'shape' must be "
                                               r"a constant .* graph inputs \['shape'\]"):
        import_onnx(m)
    bound = import_onnx(m, constant_inputs={"shape": np.array([3, 2])})
    assert bound.outputs[0].shape == (3, 2) and bound.input_names == ("x",)


def test_symbolic_inner_dimension_rejected():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", "L"])],
               [_vi("y", ["N", "L"])])
    with pytest.raises(UnsupportedError, match=r"graph input 'x': dimension 1 'L' is symbolic"):
        import_onnx(m)


def test_max_pool_indices_match_onnxruntime():
    pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    m = _model([node], [_vi("x", [2, 3, 7, 7])],
               [_vi("y", [2, 3, 4, 4]), _vi("idx", [2, 3, 4, 4], TensorProto.INT64)], opset=13)
    m.ir_version = 8  # readable by onnxruntime
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 7)).astype(np.float32)
    ours = run(verify(import_onnx(m)), {"x": x})
    y, idx = reference_session(m).run(None, {"x": x})
    np.testing.assert_array_equal(ours["y"], y)
    np.testing.assert_array_equal(ours["idx"], idx)


@pytest.mark.parametrize("data, message", [
    (b"\x08\x07\x12\xff\xff", r"not a valid ONNX model: cannot parse protobuf"),
    (b"", r"not a valid ONNX model: it has no graph"),
    (mlp().SerializeToString()[:-100], r"not a valid ONNX model"),
    (b"hello world, not a model", r"not a valid ONNX model"),
])
def test_malformed_bytes(data, message):
    with pytest.raises(InvalidModelError, match=message):
        import_onnx(data)


def test_missing_file(tmp_path):
    with pytest.raises(InvalidModelError, match=r"not a valid ONNX model: cannot read"):
        import_onnx(tmp_path / "nope.onnx")


def test_checker_failure_is_reported_as_invalid_model():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("z", [2])])
    with pytest.raises(InvalidModelError, match=r"not a valid ONNX model: .*"):
        import_onnx(m)


def test_wrong_argument_type():
    with pytest.raises(TypeError, match=r"expected an onnx.ModelProto, a path or bytes, got int"):
        import_onnx(42)
    with pytest.raises(ValueError, match=r"batch_size must be a positive int, got 0"):
        import_onnx(mlp(), batch_size=0)


def test_operators_defined_by_a_function_are_expanded():
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
    shape = [1, 2, 4, 8]
    m = _model([node], [_vi(n, shape) for n in "qkv"], [_vi("y", shape)], opset=23)
    g = verify(import_onnx(m))
    assert Op.SOFTMAX in {n.op for n in g.nodes}
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    (expected,) = ReferenceEvaluator(m).run(None, feeds)
    np.testing.assert_allclose(run(g, feeds)["y"], expected, rtol=1e-5, atol=1e-6)


def test_function_body_with_unsupported_operator():
    node = helper.make_node("Bernoulli", ["x"], ["y"], name="coin")
    m = _model([node], [_vi("x", [4])], [_vi("y", [4])], opset=17)
    with pytest.raises(UnsupportedError, match=r"node 'coin' \(Bernoulli\): operator 'Bernoulli' "
                                               r"is imported through its ONNX function body, and "
                                               r"that failed: .*RandomUniformLike"):
        import_onnx(m)
