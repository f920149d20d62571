"""Helpers for the pass tests: build small graphs, and check a pass against a hand-written
expected graph and numerically against the reference interpreter."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from vtakit.compiler.ir import DType, Graph, Node, Op, run, verify
from vtakit.compiler.ir import ops as o


def inp(name: str, shape: tuple[int, ...], index: int = 0,
        dtype: DType = DType.FLOAT32) -> Node:
    return Node(Op.INPUT, dtype, shape, attrs=o.InputAttrs(index), name=name)


def node(op: Op, *src: Node, attrs: o.Attrs = o.NO_ATTRS, shape: tuple[int, ...] | None = None,
         dtype: DType | None = None) -> Node:
    """A node typed by the IR's own rules (like the frontend does)."""
    from vtakit.compiler.ir import infer

    d, s = infer(op, src, attrs, dtype, shape)
    return Node(op, d, s, tuple(src), attrs)


def feeds_for(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n.name: rng.standard_normal(n.shape).astype(n.dtype.np) for n in g.inputs}


def check_pass(p: Callable[[Graph], Graph], before: Graph, expected: Graph,
               rtol: float = 1e-5, atol: float = 1e-5) -> Graph:
    """p(before) verifies, equals expected structurally, and computes what before computes."""
    verify(before)
    verify(expected)
    after = verify(p(before))
    assert after.structurally_equal(expected), f"got:\n{after}\nexpected:\n{expected}"
    feeds = feeds_for(before)
    want, got = run(before, feeds), run(after, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol)
    return after


@pytest.fixture
def ir() -> object:
    """The helpers above, as a namespace: ir.inp, ir.node, ir.check_pass, ir.feeds_for."""

    class _Helpers:
        pass

    h = _Helpers()
    for f in (inp, node, check_pass, feeds_for):
        setattr(h, f.__name__, staticmethod(f))
    return h
