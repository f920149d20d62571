"""Models of opset 7 to 12: converted to opset 13 on import, they compute what onnxruntime
computes on the original model. One case per form that changed between those opsets (an
attribute that became an input, a changed default, an operator that was replaced), and the
errors for what cannot be converted."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from ort_reference import reference_session

from vtakit.compiler.errors import UnsupportedError
from vtakit.compiler.frontend import import_onnx
from vtakit.compiler.ir import run, verify

ort = pytest.importorskip("onnxruntime", reason="pip install 'vtakit[dev]'")

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
X = ("x", [1, 3, 8, 8])
_rng = np.random.default_rng(0)


def _r(*shape, lo=-1.0, hi=1.0):
    return _rng.uniform(lo, hi, shape).astype(np.float32)


def old_model(nodes, inputs, outputs, inits=(), opset=9):
    """A model at opset with the IR version of its time; below IR 4 the initializers are graph
    inputs too, as exporters of that time wrote them."""
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()]
    ins = [helper.make_tensor_value_info(n, t, s) for n, s, *rest in inputs
           for t in [rest[0] if rest else F]]
    outs = [helper.make_tensor_value_info(n, rest[0] if rest else F, s) for n, s, *rest in outputs]
    opsets = [helper.make_opsetid("", opset)]
    ir = helper.find_min_ir_version_for(opsets)
    if ir < 4:
        ins += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = helper.make_graph(nodes, "g", ins, outs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir)


def assert_matches_onnxruntime(model, skip_outputs=()):
    init = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name not in init:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = _rng.standard_normal(shape).astype(np.float32)
    sess = reference_session(model)
    want = dict(zip([o.name for o in model.graph.output], sess.run(None, feeds), strict=True))
    before = model.SerializeToString()
    got = run(verify(import_onnx(model)), feeds)
    assert model.SerializeToString() == before  # the caller's model is not modified
    for name, w in want.items():
        if name in skip_outputs:
            continue
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5 * max(1, np.abs(w).max()),
                                   err_msg=name)


N = helper.make_node
BN = {"s": _r(3, lo=0.5), "b": _r(3), "m": _r(3), "v": _r(3, lo=0.5, hi=1.5)}
SCALES = {"sc": np.array([1, 1, 2, 3], np.float32)}
DOWN = {"sc": np.array([1, 1, 0.6, 0.45], np.float32)}
EMPTY = np.array([], np.float32)

# (id, opset, nodes, inputs, outputs, initializers)
CASES = [
    ("bn_spatial_7", 7, [N("BatchNormalization", list("xsbmv"), ["y"], spatial=1, epsilon=1e-3)],
     [X], [("y", [1, 3, 8, 8])], BN),
    ("bn_9", 9, [N("BatchNormalization", list("xsbmv"), ["y"], momentum=0.8)], [X],
     [("y", [1, 3, 8, 8])], BN),
    *[(f"upsample_attr_7_{m}", 7, [N("Upsample", ["x"], ["y"], scales=[1.0, 1, 2, 3], mode=m)],
       [X], [("y", [1, 3, 16, 24])], {}) for m in ("nearest", "linear")],
    *[(f"upsample_9_{m}", 9, [N("Upsample", ["x", "sc"], ["y"], mode=m)], [X],
       [("y", [1, 3, 16, 24])], SCALES) for m in ("nearest", "linear")],
    ("upsample_9_fractional", 9, [N("Upsample", ["x", "sc"], ["y"])], [X],
     [("y", [1, 3, 13, 20])], {"sc": np.array([1, 1, 1.7, 2.5], np.float32)}),
    ("upsample_9_scales_from_shape", 9,
     [N("Shape", ["x"], ["shape"]), N("Cast", ["shape"], ["size"], to=F),
      N("Div", ["target", "size"], ["sc"]), N("Upsample", ["x", "sc"], ["y"])], [X],
     [("y", [1, 3, 16, 16])], {"target": np.array([1, 3, 16, 16], np.float32)}),
    *[(f"resize_10_{m}_{d}", 10, [N("Resize", ["x", "sc"], ["y"], mode=m)], [X],
       [("y", shape)], sc) for m in ("nearest", "linear")
      for d, shape, sc in (("up", [1, 3, 16, 24], SCALES), ("down", [1, 3, 4, 3], DOWN))],
    # Not a graph output: the converter renames the output of the Resize it makes.
    *[(f"{op}_{v}_inner_nearest", v, [N(op, ["x", "sc"], ["r"]), N("Neg", ["r"], ["y"])], [X],
       [("y", shape)], sc) for op, v, shape, sc in (("Upsample", 9, [1, 3, 16, 24], SCALES),
                                                    ("Resize", 10, [1, 3, 4, 3], DOWN))],
    ("resize_11_align_corners", 11, [N("Resize", ["x", "roi", "sc"], ["y"], mode="linear",
                                       coordinate_transformation_mode="align_corners")],
     [X], [("y", [1, 3, 16, 24])], {"roi": EMPTY, **SCALES}),
    ("resize_11_sizes", 11, [N("Resize", ["x", "roi", "sc", "sz"], ["y"])], [X],
     [("y", [1, 3, 16, 12])], {"roi": EMPTY, "sc": EMPTY, "sz": np.array([1, 3, 16, 12])}),
    *[(f"resize_11_tf_half_pixel_for_nn_{r}", 11,
       [N("Resize", ["x", "roi", "sc"], ["y"], nearest_mode=r,
          coordinate_transformation_mode="tf_half_pixel_for_nn")], [X],
       [("y", [1, 3, 12, 20])], {"roi": EMPTY, "sc": np.array([1, 1, 1.5, 2.5], np.float32)})
      for r in ("round_prefer_floor", "floor")],
    ("dropout_7", 7, [N("Dropout", ["x"], ["y"], ratio=0.3)], [X], [("y", [1, 3, 8, 8])], {}),
    ("dropout_12_ratio_input", 12, [N("Dropout", ["x", "r"], ["y"])], [X],
     [("y", [1, 3, 8, 8])], {"r": np.array(0.5, np.float32)}),
    *[(f"pad_attr_{v}_{m}", v, [N("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 2, 1], mode=m,
                                  **({"value": 1.5} if m == "constant" else {}))],
       [X], [("y", [1, 3, 11, 11])], {})
      for v in (7, 10) for m in ("constant", "reflect", "edge")],
    ("pad_11_inputs", 11, [N("Pad", ["x", "p", "c"], ["y"])], [X], [("y", [1, 3, 11, 11])],
     {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1]), "c": np.array(1.5, np.float32)}),
    *[(f"clip_attr_{v}", v, [N("Clip", ["x"], ["y"], min=-0.5, max=0.7)], [X],
       [("y", [1, 3, 8, 8])], {}) for v in (7, 10)],
    ("clip_attr_min_only_9", 9, [N("Clip", ["x"], ["y"], min=-0.5)], [X], [("y", [1, 3, 8, 8])],
     {}),
    ("clip_11_inputs", 11, [N("Clip", ["x", "lo", "hi"], ["y"])], [X], [("y", [1, 3, 8, 8])],
     {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}),
    ("slice_attr_9", 9, [N("Slice", ["x"], ["y"], starts=[1, -5], ends=[3, 1000], axes=[1, 3])],
     [X], [("y", [1, 2, 8, 5])], {}),
    ("slice_attr_no_axes_9", 9, [N("Slice", ["x"], ["y"], starts=[0, 1, 2], ends=[1, 3, 6])],
     [X], [("y", [1, 2, 4, 8])], {}),
    ("slice_10_inputs_step", 10, [N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], [X],
     [("y", [1, 3, 4, 8])], {"st": np.array([6]), "en": np.array([-100]), "ax": np.array([2]),
                             "sp": np.array([-2])}),
    ("squeeze_attr_11", 11, [N("Squeeze", ["x"], ["y"], axes=[0])], [X], [("y", [3, 8, 8])], {}),
    ("squeeze_no_axes_11", 11, [N("Squeeze", ["x"], ["y"])], [X], [("y", [3, 8, 8])], {}),
    ("unsqueeze_attr_11", 11, [N("Unsqueeze", ["x"], ["y"], axes=[0, -1])], [X],
     [("y", [1, 1, 3, 8, 8, 1])], {}),
    ("unsqueeze_attr_9", 9, [N("Unsqueeze", ["x"], ["y"], axes=[2])], [X],
     [("y", [1, 3, 1, 8, 8])], {}),
    *[(f"{op}_axes_attr_11", 11, [N(op, ["x"], ["y"], axes=[1, -1], keepdims=0)], [X],
       [("y", [1, 8])], {}) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2")],
    ("ReduceSum_all_9", 9, [N("ReduceSum", ["x"], ["y"])], [X], [("y", [1, 1, 1, 1])], {}),
    ("split_attr_11", 11, [N("Split", ["x"], ["a", "b"], axis=1, split=[1, 2])], [X],
     [("a", [1, 1, 8, 8]), ("b", [1, 2, 8, 8])], {}),
    ("split_equal_7", 7, [N("Split", ["x"], ["a", "b"], axis=2)], [X],
     [("a", [1, 3, 4, 8]), ("b", [1, 3, 4, 8])], {}),
    ("topk_attr_9", 9, [N("TopK", ["x"], ["v", "i"], k=3, axis=2)], [X],
     [("v", [1, 3, 3, 8]), ("i", [1, 3, 3, 8], I64)], {}),
    ("topk_10_input", 10, [N("TopK", ["x", "k"], ["v", "i"])], [X],
     [("v", [1, 3, 8, 3]), ("i", [1, 3, 8, 3], I64)], {"k": np.array([3])}),
    ("maxpool_7", 7, [N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                        pads=[1, 1, 1, 1])], [X], [("y", [1, 3, 4, 4])], {}),
    ("maxpool_storage_order_8", 8, [N("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2],
                                      strides=[2, 2], storage_order=1)],
     [X], [("y", [1, 3, 4, 4]), ("i", [1, 3, 4, 4], I64)], {}),
    ("maxpool_ceil_10", 10, [N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                               ceil_mode=1)], [X], [("y", [1, 3, 4, 4])], {}),
    ("avgpool_count_include_pad_7", 7, [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3],
                                          strides=[2, 2], pads=[1, 1, 1, 1],
                                          count_include_pad=1)], [X], [("y", [1, 3, 4, 4])], {}),
    ("gemm_7", 7, [N("Gemm", ["a", "w", "c"], ["y"], alpha=0.5, beta=2.0, transB=1)],
     [("a", [2, 5])], [("y", [2, 4])], {"w": _r(4, 5), "c": _r(4)}),
    ("add_broadcast_7", 7, [N("Add", ["x", "b"], ["y"])], [X], [("y", [1, 3, 8, 8])],
     {"b": _r(3, 1, 1)}),
    ("sum_broadcast_8", 8, [N("Sum", ["x", "b", "c"], ["y"])], [X], [("y", [1, 3, 8, 8])],
     {"b": _r(8), "c": _r(3, 1, 1)}),
    ("prelu_7", 7, [N("PRelu", ["x", "s"], ["y"])], [X], [("y", [1, 3, 8, 8])],
     {"s": _r(3, 1, 1)}),
    *[(f"{op}_axis_{axis}_{v}", v, [N(op, ["x"], ["y"], **({"axis": axis} if axis else {}))],
       [X], [("y", [1, 3, 8, 8])], {})
      for op in ("Softmax", "LogSoftmax", "Hardmax") for v, axis in ((9, None), (11, 2), (12, -1))],
    ("flatten_9", 9, [N("Flatten", ["x"], ["y"], axis=2)], [X], [("y", [3, 64])], {}),
    ("reshape_8", 8, [N("Reshape", ["x", "s"], ["y"])], [X], [("y", [3, 64])],
     {"s": np.array([3, -1])}),
    ("scatter_9", 9, [N("Scatter", ["d", "i", "u"], ["y"], axis=1)], [("d", [3, 3])],
     [("y", [3, 3])], {"i": np.array([[1, 0, 2], [0, 2, 1]]), "u": _r(2, 3)}),
    ("lrn_7", 7, [N("LRN", ["x"], ["y"], size=3)], [X], [("y", [1, 3, 8, 8])], {}),
    ("depth_to_space_7", 7, [N("DepthToSpace", ["x"], ["y"], blocksize=2)], [("x", [1, 8, 2, 2])],
     [("y", [1, 2, 4, 4])], {}),
    ("instance_norm_7", 7, [N("InstanceNormalization", ["x", "s", "b"], ["y"])], [X],
     [("y", [1, 3, 8, 8])], {"s": _r(3), "b": _r(3)}),
    ("conv_transpose_7", 7, [N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])], [X],
     [("y", [1, 2, 17, 17])], {"w": _r(3, 2, 3, 3)}),
    ("image_scaler_8", 8, [N("ImageScaler", ["x"], ["y"], scale=0.5, bias=[1.0, 2.0, 3.0])], [X],
     [("y", [1, 3, 8, 8])], {}),
    ("quantize_dequantize_10", 10, [N("QuantizeLinear", ["x", "s", "z"], ["q"]),
                                    N("DequantizeLinear", ["q", "s", "z"], ["y"])], [X],
     [("y", [1, 3, 8, 8])], {"s": np.array(0.02, np.float32), "z": np.array(128, np.uint8)}),
    ("argmax_select_last_12", 12, [N("ArgMax", ["x"], ["y"], axis=1, select_last_index=1)],
     [X], [("y", [1, 1, 8, 8], I64)], {}),
    ("celu_12", 12, [N("Celu", ["x"], ["y"], alpha=2.0)], [X], [("y", [1, 3, 8, 8])], {}),
]


@pytest.mark.parametrize(("opset", "nodes", "inputs", "outputs", "inits"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_old_opset_form_matches_onnxruntime(opset, nodes, inputs, outputs, inits):
    assert_matches_onnxruntime(old_model(nodes, inputs, outputs, inits, opset))


def test_dropout_mask_of_opset_7_keeps_its_type():
    # Before opset 10 the mask has the input's type. onnxruntime fills it with zeros there;
    # the importer gives Dropout-12's inference mask (every element kept), so only y is compared.
    m = old_model([N("Dropout", ["x"], ["y", "mask"], ratio=0.3)], [X],
                  [("y", [1, 3, 8, 8]), ("mask", [1, 3, 8, 8])], opset=7)
    assert_matches_onnxruntime(m, skip_outputs=("mask",))
    mask = run(verify(import_onnx(m)), {"x": np.zeros((1, 3, 8, 8), np.float32)})["mask"]
    assert mask.dtype == np.float32 and np.all(mask == 1)


def test_opset_below_7_rejected():
    m = old_model([N("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])], opset=6)
    with pytest.raises(UnsupportedError, match=r"opset 6 of the default domain; supported: opset "
                                               r"7 to 12 \(converted to opset 13 on import\) and "
                                               r"opset 13 and newer"):
        import_onnx(m)


def test_unconvertible_node_is_named():
    bn = {k: np.ones((3, 8, 8), np.float32) for k in "sbmv"}
    nodes = [N("Relu", ["x"], ["r"], name="relu"),
             N("BatchNormalization", ["r", *"sbmv"], ["y"], name="bn1", spatial=0)]
    m = old_model(nodes, [X], [("y", [1, 3, 8, 8])], bn, opset=7)
    with pytest.raises(UnsupportedError, match=r"^node 'bn1' \(BatchNormalization\): ONNX's "
                                               r"version converter cannot convert it from opset "
                                               r"7 to opset 13 \(Attribute spatial must have "
                                               r"value 1\)"):
        import_onnx(m)


def test_unnamed_unconvertible_node_is_named_by_index():
    bn = {k: np.ones((3, 8, 8), np.float32) for k in "sbmv"}
    nodes = [N("Relu", ["x"], ["r"]), N("BatchNormalization", ["r", *"sbmv"], ["y"], spatial=0)]
    m = old_model(nodes, [X], [("y", [1, 3, 8, 8])], bn, opset=7)
    with pytest.raises(UnsupportedError, match=r"^node #1 \(BatchNormalization\): ONNX's "):
        import_onnx(m)


def test_tf_half_pixel_for_nn_without_equivalent():
    node = N("Resize", ["x", "roi", "sc"], ["y"], name="up", mode="linear",
             coordinate_transformation_mode="tf_half_pixel_for_nn")
    m = old_model([node], [X], [("y", [1, 3, 16, 24])], {"roi": EMPTY, **SCALES}, opset=11)
    with pytest.raises(UnsupportedError, match=r"node 'up' \(Resize\): coordinate_transformation_"
                                               r"mode='tf_half_pixel_for_nn' \(opset 11\) with "
                                               r"mode='linear'"):
        import_onnx(m)


def test_resize_10_nearest_up_and_down_rejected():
    sc = {"sc": np.array([1, 1, 2, 0.5], np.float32)}
    m = old_model([N("Resize", ["x", "sc"], ["y"], name="rs")], [X], [("y", [1, 3, 16, 4])], sc,
                  opset=10)
    with pytest.raises(UnsupportedError, match=r"node 'rs' \(Resize\): scales \[1.0, 1.0, 2.0, "
                                               r"0.5\] both up- and downsample"):
        import_onnx(m)


def test_opset_13_is_not_converted():
    # A model already at 13 keeps its nodes as they are (here, a Resize's half_pixel default).
    m = old_model([N("Resize", ["x", "", "sc"], ["y"])], [X], [("y", [1, 3, 16, 24])], SCALES,
                  opset=13)
    (node,) = [n for n in import_onnx(m).nodes if n.op.name == "RESIZE"]
    assert node.attrs.coordinate_mode == "half_pixel"


def test_bool_output_type_survives():
    m = old_model([N("Greater", ["x", "t"], ["y"])], [X], [("y", [1, 3, 8, 8], BOOL)],
                  {"t": np.array(0.0, np.float32)}, opset=7)
    assert_matches_onnxruntime(m)


@pytest.mark.parametrize("opset", [7, 9])
def test_large_weights_stay_constants(opset):
    # Weights of 1024 elements or more skip the converter (as graph inputs there); below IR
    # version 4 (opset 7) they are graph inputs of the original too.
    m = old_model([N("Gemm", ["a", "w", "c"], ["y"], transB=1)], [("a", [2, 64])],
                  [("y", [2, 32])], {"w": _r(32, 64), "c": _r(32)}, opset=opset)
    g = verify(import_onnx(m))
    assert g.input_names == ("a",)
    np.testing.assert_array_equal(g.constants["w"], numpy_helper.to_array(m.graph.initializer[0]))
    assert_matches_onnxruntime(m)
