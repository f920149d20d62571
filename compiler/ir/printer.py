"""A readable text form of a graph, one node per line:

    graph mlp(%x: f32[1, 784]) -> (y: %5)
      %1 = const f32[784, 128]  # fc1.weight
      %2 = matmul(%0, %1) f32[1, 128]
      %3 = relu(%2) f32[1, 128]
"""

from __future__ import annotations

import dataclasses

from .graph import Graph
from .ops import (
    NO_EPILOGUE,
    ConstAttrs,
    Epilogue,
    FusedElementwiseAttrs,
    InputAttrs,
    NoAttrs,
    Node,
    Op,
)

_MAX_INLINE_VALUES = 8


def _attrs(n: Node) -> str:
    a = n.attrs
    if isinstance(a, (NoAttrs, InputAttrs)):
        return ""
    if isinstance(a, ConstAttrs):
        if a.value.size <= _MAX_INLINE_VALUES:
            return " " + str(a.value.tolist())
        return ""
    if isinstance(a, FusedElementwiseAttrs):
        return " {" + str(a) + "}"
    fields = ", ".join(
        f"epilogue={v}" if isinstance(v, Epilogue) else f"{f.name}={v!r}"
        for f in dataclasses.fields(a)
        if not (isinstance(v := getattr(a, f.name), Epilogue) and v == NO_EPILOGUE))
    return " {" + fields + "}" if fields else ""


def format_graph(g: Graph) -> str:
    ids = {id(n): f"%{i}" for i, n in enumerate(g.nodes)}
    ins = ", ".join(f"{ids[id(n)]} {n.name}: {n.dtype.value}{list(n.shape)}" for n in g.inputs)
    outs = ", ".join(f"{name}: {ids[id(n)]}" for name, n in zip(g.output_names, g.outputs))
    lines = [f"graph {g.name}({ins}) -> ({outs})"]
    for n in g.nodes:
        if n.op is Op.INPUT:
            continue
        args = "(" + ", ".join(ids[id(s)] for s in n.src) + ")" if n.src else ""
        note = f"  # {n.name}" if n.name else ""
        lines.append(f"  {ids[id(n)]} = {n.op.value}{args}{_attrs(n)} "
                     f"{n.dtype.value}{list(n.shape)}{note}")
    return "\n".join(lines)
