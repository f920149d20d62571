"""ONNX → graph IR.

`import_onnx` accepts ONNX models of the default domain, opset 13 and newer (opsets 7 to 12 are
converted to 13 first, see `upgrade_opset`), and onnxruntime's quantised operators of the
'com.microsoft' domain (QLinearAdd, QGemm...: imported as their QDQ form, see `ms_ops`), with
static shapes
(a symbolic leading dimension of an input is fixed to `batch_size`). Operands that decide an
output shape (Reshape's shape, Slice's starts, Pad's pads, Clip's bounds...) must be constant at
import time: initializers, Constant nodes, or subgraphs of them such as Shape → Gather → Concat,
which are evaluated here. Anything else that is not supported raises `UnsupportedError`
naming the node, the operator and what is supported.

A model that is not valid raises `InvalidModelError` naming the tensor or node, what it holds and
what was expected: a negative dimension, an initializer whose data does not fill its dims, an
initializer that gives a graph input's default value with another type, a declared shape
(value_info, graph output) that contradicts what the node computes. Every tensor (graph input,
initializer, constant, node output) must fit in `MAX_TENSOR_BYTES` (16 GiB); a bigger one raises
`TensorTooLargeError` here, at import, before anything of that size is allocated.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidModelError, NonConstantError, TensorTooLargeError, UnsupportedError
from ..ir import ops as o
from ..ir.dtypes import DType
from ..ir.graph import Graph, topological_order
from ..ir.infer import InferError, infer
from ..ir.interpreter import evaluate
from ..ir.ops import Node, Op, const
from . import ms_ops
from .functions import function_body, tensor_type
from .qdq import rewrite_qdq
from .upgrade_opset import OLDEST_OPSET, TARGET_OPSET, upgrade_opset, without_large_initializers

_LARGE_MODEL_BYTES = 2**30  # well below protobuf's 2 GiB limit on a serialised message
MIN_OPSET = TARGET_OPSET  # read natively; OLDEST_OPSET up to this are converted to it first
_DEFAULT_DOMAINS = ("", "ai.onnx")
# The largest tensor a model may declare or compute: beyond a workstation's memory, and far beyond
# what the runtime and the accelerator's DRAM are meant for. Checked from shapes alone, so that a
# small file declaring a huge tensor fails at import and not when the runtime allocates it.
MAX_TENSOR_BYTES = 2**34


def import_onnx(model: Any, *, batch_size: int = 1,
                constant_inputs: Mapping[str, np.ndarray] | None = None,
                integer: bool = True) -> Graph:
    """Import an ONNX model (a ModelProto, a file path, or serialised bytes) as a Graph.

    A path (str or os.PathLike) also loads the tensors stored as external data, from files
    named relative to the model's folder. batch_size replaces a symbolic leading dimension of
    the graph inputs. constant_inputs binds graph inputs to values, which then become constants
    (a way to specialise a model whose shape-deciding operands are inputs).
    """
    import onnx

    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    proto = _load(model)
    # The checker serialises the model, which protobuf cannot do past 2 GB: a model with that
    # much in weights (loaded from external data) is checked without its large initializers.
    weight_bytes = sum(len(t.raw_data) for t in proto.graph.initializer)
    checked = proto if weight_bytes < _LARGE_MODEL_BYTES else (
        without_large_initializers(proto)[0])
    try:
        onnx.checker.check_model(checked)
    except Exception as e:  # noqa: BLE001 - the checker raises several unrelated types
        raise InvalidModelError(f"not a valid ONNX model: {e}") from None
    opset = _default_opset(proto)
    legacy_nearest: frozenset[str] = frozenset()
    initializers: tuple[Any, ...] = ()
    if opset < MIN_OPSET:
        upgraded = upgrade_opset(proto, opset)
        proto, opset = upgraded.model, MIN_OPSET
        legacy_nearest, initializers = upgraded.legacy_nearest, upgraded.initializers
    g = _Importer(proto, opset, batch_size, dict(constant_inputs or {}), legacy_nearest,
                  initializers).run()
    return rewrite_qdq(g) if integer else g


def _load(model: Any) -> Any:
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        _check_no_external_data(model)
        return model
    base_dir = None
    if isinstance(model, (str, os.PathLike)):
        base_dir = os.path.dirname(os.fspath(model))
        try:
            with open(model, "rb") as f:
                model = f.read()
        except OSError as e:
            raise InvalidModelError(f"not a valid ONNX model: cannot read {model!r}: {e}") from None
    if not isinstance(model, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected an onnx.ModelProto, a path or bytes, got {type(model).__name__}")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(bytes(model))
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidModelError(f"not a valid ONNX model: cannot parse protobuf ({e})") from None
    if not proto.HasField("graph"):
        raise InvalidModelError("not a valid ONNX model: it has no graph")
    if base_dir is not None:
        _load_external_data(proto, base_dir)
    else:
        _check_no_external_data(proto)
    return proto


def _check_no_external_data(proto: Any) -> None:
    """A ModelProto or bytes has no folder to find external data in."""
    from onnx.external_data_helper import ExternalDataInfo

    external = _external_tensors(proto.graph)
    if external:
        t = external[0]
        raise InvalidModelError(f"not a valid ONNX model: tensor '{t.name}' is stored in the "
                                f"external data file '{ExternalDataInfo(t).location}', which is "
                                f"not loaded; pass the model's path, or load it with "
                                f"onnx.load(path) (load_external_data=True)")


def _external_tensors(graph: Any) -> list[Any]:
    """The tensors of graph (initializers, node attributes, subgraphs) stored as external data."""
    from onnx import AttributeProto, TensorProto

    found = [t for t in graph.initializer if t.data_location == TensorProto.EXTERNAL]
    for node in graph.node:
        for a in node.attribute:
            tensors = [a.t] if a.type == AttributeProto.TENSOR else list(a.tensors)
            found += [t for t in tensors if t.data_location == TensorProto.EXTERNAL]
            for sub in [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs):
                found += _external_tensors(sub)
    return found


def _load_external_data(proto: Any, base_dir: str) -> None:
    """Read the external data of proto's tensors from files relative to base_dir."""
    from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor

    for t in _external_tensors(proto.graph):
        location = ExternalDataInfo(t).location
        path = os.path.join(base_dir, location)
        if not os.path.isfile(path):
            raise InvalidModelError(f"not a valid ONNX model: tensor '{t.name}' is stored in the "
                                    f"external data file '{location}', and {path} does not "
                                    f"exist (external files are looked up next to the model)")
        try:
            load_external_data_for_tensor(t, base_dir)
        except Exception as e:  # noqa: BLE001 - OSError, or onnx's ValidationError
            raise InvalidModelError(f"not a valid ONNX model: cannot load tensor '{t.name}' from "
                                    f"the external data file {path}: {e}") from None


def _default_opset(proto: Any) -> int:
    versions = [op.version for op in proto.opset_import if op.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise UnsupportedError("the model does not import the default ONNX domain ('' / "
                               "'ai.onnx'); only that domain is supported")
    if versions[0] < OLDEST_OPSET:
        raise UnsupportedError(f"the model uses opset {versions[0]} of the default domain; "
                               f"supported: opset {OLDEST_OPSET} to {MIN_OPSET - 1} (converted "
                               f"to opset {MIN_OPSET} on import) and opset {MIN_OPSET} and newer")
    return versions[0]


@dataclass
class _Ctx:
    """One ONNX node being imported: its operands, attributes and how to make IR nodes."""

    imp: _Importer
    proto: Any
    index: int
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        p = self.proto
        name = f"'{p.name}'" if p.name else f"#{self.index}"
        return f"node {name} ({p.op_type})"

    def fail(self, what: str) -> UnsupportedError:
        return UnsupportedError(f"{self.where}: {what}")

    @property
    def n_in(self) -> int:
        return len(self.proto.input)

    def has(self, k: int) -> bool:
        return k < len(self.proto.input) and self.proto.input[k] != ""

    def inp(self, k: int) -> Node:
        if not self.has(k):
            raise InvalidModelError(f"{self.where}: required input {k} is missing")
        return self.imp.env[self.proto.input[k]]

    def opt(self, k: int) -> Node | None:
        return self.inp(k) if self.has(k) else None

    def value(self, k: int) -> np.ndarray:
        """The value of input k, which must be computable at import time."""
        node = self.inp(k)
        v = self.imp.fold(node)
        if v is None:
            name = self.proto.input[k]
            deps = tuple(n.name for n in topological_order((node,)) if n.op is Op.INPUT)
            raise NonConstantError(f"{self.where}: input {k} '{name}' must be a constant "
                                   f"(an initializer or computable from constants) because it "
                                   f"decides the output shape or attributes; it depends on the "
                                   f"graph inputs {list(deps)}", name, deps)
        return v

    def ints(self, k: int) -> list[int]:
        return [int(v) for v in self.value(k).reshape(-1)]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            raise InvalidModelError(f"{self.where}: axis {axis} out of range for rank {rank}")
        return axis % rank if rank else 0

    def make(self, op: Op, src: Sequence[Node], attrs: o.Attrs = o.NO_ATTRS,
             dtype: DType | None = None, shape: tuple[int, ...] | None = None,
             name: str = "") -> Node:
        try:
            d, s = infer(op, src, attrs, dtype, shape)
        except InferError as e:
            raise UnsupportedError(f"{self.where}: {e}") from None
        name = name or self.proto.output[0]
        _check_shape(f"{self.where}: output '{name}'", d, s)
        return Node(op, d, s, tuple(src), attrs, name)


Handler = Callable[[_Ctx], Sequence[Node]]


class _Importer:
    def __init__(self, proto: Any, opset: int, batch_size: int,
                 bound: dict[str, np.ndarray], legacy_nearest: frozenset[str] = frozenset(),
                 initializers: Sequence[Any] = ()) -> None:
        self.proto, self.opset, self.batch_size, self.bound = proto, opset, batch_size, bound
        # From upgrade_opset.Upgraded: initializers kept out of proto (graph inputs there).
        self.legacy_nearest, self.initializers = legacy_nearest, initializers
        self.env: dict[str, Node] = {}
        self._folded: dict[int, np.ndarray | None] = {}
        self.inferred: dict[str, tuple[int, tuple[int, ...]]] = {}
        self.declared: dict[str, Any] = {}  # name -> TypeProto.Tensor of value_info and outputs
        self.output_names: set[str] = set()

    def run(self) -> Graph:

        g = self.proto.graph
        for init in [*g.initializer, *self.initializers]:
            dtype = DType.from_onnx(init.data_type)
            if dtype is None:
                users = [f"node '{p.name}' ({p.op_type})" if p.name else
                         f"node #{i} ({p.op_type})" for i, p in enumerate(g.node)
                         if init.name in p.input]
                read = f" read by {', '.join(users)}" if users else ""
                raise UnsupportedError(f"initializer '{init.name}'{read}: "
                                       f"{_type_name(init.data_type)} tensors are not "
                                       f"supported; supported: {_DTYPES}")
            value = _tensor_value(init, f"initializer '{init.name}'", dtype)
            self.env[init.name] = const(value, name=init.name, dtype=dtype)
        inputs: list[Node] = []
        for vi in g.input:
            if vi.name in self.env:
                # An initializer listed as an input (IR version < 4, or a default value that the
                # model lets callers override): a constant, which must have the input's type.
                _check_default(vi, self.env[vi.name])
                continue
            if vi.name in self.bound:
                dtype, shape = self._input_type(vi)
                v = np.asarray(self.bound[vi.name])
                if v.dtype != dtype.np or tuple(v.shape) != shape:
                    raise ValueError(f"constant input '{vi.name}': got {v.dtype}{list(v.shape)},"
                                     f" expected {dtype.np}{list(shape)}")
                self.env[vi.name] = const(v, name=vi.name)
                continue
            dtype, shape = self._input_type(vi)
            _check_shape(f"graph input '{vi.name}'", dtype, shape)
            node = Node(Op.INPUT, dtype, shape, attrs=o.InputAttrs(len(inputs)), name=vi.name)
            inputs.append(node)
            self.env[vi.name] = node
        self.output_names = {vi.name for vi in g.output}
        self.declared = {vi.name: vi.type.tensor_type for vi in [*g.value_info, *g.output]
                         if vi.type.HasField("tensor_type")}
        self.inferred = self._onnx_value_infos(inputs)
        for i, p in enumerate(g.node):
            self._node(i, p)
        outputs = []
        for vi in g.output:
            if vi.name not in self.env:
                raise InvalidModelError(f"graph output '{vi.name}' is not produced by any node")
            outputs.append(self.env[vi.name])
        return Graph(tuple(inputs), tuple(outputs), tuple(vi.name for vi in g.output),
                     name=g.name or "graph")

    def _input_type(self, vi: Any) -> tuple[DType, tuple[int, ...]]:
        t = vi.type
        if not t.HasField("tensor_type"):
            raise UnsupportedError(f"graph input '{vi.name}': only tensor inputs are supported "
                                   f"(got {t.WhichOneof('value')})")
        dtype = DType.from_onnx(t.tensor_type.elem_type)
        if dtype is None:
            raise UnsupportedError(f"graph input '{vi.name}': "
                                   f"{_type_name(t.tensor_type.elem_type)} is not supported; "
                                   f"supported: {_DTYPES}")
        if not t.tensor_type.HasField("shape"):
            raise UnsupportedError(f"graph input '{vi.name}' has no shape; static shapes are "
                                   f"required")
        shape = []
        for k, d in enumerate(t.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                if d.dim_value < 0:
                    raise InvalidModelError(f"graph input '{vi.name}': dimension {k} is "
                                            f"{d.dim_value} (shape {_dims(t.tensor_type)}); "
                                            f"expected a size >= 0, or a name for a symbolic "
                                            f"leading dimension")
                shape.append(int(d.dim_value))
            elif k == 0:
                shape.append(self.batch_size)
            else:
                raise UnsupportedError(f"graph input '{vi.name}': dimension {k} "
                                       f"'{d.dim_param}' is symbolic; only the leading (batch) "
                                       f"dimension may be, and it is fixed to batch_size")
        return dtype, tuple(shape)

    def _onnx_value_infos(self, inputs: list[Node]) -> dict[str, tuple[int, tuple[int, ...]]]:
        """ONNX's own shape inference with the batch dimension fixed: (elem_type, shape) of every
        value it can infer statically. Used to cross-check the IR's type rules."""
        import onnx

        proto, _ = without_large_initializers(self.proto)  # over 2 GB, it cannot be serialised
        fixed = {n.name: n.shape for n in inputs}
        for vi in proto.graph.input:
            if vi.name in fixed:
                for d, size in zip(vi.type.tensor_type.shape.dim, fixed[vi.name], strict=True):
                    d.dim_value = size
        # Not strict: ONNX cannot infer through some function bodies; those values go unchecked.
        try:
            proto = onnx.shape_inference.infer_shapes(proto)
        except onnx.shape_inference.InferenceError as e:
            raise InvalidModelError(f"ONNX shape inference rejects the model: {e}") from None
        out = {}
        for vi in [*proto.graph.value_info, *proto.graph.output]:
            t = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and t.HasField("shape") and all(
                    d.HasField("dim_value") for d in t.shape.dim):
                out[vi.name] = (t.elem_type, tuple(int(d.dim_value) for d in t.shape.dim))
        return out

    def fold(self, node: Node) -> np.ndarray | None:
        """The value of node if it depends on constants only, else None."""
        if id(node) in self._folded:
            return self._folded[id(node)]
        sub = topological_order((node,))
        if any(n.op is Op.INPUT for n in sub):
            self._folded[id(node)] = None
            return None
        vals: dict[int, np.ndarray] = {}
        for n in sub:
            vals[id(n)] = evaluate(n, [vals[id(s)] for s in n.src])
        self._folded[id(node)] = vals[id(node)]
        return vals[id(node)]

    def _node(self, index: int, p: Any) -> None:
        from onnx import helper

        ctx = _Ctx(self, p, index)
        contrib = p.domain == ms_ops.DOMAIN and p.op_type in ms_ops.OPERATORS
        if p.domain == ms_ops.DOMAIN and not contrib:
            raise ctx.fail(f"operator '{p.op_type}' of domain '{p.domain}' is not supported; "
                           f"supported in that domain: {', '.join(sorted(ms_ops.OPERATORS))} "
                           f"(onnxruntime's quantised operators)")
        if p.domain not in _DEFAULT_DOMAINS and not contrib:
            raise ctx.fail(f"domain '{p.domain}' is not supported; supported: the default "
                           f"ONNX domain ('' / 'ai.onnx')")
        for name in p.input:
            if name and name not in self.env:
                raise InvalidModelError(f"{ctx.where}: input '{name}' is not defined before it")
        if contrib:
            self._contrib(ctx)
            return
        handler = HANDLERS.get(p.op_type)
        if handler is None:
            self._expand(ctx)
            return
        for a in p.attribute:
            if a.ref_attr_name:
                raise ctx.fail(f"attribute '{a.name}' refers to a function attribute")
            ctx.attrs[a.name] = helper.get_attribute_value(a)
        outs = list(handler(ctx))
        for k, name in enumerate(p.output):
            if not name:
                continue
            if k >= len(outs):
                raise ctx.fail(f"output {k} '{name}' is not supported (only the first "
                               f"{len(outs)} output(s) of {p.op_type})")
            self.env[name] = outs[k]
            declared = self.declared.get(name)
            if declared is not None and not _agrees(declared, outs[k]):
                where = "the graph's outputs" if name in self.output_names else "value_info"
                raise InvalidModelError(f"{ctx.where}: output '{name}' is declared as "
                                        f"{_tensor_str(declared)} (in {where}), but the node "
                                        f"computes {_node_str(outs[k])} from its inputs")
            theirs = self.inferred.get(name)
            ours = (outs[k].dtype.onnx, outs[k].shape)
            if theirs is not None and theirs != ours:
                raise AssertionError(f"{ctx.where}: output '{name}' imported as {ours} (elem_type,"
                                     f" shape) but ONNX shape inference gives {theirs}")


    def _contrib(self, ctx: _Ctx) -> None:
        """Import an onnxruntime contrib operator as the standard nodes of its QDQ form (see
        `ms_ops`), which `rewrite_qdq` then makes integer."""
        from onnx import helper

        p = ctx.proto
        attrs = {a.name: helper.get_attribute_value(a) for a in p.attribute}
        body = ms_ops.expand(p, attrs, ctx.where, lambda name: self.env[name])
        form = " -> ".join(inner.op_type for inner in body if inner.op_type != "Constant")
        for inner in body[:-1]:
            if inner.output[0] in self.env:
                raise ctx.fail(f"imported as {form}, whose tensor '{inner.output[0]}' is a "
                               f"name the model already uses")
        self._import_body(ctx, body, f"imported as {form}")

    def _import_body(self, ctx: _Ctx, body: Any, how: str) -> None:
        """Import the nodes `body` stands for `ctx`'s node with; a failure names the node and
        `how` it was imported."""
        for k, inner in enumerate(body):
            try:
                self._node(k, inner)
            except NonConstantError:
                raise
            except UnsupportedError as e:
                raise ctx.fail(f"{how}, and that failed: {e}") from None

    def _expand(self, ctx: _Ctx) -> None:
        """Import an operator that has no handler through its ONNX function body."""
        p = ctx.proto
        types = [tensor_type(self.env[n].dtype.onnx, self.env[n].shape) if n else None
                 for n in p.input]
        body = function_body(p, self.opset, types)
        if body is None:
            raise ctx.fail(f"operator '{p.op_type}' is not supported; supported operators: "
                           f"{', '.join(sorted(HANDLERS))}, and operators that ONNX defines "
                           f"by a function of these")
        self._import_body(ctx, body, f"operator '{p.op_type}' is imported through its ONNX "
                                     f"function body")
        for k, name in enumerate(p.output):
            if name and name not in self.env:
                raise ctx.fail(f"output {k} '{name}' is not computed by the function body")


def _type_name(elem_type: int) -> str:
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"element type {elem_type}"


_DTYPES = ", ".join(d.name.lower() for d in DType)


def _check_shape(what: str, dtype: DType, shape: Sequence[int]) -> None:
    """A tensor of this dtype and shape can exist: no negative dimension, at most
    MAX_TENSOR_BYTES (computed with Python ints, which do not overflow)."""
    if any(d < 0 for d in shape):
        raise InvalidModelError(f"{what}: shape {list(shape)} has a negative dimension; "
                                f"expected sizes >= 0")
    size_bytes = math.prod(shape) * dtype.size_bytes
    if size_bytes > MAX_TENSOR_BYTES:
        raise TensorTooLargeError(f"{what}: {dtype.name.lower()}{list(shape)} would take "
                                  f"{_bytes_str(size_bytes)} ({size_bytes} bytes); expected at "
                                  f"most {_bytes_str(MAX_TENSOR_BYTES)} ({MAX_TENSOR_BYTES} "
                                  f"bytes) per tensor", size_bytes)


def _bytes_str(n: int) -> str:
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _stored_elements(t: Any, dtype: DType) -> tuple[int, str]:
    """How many elements the data of TensorProto t holds (-1: not a whole number), and that
    said in words ("its raw_data holds 24 bytes = 6 elements")."""
    from onnx import helper

    if t.HasField("raw_data"):
        n_bytes, size = len(t.raw_data), dtype.size_bytes
        if n_bytes % size:
            return -1, (f"its raw_data holds {n_bytes} bytes, not a whole number of "
                        f"{size}-byte elements")
        return n_bytes // size, f"its raw_data holds {n_bytes} bytes = {n_bytes // size} elements"
    field_name = helper.tensor_dtype_to_field(t.data_type)
    n = len(getattr(t, field_name))
    return n, f"its {field_name} holds {n} elements"


def _tensor_value(t: Any, what: str, dtype: DType) -> np.ndarray:
    """The value of TensorProto t (an initializer, a Constant's value) after checking that its
    dims are sizes and that its data fills them exactly."""
    from onnx import numpy_helper

    dims = [int(d) for d in t.dims]
    _check_shape(what, dtype, dims)
    stored, held = _stored_elements(t, dtype)
    if stored != math.prod(dims):
        raise InvalidModelError(f"{what}: dims {dims} need {math.prod(dims)} "
                                f"{dtype.name.lower()} elements, but {held}")
    return numpy_helper.to_array(t)


def _tensor_str(t: Any) -> str:
    """A TypeProto.Tensor as dtype[dims], a symbolic dimension by its name ('?' unnamed)."""
    dtype = DType.from_onnx(t.elem_type)
    name = dtype.name.lower() if dtype is not None else _type_name(t.elem_type)
    return f"{name}{_dims(t)}"


def _dims(t: Any) -> str:
    if not t.HasField("shape"):
        return "[unknown shape]"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
            for d in t.shape.dim]
    return f"[{', '.join(dims)}]"


def _node_str(node: Node) -> str:
    return f"{node.dtype.name.lower()}{list(node.shape)}"


def _agrees(t: Any, node: Node) -> bool:
    """node's dtype and shape fit a declared TypeProto.Tensor (no elem_type or no shape declares
    nothing; a symbolic dimension fits any size)."""
    if t.elem_type and t.elem_type != node.dtype.onnx:
        return False
    if not t.HasField("shape"):
        return True
    dims = t.shape.dim
    return len(dims) == len(node.shape) and all(
        not d.HasField("dim_value") or d.dim_value == size for d, size in zip(dims, node.shape))


def _check_default(vi: Any, value: Node) -> None:
    """An initializer named like graph input vi gives its default value: it must have the type
    the input declares."""
    t = vi.type
    if t.HasField("tensor_type") and not _agrees(t.tensor_type, value):
        raise InvalidModelError(f"graph input '{vi.name}' is declared as "
                                f"{_tensor_str(t.tensor_type)}, but the initializer of the same "
                                f"name (its default value) is {_node_str(value)}; expected the "
                                f"type the input declares")

HANDLERS: dict[str, Handler] = {}


def _handles(*names: str) -> Callable[[Handler], Handler]:
    def register(f: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = f
        return f
    return register


def _check_dtype(ctx: _Ctx, node: Node, allowed: Sequence[DType], what: str = "input") -> None:
    if node.dtype not in allowed:
        raise ctx.fail(f"{what} dtype {node.dtype.name.lower()} is not supported; supported: "
                       f"{', '.join(d.name.lower() for d in allowed)}")


# -- elementwise ------------------------------------------------------------------------------

_UNARY = {
    "Identity": Op.IDENTITY, "Relu": Op.RELU, "Sigmoid": Op.SIGMOID, "Tanh": Op.TANH,
    "Exp": Op.EXP, "Log": Op.LOG, "Sqrt": Op.SQRT, "Erf": Op.ERF, "Neg": Op.NEG, "Abs": Op.ABS,
    "Reciprocal": Op.RECIPROCAL, "Floor": Op.FLOOR, "Ceil": Op.CEIL, "Round": Op.ROUND,
    "Sin": Op.SIN, "Cos": Op.COS, "Tan": Op.TAN, "Asin": Op.ASIN, "Acos": Op.ACOS,
    "Atan": Op.ATAN, "Sinh": Op.SINH, "Cosh": Op.COSH, "Asinh": Op.ASINH, "Acosh": Op.ACOSH,
    "Atanh": Op.ATANH, "Sign": Op.SIGN, "Not": Op.NOT, "Softplus": Op.SOFTPLUS,
    "Softsign": Op.SOFTSIGN, "HardSwish": Op.HARD_SWISH, "Mish": Op.MISH, "IsNaN": Op.ISNAN,
    "BitwiseNot": Op.BITWISE_NOT,
}


@_handles(*_UNARY)
def _unary(ctx: _Ctx) -> list[Node]:
    return [ctx.make(_UNARY[ctx.proto.op_type], [ctx.inp(0)])]


@_handles("Dropout")
def _dropout(ctx: _Ctx) -> list[Node]:
    if ctx.has(2) and bool(ctx.value(2)):
        raise ctx.fail("training_mode=True is not supported (inference only)")
    x = ctx.inp(0)
    mask = ctx.proto.output[1] if len(ctx.proto.output) > 1 else ""
    # In inference Dropout keeps every element: the optional mask is all true.
    return [ctx.make(Op.IDENTITY, [x]), const(np.ones(x.shape, np.bool_), name=mask)]


@_handles("LeakyRelu", "Elu", "Celu", "ThresholdedRelu", "Selu", "HardSigmoid", "Gelu")
def _activation(ctx: _Ctx) -> list[Node]:
    t, x = ctx.proto.op_type, ctx.inp(0)
    if t == "Selu":
        return [ctx.make(Op.SELU, [x], o.SeluAttrs(
            ctx.attr("alpha", 1.67326319217681884765625),
            ctx.attr("gamma", 1.05070102214813232421875)))]
    if t == "HardSigmoid":
        return [ctx.make(Op.HARD_SIGMOID, [x], o.HardSigmoidAttrs(ctx.attr("alpha", 0.2),
                                                                  ctx.attr("beta", 0.5)))]
    if t == "Gelu":
        approx = ctx.attr("approximate", b"none")
        approx = approx.decode() if isinstance(approx, bytes) else approx
        if approx not in ("none", "tanh"):
            raise ctx.fail(f"approximate='{approx}' is not supported; supported: none, tanh")
        return [ctx.make(Op.GELU, [x], o.GeluAttrs(approx))]
    op, alpha = {"LeakyRelu": (Op.LEAKY_RELU, 0.01), "Elu": (Op.ELU, 1.0),
                 "Celu": (Op.CELU, 1.0), "ThresholdedRelu": (Op.THRESHOLDED_RELU, 1.0)}[t]
    return [ctx.make(op, [x], o.AlphaAttrs(float(ctx.attr("alpha", alpha))))]


@_handles("Clip")
def _clip(ctx: _Ctx) -> list[Node]:
    lo = ctx.value(1).item() if ctx.has(1) else None
    hi = ctx.value(2).item() if ctx.has(2) else None
    return [ctx.make(Op.CLIP, [ctx.inp(0)], o.ClipAttrs(lo, hi))]


_BINARY = {
    "Add": Op.ADD, "Sub": Op.SUB, "Mul": Op.MUL, "Div": Op.DIV, "Pow": Op.POW,
    "Equal": Op.EQUAL, "Less": Op.LESS, "Greater": Op.GREATER, "LessOrEqual": Op.LESS_EQUAL,
    "GreaterOrEqual": Op.GREATER_EQUAL, "And": Op.AND, "Or": Op.OR, "Xor": Op.XOR,
    "PRelu": Op.PRELU, "BitwiseAnd": Op.BITWISE_AND, "BitwiseOr": Op.BITWISE_OR,
    "BitwiseXor": Op.BITWISE_XOR,
}


@_handles(*_BINARY)
def _binary(ctx: _Ctx) -> list[Node]:
    return [ctx.make(_BINARY[ctx.proto.op_type], [ctx.inp(0), ctx.inp(1)])]


@_handles("Mod")
def _mod(ctx: _Ctx) -> list[Node]:
    return [ctx.make(Op.MOD, [ctx.inp(0), ctx.inp(1)], o.ModAttrs(bool(ctx.attr("fmod", 0))))]


@_handles("Max", "Min", "Sum", "Mean")
def _variadic(ctx: _Ctx) -> list[Node]:
    t = ctx.proto.op_type
    op = {"Max": Op.MAX, "Min": Op.MIN, "Sum": Op.ADD, "Mean": Op.ADD}[t]
    xs = [ctx.inp(k) for k in range(ctx.n_in)]
    acc = xs[0]
    for k, x in enumerate(xs[1:]):
        last = k == len(xs) - 2 and t != "Mean"
        acc = ctx.make(op, [acc, x], name="" if not last else ctx.proto.output[0])
    if len(xs) == 1:
        acc = ctx.make(Op.IDENTITY, [acc])
    if t == "Mean":
        acc = ctx.make(Op.DIV, [acc, const(len(xs), dtype=acc.dtype)])
    return [acc]


@_handles("Where")
def _where(ctx: _Ctx) -> list[Node]:
    return [ctx.make(Op.WHERE, [ctx.inp(0), ctx.inp(1), ctx.inp(2)])]


@_handles("Cast", "CastLike")
def _cast(ctx: _Ctx) -> list[Node]:
    if ctx.proto.op_type == "CastLike":
        dtype: DType | None = ctx.inp(1).dtype
    else:
        to = int(ctx.attr("to"))
        dtype = DType.from_onnx(to)
        if dtype is None:
            raise ctx.fail(f"cast to {_type_name(to)} is not supported; supported: {_DTYPES}")
    return [ctx.make(Op.CAST, [ctx.inp(0)], dtype=dtype)]


# -- linear algebra, convolution, pooling, normalisation ----------------------------------------

@_handles("MatMul")
def _matmul(ctx: _Ctx) -> list[Node]:
    return [ctx.make(Op.MATMUL, [ctx.inp(0), ctx.inp(1)])]


@_handles("Gemm")
def _gemm(ctx: _Ctx) -> list[Node]:
    a = o.GemmAttrs(float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0)),
                    bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0)))
    src = [ctx.inp(0), ctx.inp(1)]
    if ctx.has(2) and a.beta != 0:
        src.append(ctx.inp(2))
    return [ctx.make(Op.GEMM, src, a)]


def _window_attrs(ctx: _Ctx, x: Node, kernel: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """(strides, pads, dilations) of a conv/pool node, with auto_pad resolved."""
    nsp = len(kernel)
    strides = tuple(ctx.attr("strides", [1] * nsp))
    dil = tuple(ctx.attr("dilations", [1] * nsp))
    pads = tuple(ctx.attr("pads", [0] * (2 * nsp)))
    auto = ctx.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nsp):
            size, s = x.shape[2 + i], strides[i]
            out = -(-size // s)
            total = max(0, (out - 1) * s + (kernel[i] - 1) * dil[i] + 1 - size)
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        pads = (*begin, *end)
    elif auto == "VALID":
        pads = (0,) * (2 * nsp)
    elif auto != "NOTSET":
        raise ctx.fail(f"auto_pad='{auto}' is not supported; supported: NOTSET, SAME_UPPER, "
                       f"SAME_LOWER, VALID")
    if len(strides) != nsp or len(dil) != nsp or len(pads) != 2 * nsp:
        raise InvalidModelError(f"{ctx.where}: strides {strides}, pads {pads}, dilations {dil} "
                                f"do not match {nsp} spatial axes")
    return strides, pads, dil


def _conv_attrs(ctx: _Ctx, x: Node, w: Node) -> o.ConvAttrs:
    if x.rank < 3:
        raise ctx.fail(f"input of rank {x.rank}; supported: N, C, *spatial (rank >= 3)")
    kernel = tuple(ctx.attr("kernel_shape", w.shape[2:]))
    strides, pads, dil = _window_attrs(ctx, x, kernel)
    return o.ConvAttrs(kernel, strides, pads, dil, int(ctx.attr("group", 1)))


@_handles("Conv")
def _conv(ctx: _Ctx) -> list[Node]:
    x, w = ctx.inp(0), ctx.inp(1)
    src = [x, w] + ([ctx.inp(2)] if ctx.has(2) else [])
    return [ctx.make(Op.CONV, src, _conv_attrs(ctx, x, w))]


@_handles("ConvTranspose")
def _conv_transpose(ctx: _Ctx) -> list[Node]:
    x, w = ctx.inp(0), ctx.inp(1)
    if x.rank < 3:
        raise ctx.fail(f"input of rank {x.rank}; supported: N, C, *spatial (rank >= 3)")
    nsp = x.rank - 2
    kernel = tuple(ctx.attr("kernel_shape", w.shape[2:]))
    strides = tuple(ctx.attr("strides", [1] * nsp))
    dil = tuple(ctx.attr("dilations", [1] * nsp))
    out_pad = tuple(ctx.attr("output_padding", [0] * nsp))
    pads = tuple(ctx.attr("pads", [0] * (2 * nsp)))
    auto = ctx.attr("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    full = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1
            for i in range(nsp)]
    target = ctx.attr("output_shape")
    if target is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        target = [x.shape[2 + i] * strides[i] for i in range(nsp)]
    if target is not None:
        target = list(target)[-nsp:]
        total = [full[i] - target[i] for i in range(nsp)]
        # An output_shape beyond the full output extends it at the end, like output_padding.
        out_pad = tuple(p + max(0, -t) for p, t in zip(out_pad, total, strict=True))
        total = [max(0, t) for t in total]
        # SAME_UPPER puts the extra padding at the beginning for ConvTranspose.
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        pads = (*begin, *(t - b for t, b in zip(total, begin, strict=True)))
    elif auto == "VALID":
        pads = (0,) * (2 * nsp)
    elif auto != "NOTSET":
        raise ctx.fail(f"auto_pad='{auto}' is not supported; supported: NOTSET, SAME_UPPER, "
                       f"SAME_LOWER, VALID")
    a = o.ConvTransposeAttrs(kernel, strides, tuple(pads), dil, out_pad,
                             int(ctx.attr("group", 1)))
    return [ctx.make(Op.CONV_TRANSPOSE, [x, w] + ([ctx.inp(2)] if ctx.has(2) else []), a)]


def _zero_point(ctx: _Ctx, k: int, like: Node) -> Node:
    return ctx.inp(k) if ctx.has(k) else const(0, dtype=like.dtype)


@_handles("ConvInteger")
def _conv_integer(ctx: _Ctx) -> list[Node]:
    x, w = ctx.inp(0), ctx.inp(1)
    src = [x, w, _zero_point(ctx, 2, x), _zero_point(ctx, 3, w)]
    return [ctx.make(Op.CONV_INTEGER, src, _conv_attrs(ctx, x, w))]


@_handles("MatMulInteger")
def _matmul_integer(ctx: _Ctx) -> list[Node]:
    a, b = ctx.inp(0), ctx.inp(1)
    return [ctx.make(Op.MATMUL_INTEGER, [a, b, _zero_point(ctx, 2, a), _zero_point(ctx, 3, b)])]


@_handles("QLinearConv")
def _qlinear_conv(ctx: _Ctx) -> list[Node]:
    src = [ctx.inp(k) for k in range(8)] + ([ctx.inp(8)] if ctx.has(8) else [])
    return [ctx.make(Op.QLINEAR_CONV, src, _conv_attrs(ctx, src[0], src[3]))]


@_handles("QLinearMatMul")
def _qlinear_matmul(ctx: _Ctx) -> list[Node]:
    return [ctx.make(Op.QLINEAR_MATMUL, [ctx.inp(k) for k in range(8)])]


@_handles("QuantizeLinear")
def _quantize(ctx: _Ctx) -> list[Node]:
    x, scale = ctx.inp(0), ctx.inp(1)
    if ctx.attr("block_size", 0):
        raise ctx.fail("blocked quantisation (block_size > 0) is not supported")
    out_dtype = ctx.attr("output_dtype", 0)
    if ctx.has(2):
        zp = ctx.inp(2)
    else:
        dtype = DType.from_onnx(out_dtype) if out_dtype else DType.UINT8
        if dtype is None:
            raise ctx.fail(f"output_dtype {_type_name(out_dtype)} is not supported")
        zp = const(np.zeros(scale.shape, dtype.np))
    _check_dtype(ctx, zp, (DType.INT8, DType.UINT8, DType.INT16, DType.UINT16, DType.INT32),
                 "zero point")
    scale, zp = _one_scale(scale), _one_scale(zp)
    axis = ctx.axis(ctx.attr("axis", 1), x.rank) if scale.rank else 0
    return [ctx.make(Op.QUANTIZE_LINEAR, [x, scale, zp], o.AxisAttrs(axis))]


def _one_scale(v: Node) -> Node:
    """A quantisation parameter of one element as a scalar: onnxruntime's quantiser writes
    per-tensor scales as [1] next to scalar zero points, with no axis."""
    if v.shape != (1,):
        return v
    if v.op is Op.CONST:
        return const(v.value.reshape(()), name=v.name)
    return Node(Op.RESHAPE, v.dtype, (), (v,), name=v.name)


@_handles("DequantizeLinear")
def _dequantize(ctx: _Ctx) -> list[Node]:
    x, scale = ctx.inp(0), ctx.inp(1)
    if ctx.attr("block_size", 0):
        raise ctx.fail("blocked quantisation (block_size > 0) is not supported")
    _check_dtype(ctx, x, (DType.INT8, DType.UINT8, DType.INT16, DType.UINT16, DType.INT32))
    zp = ctx.inp(2) if ctx.has(2) else const(np.zeros(scale.shape, x.dtype.np))
    scale, zp = _one_scale(scale), _one_scale(zp)
    axis = ctx.axis(ctx.attr("axis", 1), x.rank) if scale.rank else 0
    return [ctx.make(Op.DEQUANTIZE_LINEAR, [x, scale, zp], o.AxisAttrs(axis))]


@_handles("MaxPool", "AveragePool")
def _pool(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    if x.rank < 3:
        raise ctx.fail(f"input of rank {x.rank}; supported: N, C, *spatial (rank >= 3)")
    kernel = tuple(ctx.attr("kernel_shape"))
    strides, pads, dil = _window_attrs(ctx, x, kernel)
    a = o.PoolAttrs(kernel, strides, pads, dil, bool(ctx.attr("ceil_mode", 0)),
                    bool(ctx.attr("count_include_pad", 0)))
    op = Op.MAX_POOL if ctx.proto.op_type == "MaxPool" else Op.AVG_POOL
    y = ctx.make(op, [x], a)
    if op is Op.AVG_POOL or len(ctx.proto.output) < 2:
        return [y]
    a = dataclasses.replace(a, column_major=bool(ctx.attr("storage_order", 0)))
    return [y, ctx.make(Op.MAX_POOL_INDEX, [x], a, name=ctx.proto.output[1])]


@_handles("Col2Im")
def _col2im(ctx: _Ctx) -> list[Node]:
    x, image, block = ctx.inp(0), ctx.ints(1), ctx.ints(2)
    nsp = len(image)
    a = o.ConvAttrs(tuple(block), tuple(ctx.attr("strides", [1] * nsp)),
                    tuple(ctx.attr("pads", [0] * (2 * nsp))),
                    tuple(ctx.attr("dilations", [1] * nsp)))
    c = x.shape[1] // max(1, math.prod(block))
    return [ctx.make(Op.COL2IM, [x], a, shape=(x.shape[0], c, *image))]


@_handles("LpPool")
def _lp_pool(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    if x.rank < 3:
        raise ctx.fail(f"input of rank {x.rank}; supported: N, C, *spatial (rank >= 3)")
    kernel = tuple(ctx.attr("kernel_shape"))
    strides, pads, dil = _window_attrs(ctx, x, kernel)
    pool = o.PoolAttrs(kernel, strides, pads, dil, bool(ctx.attr("ceil_mode", 0)))
    return [ctx.make(Op.LP_POOL, [x], o.LpPoolAttrs(pool, int(ctx.attr("p", 2))))]


@_handles("LRN")
def _lrn(ctx: _Ctx) -> list[Node]:
    a = o.LrnAttrs(int(ctx.attr("size")), float(ctx.attr("alpha", 1e-4)),
                   float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0)))
    return [ctx.make(Op.LRN, [ctx.inp(0)], a)]


@_handles("Einsum")
def _einsum(ctx: _Ctx) -> list[Node]:
    eq = ctx.attr("equation")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    xs = [ctx.inp(k) for k in range(ctx.n_in)]
    return [ctx.make(Op.EINSUM, xs, o.EinsumAttrs(eq))]


@_handles("Det")
def _det(ctx: _Ctx) -> list[Node]:
    return [ctx.make(Op.DET, [ctx.inp(0)])]


@_handles("ReverseSequence")
def _reverse_sequence(ctx: _Ctx) -> list[Node]:
    a = o.ReverseSequenceAttrs(int(ctx.attr("batch_axis", 1)), int(ctx.attr("time_axis", 0)))
    return [ctx.make(Op.REVERSE_SEQUENCE, [ctx.inp(0), ctx.inp(1)], a)]


@_handles("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: _Ctx) -> list[Node]:
    op = Op.GLOBAL_AVG_POOL if ctx.proto.op_type == "GlobalAveragePool" else Op.GLOBAL_MAX_POOL
    return [ctx.make(op, [ctx.inp(0)])]


@_handles("BatchNormalization")
def _batch_norm(ctx: _Ctx) -> list[Node]:
    if ctx.attr("training_mode", 0):
        raise ctx.fail("training_mode=1 is not supported (inference only)")
    src = [ctx.inp(k) for k in range(5)]
    if any(s.dtype is not src[0].dtype for s in src[1:]):
        src = src[:1] + [ctx.make(Op.CAST, [s], dtype=src[0].dtype, name="") for s in src[1:]]
    return [ctx.make(Op.BATCH_NORM, src, o.EpsilonAttrs(float(ctx.attr("epsilon", 1e-5))))]


@_handles("LayerNormalization")
def _layer_norm(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    src = [x, ctx.inp(1)] + ([ctx.inp(2)] if ctx.has(2) else [])
    axis = ctx.axis(ctx.attr("axis", -1), x.rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    y = ctx.make(Op.LAYER_NORM, src, o.EpsilonAttrs(eps, axis))
    if len(ctx.proto.output) == 1:
        return [y]
    # The optional Mean and InvStdDev outputs (float32 statistics, keepdims) as plain ops.
    if x.dtype is not DType.FLOAT32:
        x = ctx.make(Op.CAST, [x], dtype=DType.FLOAT32, name="")
    axes = o.ReduceAttrs(tuple(range(axis, x.rank)))
    names = list(ctx.proto.output) + ["", ""]
    mean = ctx.make(Op.REDUCE_MEAN, [x], axes, name=names[1])
    d = ctx.make(Op.SUB, [x, mean], name="")
    var = ctx.make(Op.REDUCE_MEAN, [ctx.make(Op.MUL, [d, d], name="")], axes, name="")
    std = ctx.make(Op.SQRT, [ctx.make(Op.ADD, [var, const(np.float32(eps))], name="")], name="")
    return [y, mean, ctx.make(Op.RECIPROCAL, [std], name=names[2])]


@_handles("RMSNormalization")
def _rms_norm(ctx: _Ctx) -> list[Node]:
    x, scale = ctx.inp(0), ctx.inp(1)
    axis = ctx.axis(ctx.attr("axis", -1), x.rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    xf = ctx.make(Op.CAST, [x], dtype=DType.FLOAT32, name="") if x.dtype.size_bytes < 4 else x
    ms = ctx.make(Op.REDUCE_MEAN, [ctx.make(Op.MUL, [xf, xf], name="")],
                  o.ReduceAttrs(tuple(range(axis, x.rank))), name="")
    rms = ctx.make(Op.SQRT, [ctx.make(Op.ADD, [ms, const(eps, dtype=xf.dtype)], name="")],
                   name="")
    y = ctx.make(Op.DIV, [xf, rms], name="")
    if y.dtype is not x.dtype:
        y = ctx.make(Op.CAST, [y], dtype=x.dtype, name="")
    return [ctx.make(Op.MUL, [y, scale])]


@_handles("InstanceNormalization", "MeanVarianceNormalization")
def _instance_norm(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    if ctx.proto.op_type == "MeanVarianceNormalization":
        axes = tuple(ctx.axis(a, x.rank) for a in ctx.attr("axes", [0, 2, 3]))
        eps = 1e-9
    else:
        axes, eps = tuple(range(2, x.rank)), float(ctx.attr("epsilon", 1e-5))
    red = o.ReduceAttrs(tuple(sorted(axes)))
    d = ctx.make(Op.SUB, [x, ctx.make(Op.REDUCE_MEAN, [x], red, name="")], name="")
    var = ctx.make(Op.REDUCE_MEAN, [ctx.make(Op.MUL, [d, d], name="")], red, name="")
    std = ctx.make(Op.SQRT, [ctx.make(Op.ADD, [var, const(eps, dtype=x.dtype)], name="")],
                   name="")
    if ctx.proto.op_type == "MeanVarianceNormalization":
        return [ctx.make(Op.DIV, [d, std])]
    per_channel = (x.shape[1], *([1] * (x.rank - 2)))
    y = ctx.make(Op.MUL, [ctx.make(Op.DIV, [d, std], name=""),
                          _reshape_to(ctx, ctx.inp(1), per_channel, name="")], name="")
    return [ctx.make(Op.ADD, [y, _reshape_to(ctx, ctx.inp(2), per_channel, name="")])]


@_handles("LpNormalization")
def _lp_norm(ctx: _Ctx) -> list[Node]:
    x, p = ctx.inp(0), int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.fail(f"p={p} is not supported; supported: 1, 2")
    axis = ctx.axis(ctx.attr("axis", -1), x.rank)
    norm = ctx.make(Op.REDUCE_L1 if p == 1 else Op.REDUCE_L2, [x], o.ReduceAttrs((axis,)),
                    name="")
    zero = ctx.make(Op.EQUAL, [norm, const(0, dtype=x.dtype)], name="")
    norm = ctx.make(Op.WHERE, [zero, const(1, dtype=x.dtype), norm], name="")  # 0 / 0 -> 0
    return [ctx.make(Op.DIV, [x, norm])]


@_handles("Swish")
def _swish(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    ax = ctx.make(Op.MUL, [x, const(ctx.attr("alpha", 1.0), dtype=x.dtype)], name="")
    return [ctx.make(Op.MUL, [x, ctx.make(Op.SIGMOID, [ax], name="")])]


@_handles("BitShift")
def _bit_shift(ctx: _Ctx) -> list[Node]:
    d = ctx.attr("direction", b"")
    d = d.decode() if isinstance(d, bytes) else d
    if d not in ("LEFT", "RIGHT"):
        raise InvalidModelError(f"{ctx.where}: direction '{d}', expected LEFT or RIGHT")
    return [ctx.make(Op.SHL if d == "LEFT" else Op.SHR, [ctx.inp(0), ctx.inp(1)])]


@_handles("IsInf")
def _isinf(ctx: _Ctx) -> list[Node]:
    a = o.IsInfAttrs(bool(ctx.attr("detect_positive", 1)), bool(ctx.attr("detect_negative", 1)))
    return [ctx.make(Op.ISINF, [ctx.inp(0)], a)]


@_handles("Trilu")
def _trilu(ctx: _Ctx) -> list[Node]:
    k = int(ctx.value(1).item()) if ctx.has(1) else 0
    return [ctx.make(Op.TRILU, [ctx.inp(0)], o.TriluAttrs(bool(ctx.attr("upper", 1)), k))]


@_handles("GatherElements")
def _gather_elements(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    return [ctx.make(Op.GATHER_ELEMENTS, [x, ctx.inp(1)],
                     o.AxisAttrs(ctx.axis(ctx.attr("axis", 0), x.rank)))]


@_handles("CumSum", "CumProd")
def _cumulative(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    a = o.CumAttrs(ctx.axis(int(ctx.value(1).item()), x.rank), bool(ctx.attr("exclusive", 0)),
                   bool(ctx.attr("reverse", 0)))
    return [ctx.make(Op.CUMSUM if ctx.proto.op_type == "CumSum" else Op.CUMPROD, [x], a)]


@_handles("TopK")
def _topk(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)  # sorted=0 allows any order; the sorted order is one of them
    axis = ctx.axis(ctx.attr("axis", -1), x.rank)
    a = o.TopKAttrs(axis, int(ctx.value(1).reshape(-1)[0]), bool(ctx.attr("largest", 1)))
    names = list(ctx.proto.output) + [""]
    idx = ctx.make(Op.TOPK, [x], a, name=names[1])
    return [ctx.make(Op.GATHER_ELEMENTS, [x, idx], o.AxisAttrs(axis), name=names[0]), idx]


@_handles("ScatterElements", "ScatterND")
def _scatter(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    red = ctx.attr("reduction", b"none")
    red = red.decode() if isinstance(red, bytes) else red
    if ctx.proto.op_type == "ScatterND":
        return [ctx.make(Op.SCATTER_ND, [x, ctx.inp(1), ctx.inp(2)], o.ScatterAttrs(0, red))]
    a = o.ScatterAttrs(ctx.axis(ctx.attr("axis", 0), x.rank), red)
    return [ctx.make(Op.SCATTER_ELEMENTS, [x, ctx.inp(1), ctx.inp(2)], a)]


@_handles("Resize")
def _resize(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in ctx.attrs.items()}
    if ctx.attr("antialias", 0):
        raise ctx.fail("antialias=1 is not supported; supported: antialias=0")
    axes = [ctx.axis(a, x.rank) for a in ctx.attr("axes", range(x.rank))]
    scales_in = [float(v) for v in ctx.value(2).reshape(-1)] if ctx.has(2) else []
    sizes_in = ctx.ints(3) if ctx.has(3) else []
    scales = [1.0] * x.rank
    shape = list(x.shape)
    if scales_in:
        for a, s in zip(axes, scales_in, strict=True):
            scales[a], shape[a] = s, int(np.floor(x.shape[a] * s))
    elif sizes_in:
        ratios = [size / x.shape[a] for a, size in zip(axes, sizes_in, strict=True)]
        policy = text.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(axes)
            sizes_in = [int(np.floor(x.shape[a] * common + 0.5)) for a in axes]
        for a, r, size in zip(axes, ratios, sizes_in, strict=True):
            scales[a], shape[a] = r, size
    else:
        raise InvalidModelError(f"{ctx.where}: neither scales nor sizes is given")
    roi: tuple[float, ...] = ()
    coordinate_mode = text.get("coordinate_transformation_mode", "half_pixel")
    if coordinate_mode == "tf_crop_and_resize":
        given = [float(v) for v in ctx.value(1).reshape(-1)]
        full = [0.0] * x.rank + [1.0] * x.rank
        for i, a in enumerate(axes):
            full[a], full[x.rank + a] = given[i], given[len(axes) + i]
        roi = tuple(full)
    nearest_mode = text.get("nearest_mode", "round_prefer_floor")
    if ctx.proto.output[0] in ctx.imp.legacy_nearest and any(s < 1 for s in scales):
        # A Resize-10 that downsamples rounds up (onnxruntime); one rounding for all axes.
        if any(s > 1 for s in scales):
            raise ctx.fail(f"scales {scales} both up- and downsample; for a nearest Resize of "
                           f"opset 10 and older, supported: scales all >= 1 or all <= 1")
        nearest_mode = "ceil"
    ra = o.ResizeAttrs(tuple(scales), text.get("mode", "nearest"), coordinate_mode,
                       nearest_mode,
                       float(ctx.attr("cubic_coeff_a", -0.75)),
                       bool(ctx.attr("exclude_outside", 0)), roi,
                       float(ctx.attr("extrapolation_value", 0.0)))
    return [ctx.make(Op.RESIZE, [x], ra, shape=tuple(shape))]


@_handles("GridSample")
def _grid_sample(ctx: _Ctx) -> list[Node]:
    text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in ctx.attrs.items()}
    mode = text.get("mode", "linear" if ctx.imp.opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)  # opset 16 names
    a = o.GridSampleAttrs(mode, text.get("padding_mode", "zeros"),
                          bool(ctx.attr("align_corners", 0)))
    return [ctx.make(Op.GRID_SAMPLE, [ctx.inp(0), ctx.inp(1)], a)]


@_handles("AffineGrid")
def _affine_grid(ctx: _Ctx) -> list[Node]:
    theta, size = ctx.inp(0), ctx.ints(1)
    n, spatial = size[0], size[2:]
    nsp = len(spatial)
    if nsp not in (2, 3) or theta.shape != (n, nsp, nsp + 1):
        raise ctx.fail(f"theta {list(theta.shape)} with size {size}; supported: 2-D or 3-D "
                       f"grids with theta [N, rank, rank + 1]")
    align = bool(ctx.attr("align_corners", 0))

    def axis(d: int) -> np.ndarray:
        steps = np.arange(d, dtype=np.float64)
        if align:
            return steps * 2 / (d - 1) - 1 if d > 1 else np.zeros(1)
        return (steps * 2 + 1) / d - 1

    # Base grid rows (x, y[, z], 1) for every output position, innermost axis first.
    mesh = np.meshgrid(*(axis(d) for d in spatial), indexing="ij")
    base = np.stack([*reversed(mesh), np.ones(spatial)], axis=-1).reshape(1, -1, nsp + 1)
    base_node = const(base.astype(theta.dtype.np))
    theta_t = ctx.make(Op.TRANSPOSE, [theta], o.TransposeAttrs((0, 2, 1)), name="")
    grid = ctx.make(Op.MATMUL, [base_node, theta_t], name="")  # [N, positions, rank]
    return [_reshape_to(ctx, grid, (n, *spatial, nsp))]


@_handles("MaxUnpool")
def _max_unpool(ctx: _Ctx) -> list[Node]:
    x, idx = ctx.inp(0), ctx.inp(1)
    nsp = x.rank - 2
    kernel = list(ctx.attr("kernel_shape"))
    strides = list(ctx.attr("strides", [1] * nsp))
    pads = list(ctx.attr("pads", [0] * (2 * nsp)))
    shape = (*x.shape[:2], *((x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[nsp + i]
                             + kernel[i] for i in range(nsp)))
    # The indices are flat positions in that shape (batch and channel included): scatter the
    # values into a zero vector of its size. An explicit output_shape pads at the end.
    zeros = const(np.zeros(math.prod(shape), x.dtype.np))
    flat_idx = _reshape_to(ctx, idx, (idx.size, 1), name="")
    flat_x = _reshape_to(ctx, x, (x.size,), name="")
    flat = ctx.make(Op.SCATTER_ND, [zeros, flat_idx, flat_x], o.ScatterAttrs(), name="")
    if not ctx.has(2):
        return [_reshape_to(ctx, flat, shape)]
    target = ctx.ints(2)
    extra = [t - s for t, s in zip(target, shape, strict=True)]
    if min(extra) < 0:
        raise InvalidModelError(f"{ctx.where}: output_shape {target} is smaller than {shape}")
    y = _reshape_to(ctx, flat, shape, name="")
    return [ctx.make(Op.PAD, [y], o.PadAttrs((0,) * len(shape) + tuple(extra)))]


@_handles("GatherND")
def _gather_nd(ctx: _Ctx) -> list[Node]:
    a = o.GatherNdAttrs(int(ctx.attr("batch_dims", 0)))
    return [ctx.make(Op.GATHER_ND, [ctx.inp(0), ctx.inp(1)], a)]


@_handles("EyeLike")
def _eye_like(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    if x.rank != 2:
        raise ctx.fail(f"input of rank {x.rank}; supported: rank 2")
    to = ctx.attr("dtype")
    dtype = DType.from_onnx(to) if to is not None else x.dtype
    if dtype is None:
        raise ctx.fail(f"dtype {_type_name(to)} is not supported; supported: {_DTYPES}")
    value = np.eye(x.shape[0], x.shape[1], k=int(ctx.attr("k", 0)), dtype=dtype.np)
    return [const(value, name=ctx.proto.output[0])]


@_handles("OneHot")
def _one_hot(ctx: _Ctx) -> list[Node]:
    idx, values = ctx.inp(0), ctx.inp(2)
    depth = int(ctx.value(1).reshape(-1)[0])
    axis = ctx.axis(ctx.attr("axis", -1), idx.rank + 1)
    if idx.dtype is not DType.INT64:
        idx = ctx.make(Op.CAST, [idx], dtype=DType.INT64, name="")
    # Negative indices count from depth; out-of-range ones match no position (all "off").
    neg = ctx.make(Op.LESS, [idx, const(np.int64(0))], name="")
    idx = ctx.make(Op.WHERE, [neg, ctx.make(Op.ADD, [idx, const(np.int64(depth))], name=""),
                              idx], name="")
    shape = list(idx.shape)
    shape.insert(axis, 1)
    idx = _reshape_to(ctx, idx, shape, name="")
    positions = const(np.arange(depth, dtype=np.int64).reshape(
        [depth if i == axis else 1 for i in range(len(shape))]))
    hot = ctx.make(Op.EQUAL, [idx, positions], name="")
    off, on = (ctx.make(Op.GATHER, [values, const(np.int64(i))], o.AxisAttrs(0), name="")
               for i in (0, 1))
    return [ctx.make(Op.WHERE, [hot, on, off])]


@_handles("GroupNormalization")
def _group_norm(ctx: _Ctx) -> list[Node]:
    x, scale, bias = ctx.inp(0), ctx.inp(1), ctx.inp(2)
    groups, eps = int(ctx.attr("num_groups")), float(ctx.attr("epsilon", 1e-5))
    n, c = x.shape[:2]
    grouped = _reshape_to(ctx, x, (n, groups, x.size // (n * groups)), name="")
    red = o.ReduceAttrs((2,))
    d = ctx.make(Op.SUB, [grouped, ctx.make(Op.REDUCE_MEAN, [grouped], red, name="")], name="")
    var = ctx.make(Op.REDUCE_MEAN, [ctx.make(Op.MUL, [d, d], name="")], red, name="")
    std = ctx.make(Op.SQRT, [ctx.make(Op.ADD, [var, const(eps, dtype=x.dtype)], name="")],
                   name="")
    y = _reshape_to(ctx, ctx.make(Op.DIV, [d, std], name=""), x.shape, name="")
    if scale.shape == (groups,) and groups != c:  # opset 18: one scale per group
        scale, bias = (ctx.make(Op.EXPAND, [_reshape_to(ctx, v, (groups, 1), name="")],
                                shape=(groups, c // groups), name="") for v in (scale, bias))
    per_channel = (c, *([1] * (x.rank - 2)))
    y = ctx.make(Op.MUL, [y, _reshape_to(ctx, scale, per_channel, name="")], name="")
    return [ctx.make(Op.ADD, [y, _reshape_to(ctx, bias, per_channel, name="")])]


@_handles("CenterCropPad")
def _center_crop_pad(ctx: _Ctx) -> list[Node]:
    x, target = ctx.inp(0), ctx.ints(1)
    axes = [ctx.axis(a, x.rank) for a in ctx.attr("axes", range(x.rank))]
    starts, ends, pads = {}, {}, [0] * (2 * x.rank)
    for a, t in zip(axes, target, strict=True):
        size = x.shape[a]
        if size > t:
            starts[a] = (size - t) // 2
            ends[a] = starts[a] + t
        elif size < t:
            pads[a] = (t - size) // 2
            pads[x.rank + a] = t - size - pads[a]
    y = _slice_node(ctx, x, starts, ends, {}, name="")
    return [ctx.make(Op.PAD, [y], o.PadAttrs(tuple(pads)))]


@_handles("Hardmax")
def _hardmax(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    return [ctx.make(Op.HARDMAX, [x], o.AxisAttrs(ctx.axis(ctx.attr("axis", -1), x.rank)))]


@_handles("Softmax", "LogSoftmax")
def _softmax(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    op = Op.SOFTMAX if ctx.proto.op_type == "Softmax" else Op.LOG_SOFTMAX
    return [ctx.make(op, [x], o.AxisAttrs(ctx.axis(ctx.attr("axis", -1), x.rank)))]


# -- data movement --------------------------------------------------------------------------------

def _reshape_to(ctx: _Ctx, x: Node, shape: Sequence[int], name: str = "") -> Node:
    return ctx.make(Op.RESHAPE, [x], shape=tuple(int(d) for d in shape), name=name)


@_handles("Reshape")
def _reshape(ctx: _Ctx) -> list[Node]:
    x, spec = ctx.inp(0), ctx.ints(1)
    allowzero = ctx.attr("allowzero", 0)
    shape = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(spec)]
    if shape.count(-1) > 1:
        raise InvalidModelError(f"{ctx.where}: shape {spec} has more than one -1")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or x.size % known:
            raise InvalidModelError(f"{ctx.where}: cannot reshape {list(x.shape)} to {spec}")
        shape[shape.index(-1)] = x.size // known
    return [_reshape_to(ctx, x, shape)]


@_handles("Flatten")
def _flatten(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    axis = ctx.attr("axis", 1)
    axis = axis + x.rank if axis < 0 else axis
    return [_reshape_to(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


def _axes(ctx: _Ctx, k: int, rank: int) -> list[int] | None:
    """Axes given as input k (opset >= 13) or as the attribute 'axes' (older forms)."""
    if "axes" in ctx.attrs:
        raw = list(ctx.attrs["axes"])
    elif ctx.has(k):
        raw = ctx.ints(k)
    else:
        return None
    return [ctx.axis(a, rank) for a in raw]


@_handles("Squeeze")
def _squeeze(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    axes = _axes(ctx, 1, x.rank)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    if any(x.shape[a] != 1 for a in axes):
        raise InvalidModelError(f"{ctx.where}: cannot squeeze axes {axes} of {list(x.shape)}")
    return [_reshape_to(ctx, x, [d for i, d in enumerate(x.shape) if i not in axes])]


@_handles("Unsqueeze")
def _unsqueeze(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    raw = ctx.ints(1) if ctx.has(1) else list(ctx.attr("axes", []))
    rank = x.rank + len(raw)
    axes = sorted(ctx.axis(a, rank) for a in raw)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [_reshape_to(ctx, x, shape)]


@_handles("Transpose")
def _transpose(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    perm = tuple(ctx.attr("perm", list(range(x.rank))[::-1]))
    return [ctx.make(Op.TRANSPOSE, [x], o.TransposeAttrs(tuple(int(p) for p in perm)))]


@_handles("Concat")
def _concat(ctx: _Ctx) -> list[Node]:
    xs = [ctx.inp(k) for k in range(ctx.n_in) if ctx.has(k)]
    return [ctx.make(Op.CONCAT, xs, o.AxisAttrs(ctx.axis(ctx.attr("axis"), xs[0].rank)))]


@_handles("Pad")
def _pad(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    mode = ctx.attr("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.fail(f"mode='{mode}' is not supported; supported: constant, reflect, edge, "
                       f"wrap")
    raw = ctx.ints(1)
    axes = [ctx.axis(a, x.rank) for a in ctx.ints(3)] if ctx.has(3) else list(range(x.rank))
    if len(raw) != 2 * len(axes):
        raise InvalidModelError(f"{ctx.where}: {len(raw)} pads for {len(axes)} axes")
    pads = [0] * (2 * x.rank)
    for i, a in enumerate(axes):
        pads[a], pads[x.rank + a] = raw[i], raw[len(axes) + i]
    value = ctx.value(2).item() if ctx.has(2) and ctx.value(2).size else 0
    return [ctx.make(Op.PAD, [x], o.PadAttrs(tuple(pads), mode, value))]


def _slice_node(ctx: _Ctx, x: Node, starts: dict[int, int], ends: dict[int, int],
                steps: dict[int, int], name: str = "") -> Node:
    """SLICE with ONNX start/end semantics per axis (negative = from the end, clamped)."""
    b_all, e_all, s_all = [], [], []
    for a, dim in enumerate(x.shape):
        step = steps.get(a, 1)
        if step == 0:
            raise InvalidModelError(f"{ctx.where}: slice step 0 on axis {a}")
        b, e = starts.get(a, 0 if step > 0 else dim - 1), ends.get(a, dim if step > 0 else -1)
        if a in starts:
            b = b + dim if b < 0 else b
            b = min(max(b, 0), dim) if step > 0 else min(max(b, 0), dim - 1)
        if a in ends:
            e = e + dim if e < 0 else e
            e = min(max(e, 0), dim) if step > 0 else min(max(e, -1), dim - 1)
        b_all.append(b)
        e_all.append(e)
        s_all.append(step)
    return ctx.make(Op.SLICE, [x], o.SliceAttrs(tuple(b_all), tuple(e_all), tuple(s_all)),
                    name=name)


_INT64_BIG = 2 ** 62


@_handles("Slice")
def _slice(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    starts, ends = ctx.ints(1), ctx.ints(2)
    axes = [ctx.axis(a, x.rank) for a in ctx.ints(3)] if ctx.has(3) else list(range(len(starts)))
    steps = ctx.ints(4) if ctx.has(4) else [1] * len(starts)
    clamp = lambda v: max(min(v, _INT64_BIG), -_INT64_BIG)  # noqa: E731 - INT64_MAX sentinels
    return [_slice_node(ctx, x, {a: clamp(s) for a, s in zip(axes, starts)},
                        {a: clamp(e) for a, e in zip(axes, ends)}, dict(zip(axes, steps)))]


@_handles("Split")
def _split(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    axis = ctx.axis(ctx.attr("axis", 0), x.rank)
    n_out = len(ctx.proto.output)
    dim = x.shape[axis]
    if ctx.has(1):
        sizes = ctx.ints(1)
    elif "split" in ctx.attrs:
        sizes = list(ctx.attrs["split"])
    else:
        n = int(ctx.attr("num_outputs", n_out))
        chunk = -(-dim // n)
        sizes = [min(chunk, dim - k * chunk) for k in range(n)]
    if sum(sizes) != dim or len(sizes) != n_out:
        raise InvalidModelError(f"{ctx.where}: split sizes {sizes} do not partition axis "
                                f"{axis} of length {dim} into {n_out} outputs")
    outs, begin = [], 0
    for k, size in enumerate(sizes):
        outs.append(_slice_node(ctx, x, {axis: begin}, {axis: begin + size}, {},
                                name=ctx.proto.output[k]))
        begin += size
    return outs


@_handles("Gather")
def _gather(ctx: _Ctx) -> list[Node]:
    x, idx = ctx.inp(0), ctx.inp(1)
    return [ctx.make(Op.GATHER, [x, idx], o.AxisAttrs(ctx.axis(ctx.attr("axis", 0), x.rank)))]


@_handles("Expand")
def _expand(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(x.shape, tuple(ctx.ints(1))))
    except ValueError:
        raise InvalidModelError(f"{ctx.where}: cannot expand {list(x.shape)} to "
                                f"{ctx.ints(1)}") from None
    return [ctx.make(Op.EXPAND, [x], shape=shape)]


@_handles("Tile")
def _tile(ctx: _Ctx) -> list[Node]:
    return [ctx.make(Op.TILE, [ctx.inp(0)], o.TileAttrs(tuple(ctx.ints(1))))]


@_handles("DepthToSpace", "SpaceToDepth")
def _depth_space(ctx: _Ctx) -> list[Node]:
    x, b = ctx.inp(0), int(ctx.attr("blocksize"))
    if x.rank != 4:
        raise ctx.fail(f"input of rank {x.rank}; supported: rank 4 (N, C, H, W)")
    n, c, h, w = x.shape
    mode = ctx.attr("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if ctx.proto.op_type == "SpaceToDepth":
        t = _reshape_to(ctx, x, (n, c, h // b, b, w // b, b), name="")
        perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
        t = ctx.make(Op.TRANSPOSE, [t], o.TransposeAttrs(perm), name="")
        return [_reshape_to(ctx, t, (n, c * b * b, h // b, w // b))]
    if mode == "DCR":
        t = _reshape_to(ctx, x, (n, b, b, c // (b * b), h, w), name="")
        perm = (0, 3, 4, 1, 5, 2)
    else:
        t = _reshape_to(ctx, x, (n, c // (b * b), b, b, h, w), name="")
        perm = (0, 1, 4, 2, 5, 3)
    t = ctx.make(Op.TRANSPOSE, [t], o.TransposeAttrs(perm), name="")
    return [_reshape_to(ctx, t, (n, c // (b * b), h * b, w * b))]


# -- reductions -----------------------------------------------------------------------------------

_REDUCE = {
    "ReduceSum": Op.REDUCE_SUM, "ReduceMean": Op.REDUCE_MEAN, "ReduceMax": Op.REDUCE_MAX,
    "ReduceMin": Op.REDUCE_MIN, "ReduceProd": Op.REDUCE_PROD, "ReduceL1": Op.REDUCE_L1,
    "ReduceL2": Op.REDUCE_L2, "ReduceSumSquare": Op.REDUCE_SUM_SQUARE,
    "ReduceLogSumExp": Op.REDUCE_LOG_SUM_EXP, "ReduceLogSum": Op.REDUCE_LOG_SUM,
}


@_handles(*_REDUCE)
def _reduce(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    axes = _axes(ctx, 1, x.rank)
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return [ctx.make(Op.IDENTITY, [x])]
        axes = list(range(x.rank))
    keep = bool(ctx.attr("keepdims", 1))
    if x.rank == 0:
        return [ctx.make(Op.IDENTITY, [x])]
    return [ctx.make(_REDUCE[ctx.proto.op_type], [x], o.ReduceAttrs(tuple(sorted(set(axes))),
                                                                     keep))]


@_handles("ArgMax", "ArgMin")
def _argmax(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    a = o.ArgAttrs(ctx.axis(ctx.attr("axis", 0), x.rank), bool(ctx.attr("keepdims", 1)),
                   bool(ctx.attr("select_last_index", 0)))
    return [ctx.make(Op.ARGMAX if ctx.proto.op_type == "ArgMax" else Op.ARGMIN, [x], a)]


# -- constants and shapes -------------------------------------------------------------------------

@_handles("Constant")
def _constant(ctx: _Ctx) -> list[Node]:

    name = ctx.proto.output[0]
    if len(ctx.attrs) != 1:
        raise InvalidModelError(f"{ctx.where}: expected exactly one value attribute")
    (key, v), = ctx.attrs.items()
    if key == "value":
        dtype = DType.from_onnx(v.data_type)
        if dtype is None:
            raise ctx.fail(f"{_type_name(v.data_type)} constants are not supported; supported: "
                           f"{_DTYPES}")
        return [const(_tensor_value(v, f"{ctx.where}: attribute 'value'", dtype), name=name,
                      dtype=dtype)]
    values = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
              "value_ints": np.int64}
    if key not in values:
        raise ctx.fail(f"attribute '{key}' is not supported; supported: value, "
                       f"{', '.join(values)}")
    return [const(np.array(v, dtype=values[key]), name=name)]


@_handles("Shape")
def _shape(ctx: _Ctx) -> list[Node]:
    x = ctx.inp(0)
    start, end = ctx.attr("start", 0), ctx.attr("end", x.rank)
    return [const(np.array(x.shape[slice(start, end)], dtype=np.int64),
                  name=ctx.proto.output[0])]


@_handles("Size")
def _size(ctx: _Ctx) -> list[Node]:
    return [const(np.array(ctx.inp(0).size, dtype=np.int64), name=ctx.proto.output[0])]


@_handles("ConstantOfShape")
def _constant_of_shape(ctx: _Ctx) -> list[Node]:
    v = ctx.attr("value")
    dtype = DType.from_onnx(v.data_type) if v is not None else DType.FLOAT32
    if dtype is None:
        raise ctx.fail(f"value of type {_type_name(v.data_type)} is not supported")
    fill = (_tensor_value(v, f"{ctx.where}: attribute 'value'", dtype).reshape(())
            if v is not None else np.float32(0))
    shape = ctx.ints(0)
    _check_shape(f"{ctx.where}: output '{ctx.proto.output[0]}'", dtype, shape)
    return [const(np.full(shape, fill, dtype=fill.dtype), name=ctx.proto.output[0])]


@_handles("Range")
def _range(ctx: _Ctx) -> list[Node]:
    start, limit, delta = (ctx.value(k) for k in range(3))
    count = max(int(np.ceil((limit - start) / delta)), 0)
    _check_shape(f"{ctx.where}: output '{ctx.proto.output[0]}'",
                 DType.from_numpy(start.dtype), [count])
    values = start + np.arange(count).astype(start.dtype) * delta  # ONNX: start + i * delta
    return [const(values.astype(start.dtype), name=ctx.proto.output[0])]
