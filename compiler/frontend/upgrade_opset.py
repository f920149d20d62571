"""ONNX models of opset 7 to 12 → opset 13, the oldest the importer reads natively.

`upgrade_opset` runs `onnx.version_converter.convert_version` and repairs what that converter
gets wrong, checked against onnxruntime on the original models:

- Hardmax before opset 13 flattens its input to 2-D at `axis`; the converter adapts Softmax and
  LogSoftmax for that but not Hardmax. Before converting, Hardmax(axis=a) on an input whose
  last axis is not a becomes Flatten(axis=a) → Hardmax(axis=1) → Reshape(Shape(x)).
- ImageScaler (experimental, removed in opset 10; tiny-YOLOv2 of the model zoo uses it) has no
  schema to convert from: before converting it becomes Mul(scale) → Add(bias per channel).
- Dropout before opset 10 has a mask of the input's type; opset 10 made it bool and the
  converter leaves the graph declaring the old type: a Cast back to that type is added.
- Upsample (any version) and Resize-10 map output to input coordinates as i / scale
  ("asymmetric"), and onnxruntime rounds "nearest" down (for scales >= 1, the only ones
  Upsample allows); the converter gives the Resize-13 defaults (half_pixel,
  round_prefer_floor). Set to asymmetric and floor after converting. A nearest Resize-10 may
  also downsample, which rounds up: the outputs of these nodes are listed in
  `Upgraded.legacy_nearest` for the importer, which sees the scales (they may be computed from
  shapes). Any Resize converted from opset 10 or older is one of these: the converter renames
  some outputs, so the nodes are not matched to the originals.
- Resize-11/12 with coordinate_transformation_mode=tf_half_pixel_for_nn (gone in 13):
  round_prefer_floor((i + 0.5) / s) = ceil(half_pixel(i)) and floor((i + 0.5) / s) =
  round_prefer_ceil(half_pixel(i)), so it becomes half_pixel with ceil / round_prefer_ceil.

The weights stay out of all this (`without_large_initializers`): converting works on the
graph alone, fast, and for models over protobuf's 2 GB limit too.

A node the converter still cannot convert (BatchNormalization before 9 with spatial=0, for
one) raises UnsupportedError naming the node and its operator. The converter's message seldom
names it, so each node is then converted on its own until one fails.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper, numpy_helper

from ..errors import UnsupportedError

OLDEST_OPSET = 7
TARGET_OPSET = 13
LARGE_ELEMENTS = 1024  # see without_large_initializers
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class Upgraded:
    """model: the model at TARGET_OPSET, in which the `initializers` (the large ones, see
    `without_large_initializers`) are typed graph inputs. legacy_nearest: outputs of its
    nearest-mode Resize nodes that were Upsample or Resize-10 (asymmetric coordinates;
    onnxruntime rounds down when upsampling an axis, up when downsampling it, which only
    Resize-10 may do)."""

    model: onnx.ModelProto
    legacy_nearest: frozenset[str]
    initializers: tuple[TensorProto, ...]


def upgrade_opset(model: onnx.ModelProto, opset: int) -> Upgraded:
    """Convert model, whose default-domain opset is opset (OLDEST_OPSET <= opset <
    TARGET_OPSET), to TARGET_OPSET. model is not modified."""
    assert OLDEST_OPSET <= opset < TARGET_OPSET, opset
    src, large = without_large_initializers(model)
    _prepare(src, opset)
    try:
        out = _convert(src)
    except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError, the checker others
        raise _conversion_error(model, src, opset, e) from None
    legacy: set[str] = set()
    for node in out.graph.node:
        if node.op_type != "Resize" or node.domain not in _DEFAULT_DOMAINS:
            continue
        if opset < 11:  # an Upsample or a Resize-10 (the converter may rename its output)
            _set_attr(node, "coordinate_transformation_mode", "asymmetric")
            if _text_attr(node, "mode", "nearest") == "nearest":
                _set_attr(node, "nearest_mode", "floor")
                legacy.add(node.output[0])
        elif _text_attr(node, "coordinate_transformation_mode", "") == "tf_half_pixel_for_nn":
            _replace_tf_half_pixel_for_nn(node, opset)
    return Upgraded(out, frozenset(legacy), tuple(large))


def without_large_initializers(model: onnx.ModelProto
                               ) -> tuple[onnx.ModelProto, list[TensorProto]]:
    """A copy of model's opsets and graph in which the initializers of LARGE_ELEMENTS or more
    elements are typed graph inputs instead, and those initializers (not copied).

    ONNX's converter, checker and shape inference serialise the model, several times, and
    protobuf cannot serialise one over 2 GB (nor copy a message into another past that). None
    of them needs the values of weights: no adapter from opset 7 to 13 reads one (they read or
    make scales, pads, axes and shapes), and shape inference propagates small shape tensors
    only."""
    g = model.graph
    large = [t for t in g.initializer if math.prod(t.dims) >= LARGE_ELEMENTS]
    names = {t.name for t in large}
    out = onnx.ModelProto(ir_version=model.ir_version)
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    og = out.graph
    og.name = g.name
    og.node.extend(g.node)
    og.input.extend(g.input)
    listed = {vi.name for vi in g.input}
    og.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                    for t in large if t.name not in listed)
    og.output.extend(g.output)
    og.value_info.extend(g.value_info)
    og.initializer.extend(t for t in g.initializer if t.name not in names)
    og.sparse_initializer.extend(g.sparse_initializer)
    return out, large


def _convert(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnx import version_converter

    out = version_converter.convert_version(model, TARGET_OPSET)
    # The converter keeps the IR version; below 4, the initializers it adds (Pad's pads...)
    # would have to be graph inputs too. Opset 13 came with IR version 7.
    out.ir_version = max(out.ir_version, helper.find_min_ir_version_for(
        [helper.make_opsetid("", TARGET_OPSET)]))
    onnx.checker.check_model(out)
    return out


def _prepare(model: onnx.ModelProto, opset: int) -> None:
    """The rewrites before converting (see the module docstring), in place at opset."""
    g = model.graph
    if not any(n.op_type in ("Hardmax", "ImageScaler") or _dropout_mask(n, opset)
               for n in g.node):
        return
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type for vi in [*inferred.graph.value_info,
                                                    *inferred.graph.input,
                                                    *inferred.graph.output]
             if vi.type.HasField("tensor_type")}
    for init in g.initializer:
        types.setdefault(init.name, helper.make_tensor_type_proto(
            init.data_type, list(init.dims)).tensor_type)
    names = {n for node in g.node for n in [*node.input, *node.output]}
    names |= {vi.name for vi in [*g.input, *g.output]} | {t.name for t in g.initializer}

    def fresh(base: str) -> str:
        k, name = 0, base
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        return name

    def elem_type(name: str) -> int:
        t = types.get(name)
        return t.elem_type if t is not None and t.elem_type else TensorProto.FLOAT

    def constant(base: str, value: np.ndarray) -> tuple[NodeProto, str]:
        name = fresh(base)
        return helper.make_node("Constant", [], [name], name=name,
                                value=numpy_helper.from_array(value, name)), name

    nodes: list[NodeProto] = []
    for node in g.node:
        if node.domain not in _DEFAULT_DOMAINS:
            nodes.append(node)
        elif node.op_type == "Hardmax" and _hardmax_needs_flatten(node, types):
            x, y = node.input[0], node.output[0]
            axis = _int_attr(node, "axis", 1)
            flat, hard, shape = fresh(f"{y}/flat"), fresh(f"{y}/hardmax"), fresh(f"{y}/shape")
            prefix = node.name or y
            nodes += [helper.make_node("Flatten", [x], [flat], name=f"{prefix}/flatten",
                                       axis=axis),
                      helper.make_node("Hardmax", [flat], [hard], name=node.name, axis=1),
                      helper.make_node("Shape", [x], [shape], name=f"{prefix}/shape"),
                      helper.make_node("Reshape", [hard, shape], [y], name=f"{prefix}/reshape")]
        elif node.op_type == "ImageScaler":
            x, y = node.input[0], node.output[0]
            dtype = helper.tensor_dtype_to_np_dtype(elem_type(x))
            scale = _attr(node, "scale")
            bias = _attr(node, "bias")
            c_scale, s_name = constant(f"{y}/scale",
                                       np.array(scale.f if scale is not None else 1.0, dtype))
            bias_values = np.array(list(bias.floats) if bias is not None else [0.0], dtype)
            c_bias, b_name = constant(f"{y}/bias", bias_values.reshape(-1, 1, 1))
            scaled = fresh(f"{y}/scaled")
            prefix = node.name or y
            nodes += [c_scale, c_bias,
                      helper.make_node("Mul", [x, s_name], [scaled], name=f"{prefix}/mul"),
                      helper.make_node("Add", [scaled, b_name], [y], name=node.name)]
        elif _dropout_mask(node, opset):
            mask, as_bool = node.output[1], fresh(f"{node.output[1]}/bool")
            new = NodeProto()
            new.CopyFrom(node)
            new.output[1] = as_bool
            nodes += [new, helper.make_node("Cast", [as_bool], [mask],
                                            name=f"{node.name or mask}/cast",
                                            to=elem_type(node.input[0]))]
        else:
            nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)


def _dropout_mask(node: NodeProto, opset: int) -> bool:
    """A Dropout whose mask has the input's type (opset < 10) and is used."""
    return (node.op_type == "Dropout" and node.domain in _DEFAULT_DOMAINS and opset < 10
            and len(node.output) > 1 and node.output[1] != "")


def _hardmax_needs_flatten(node: NodeProto, types: dict[str, Any]) -> bool:
    t = types.get(node.input[0])
    if t is None or not t.HasField("shape"):
        return True
    rank = len(t.shape.dim)
    axis = _int_attr(node, "axis", 1)
    return rank > 0 and axis % rank != rank - 1


def _replace_tf_half_pixel_for_nn(node: NodeProto, opset: int) -> None:
    rounding = _text_attr(node, "nearest_mode", "round_prefer_floor")
    same = {"round_prefer_floor": "ceil", "floor": "round_prefer_ceil"}
    if _text_attr(node, "mode", "nearest") != "nearest" or rounding not in same:
        raise UnsupportedError(
            f"{_where(node)}: coordinate_transformation_mode='tf_half_pixel_for_nn' (opset "
            f"{opset}) with mode='{_text_attr(node, 'mode', 'nearest')}', nearest_mode="
            f"'{rounding}' has no opset-{TARGET_OPSET} equivalent; supported: mode='nearest' "
            f"with nearest_mode='round_prefer_floor' or 'floor'")
    _set_attr(node, "coordinate_transformation_mode", "half_pixel")
    _set_attr(node, "nearest_mode", same[rounding])


def _conversion_error(original: onnx.ModelProto, model: onnx.ModelProto, opset: int,
                      error: Exception) -> UnsupportedError:
    """The error for model (original after `_prepare`) that the converter failed on: it names
    the first node that fails to convert on its own, or failing that, the nodes whose operators
    changed in between. Unnamed nodes are named by their index in original."""

    index = {n.output[0]: i for i, n in enumerate(original.graph.node) if n.output}

    def where(node: NodeProto) -> str:
        return _where(node, index.get(node.output[0]) if node.output else None)

    reason = _reason(error)
    alone = _single_node_models(model)
    for node in model.graph.node:
        try:
            _convert(alone(node))
        except Exception as e:  # noqa: BLE001 - as above
            return UnsupportedError(
                f"{where(node)}: ONNX's version converter cannot convert it from opset "
                f"{opset} to opset {TARGET_OPSET} ({_reason(e)}); export the model at opset "
                f"{TARGET_OPSET} or newer")
    changed = [where(n) for n in model.graph.node if _changed(n, opset)]
    return UnsupportedError(
        f"ONNX's version converter cannot convert the model from opset {opset} to opset "
        f"{TARGET_OPSET} ({reason}), though each node converts on its own; nodes whose "
        f"operators changed in between: {', '.join(changed[:10]) or 'none'}; export the model "
        f"at opset {TARGET_OPSET} or newer")


def _single_node_models(model: onnx.ModelProto) -> Callable[[NodeProto], onnx.ModelProto]:
    """A function giving each node of model alone in a model of the same opsets: its
    initializers and Constant inputs as they are (adapters read them), its other inputs and
    outputs typed by shape inference."""
    g = onnx.shape_inference.infer_shapes(model).graph
    infos = {vi.name: vi for vi in [*g.value_info, *g.input, *g.output]}
    inits = {t.name: t for t in g.initializer}
    constants = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}

    def info(name: str) -> onnx.ValueInfoProto:
        return infos.get(name) or helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    def alone(node: NodeProto) -> onnx.ModelProto:
        nodes, inputs, used = [], [], []
        for name in dict.fromkeys(n for n in node.input if n):
            if name in inits:
                used.append(inits[name])
            elif name in constants:
                nodes.append(constants[name])
            else:
                inputs.append(info(name))
        outputs = [info(n) for n in node.output if n]
        one = helper.make_model(helper.make_graph([*nodes, node], "node", inputs, outputs, used),
                                opset_imports=list(model.opset_import))
        one.ir_version = max(model.ir_version, 4)  # initializers need not be graph inputs
        return one

    return alone


def _changed(node: NodeProto, opset: int) -> bool:
    try:
        old = onnx.defs.get_schema(node.op_type, opset, node.domain).since_version
        new = onnx.defs.get_schema(node.op_type, TARGET_OPSET, node.domain).since_version
    except onnx.defs.SchemaError:
        return True
    return old != new


def _reason(error: Exception) -> str:
    """The converter's message without its C++ source location and assertion text."""
    text = str(error).strip()
    text = re.sub(r"^.*Assertion `.*?` failed: ", "", text, flags=re.S)
    return re.sub(r"\s+", " ", text)


def _where(node: NodeProto, index: int | None = None) -> str:
    """Named like the importer names nodes: by name, else by index, else by first output."""
    if node.name:
        name = f"'{node.name}'"
    else:
        name = f"#{index}" if index is not None else f"producing '{node.output[0]}'"
    return f"node {name} ({node.op_type})"


def _attr(node: NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _int_attr(node: NodeProto, name: str, default: int) -> int:
    a = _attr(node, name)
    return int(a.i) if a is not None else default


def _text_attr(node: NodeProto, name: str, default: str) -> str:
    a = _attr(node, name)
    return a.s.decode() if a is not None else default


def _set_attr(node: NodeProto, name: str, value: str) -> None:
    for k, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[k]
            break
    node.attribute.append(helper.make_attribute(name, value))
