"""The graph IR: dtypes, ops and nodes, graphs, the verifier, a printer and the reference
interpreter (the executable specification of every op)."""

from .dtypes import DType
from .graph import Graph, topological_order
from .infer import SIGNATURES, infer
from .interpreter import run
from .ops import NO_ATTRS, Attrs, Node, Op, const
from .printer import format_graph
from .verify import verify

__all__ = ["DType", "Graph", "topological_order", "SIGNATURES", "infer", "run", "NO_ATTRS",
           "Attrs", "Node", "Op", "const", "format_graph", "verify"]
