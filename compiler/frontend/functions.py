"""Operators that ONNX defines by a function body (Attention, RotaryEmbedding, SwiGLU...):
expand one node into the body's nodes, which the importer then imports one by one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx
from onnx import AttributeProto, FunctionProto, NodeProto, TypeProto, defs


def function_body(node: NodeProto, opset: int, input_types: Sequence[TypeProto | None]
                  ) -> list[NodeProto] | None:
    """The nodes of node's function body at opset, with the node's inputs, outputs and
    attributes substituted and internal names made unique; None when ONNX defines no body."""
    try:
        # The stubs of OpSchema lack the function accessors used below.
        schema: Any = defs.get_schema(node.op_type, opset, node.domain)
    except defs.SchemaError:
        return None
    fn = FunctionProto()
    plain = [v for v in schema.function_opset_versions if v <= opset]
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if plain:
        fn.ParseFromString(schema.get_function_with_opset_version(max(plain)))
    elif dependent:
        complete = NodeProto()
        complete.CopyFrom(node)
        complete.attribute.extend(_defaults(schema, node))
        fn.ParseFromString(schema.get_context_dependent_function_with_opset_version(
            max(dependent), complete.SerializeToString(),
            [(t or TypeProto()).SerializeToString() for t in input_types]))  # "" = no type
    else:
        return None
    attrs = {a.name: a for a in [*node.attribute, *_defaults(schema, node)]}
    prefix = f"{node.output[0] or node.op_type}/{node.op_type}/"
    names = {formal: (node.input[i] if i < len(node.input) else "")
             for i, formal in enumerate(fn.input)}
    names.update({formal: node.output[i] for i, formal in enumerate(fn.output)
                  if i < len(node.output) and node.output[i]})

    def rename(name: str) -> str:
        return names.get(name, prefix + name if name else "")

    body: list[NodeProto] = []
    for inner in fn.node:
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in inner.attribute):
            return None  # control flow inside the body: not supported either way
        new = NodeProto()
        new.CopyFrom(inner)
        del new.input[:], new.output[:], new.attribute[:]
        new.input.extend(rename(n) for n in inner.input)
        new.output.extend(rename(n) for n in inner.output)
        new.name = prefix + (inner.name or f"{len(body)}")
        for a in inner.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in attrs:
                    actual = AttributeProto()
                    actual.CopyFrom(attrs[a.ref_attr_name])
                    actual.name = a.name
                    new.attribute.append(actual)
            else:
                new.attribute.append(a)
        body.append(new)
    return body


def _defaults(schema: Any, node: NodeProto) -> list[AttributeProto]:
    given = {a.name for a in node.attribute}
    return [a.default_value for name, a in schema.attributes.items()
            if name not in given and a.default_value.name]


def tensor_type(elem_type: int, shape: Sequence[int]) -> TypeProto:
    return onnx.helper.make_tensor_type_proto(elem_type, list(shape))
