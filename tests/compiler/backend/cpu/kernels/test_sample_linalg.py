"""Det (LU with partial pivoting) against numpy, and GridSample against the reference
interpreter, through lower() + GraphExecutor."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

from vtakit.compiler.backend.cpu.lower import lower
from vtakit.compiler.errors import UnsupportedError
from vtakit.compiler.frontend.onnx import import_onnx
from vtakit.compiler.ir.interpreter import run
from vtakit.runtime.executor import GraphExecutor

T = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}
rng = np.random.default_rng(0)


def _model(op: str, inputs: list[np.ndarray], out_shape: tuple[int, ...], **attrs):
    names = [f"x{i}" for i in range(len(inputs))]
    vis = [helper.make_tensor_value_info(n, T[a.dtype.type], a.shape)
           for n, a in zip(names, inputs, strict=True)]
    out = helper.make_tensor_value_info("y", T[inputs[0].dtype.type], out_shape)
    graph = helper.make_graph([helper.make_node(op, names, ["y"], **attrs)], "g", vis, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _compiled(model, inputs: list[np.ndarray], threads: int = 2) -> tuple[np.ndarray, dict]:
    g = import_onnx(model)
    feeds = {f"x{i}": a for i, a in enumerate(inputs)}
    ex = GraphExecutor(lower(g, threads=threads))
    for k, v in feeds.items():
        ex.set_input(k, v)
    ex.run()
    return ex.get_output(0), run(g, feeds)


# -- Det -----------------------------------------------------------------------------------------

def _det(x: np.ndarray, threads: int = 2) -> np.ndarray:
    got, _ = _compiled(_model("Det", [x], x.shape[:-2]), [x], threads)
    return got


SPECIAL = {
    "needs_pivoting": [[0.0, 1.0], [1.0, 0.0]],  # a zero in the corner: one swap, det -1
    "pivot_by_size": [[1e-12, 1.0, 2.0], [3.0, 1.0, 0.0], [1.0, 4.0, 1.0]],
    "singular_rows": [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]],
    "zero_column": [[0.0, 1.0, 2.0], [0.0, 3.0, 4.0], [0.0, 5.0, 6.0]],
    "zero_matrix": [[0.0, 0.0], [0.0, 0.0]],
    "one_by_one": [[-3.5]],
    "permutation": [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0],
                    [0.0, 3.0, 0.0, 0.0]],
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_det_special_matrices(name: str, dtype: type) -> None:
    x = np.array(SPECIAL[name], dtype)
    got = _det(x)
    assert got.dtype == dtype and got.shape == ()
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=1e-6,
                               atol=1e-12)


def test_det_singular_is_exactly_zero() -> None:
    assert _det(np.array(SPECIAL["zero_column"])) == 0.0
    assert _det(np.array(SPECIAL["zero_matrix"], np.float32)) == 0.0


@pytest.mark.parametrize(("shape", "threads"), [((2, 3, 4, 4), 2), ((64, 8, 8), 2),
                                                ((5, 7, 7), 1), ((1, 1, 1), 1)])
def test_det_batched_matches_numpy(shape: tuple[int, ...], threads: int) -> None:
    x = rng.standard_normal(shape)
    # every other matrix of the batch made singular (two equal rows)
    flat = x.reshape(-1, *shape[-2:])
    if shape[-1] > 1:
        flat[::2, -1] = flat[::2, 0]
    got = _det(x, threads)
    assert got.shape == shape[:-2]
    np.testing.assert_allclose(got, np.linalg.det(x), rtol=1e-9, atol=1e-12)
    got32 = _det(x.astype(np.float32), threads)
    np.testing.assert_allclose(got32, np.linalg.det(x), rtol=1e-5, atol=1e-5)


# -- GridSample ----------------------------------------------------------------------------------

def _grid(n: int, out: tuple[int, ...], nsp: int, dtype: type) -> np.ndarray:
    """Random coordinates, a third of them outside [-1, 1], and multiples of 1/8 (which put
    many points exactly halfway between two pixels, where nearest rounds half to even)."""
    g = rng.uniform(-1.6, 1.6, (n, *out, nsp))
    eighths = rng.integers(-12, 13, g.shape) / 8
    return np.where(rng.random(g.shape) < 0.3, eighths, g).astype(dtype)


CASES = list(itertools.product(["nearest", "linear", "cubic"], ["zeros", "border", "reflection"],
                               [0, 1]))


@pytest.mark.parametrize(("mode", "padding", "align"), CASES,
                         ids=[f"{m}-{p}-ac{a}" for m, p, a in CASES])
@pytest.mark.parametrize("spatial", [(5, 4), (3, 4, 2)], ids=["4d", "5d"])
def test_grid_sample_matches_interpreter(mode: str, padding: str, align: int,
                                         spatial: tuple[int, ...]) -> None:
    x = rng.standard_normal((2, 3, *spatial))
    out = (4, 3) if len(spatial) == 2 else (2, 3, 2)
    grid = _grid(2, out, len(spatial), np.float64)
    model = _model("GridSample", [x, grid], (2, 3, *out), mode=mode, padding_mode=padding,
                   align_corners=align)
    got, want = _compiled(model, [x, grid])
    assert got.dtype == np.float64 and got.shape == want["y"].shape
    np.testing.assert_allclose(got, want["y"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_grid_sample_float32_and_split(mode: str) -> None:
    """float32, many points (the step is split over threads), a unit axis (align_corners
    reflection then has nothing to reflect over)."""
    x = rng.standard_normal((2, 4, 16, 1)).astype(np.float32)
    grid = _grid(2, (64, 48), 2, np.float32)
    for padding in ("zeros", "border", "reflection"):
        model = _model("GridSample", [x, grid], (2, 4, 64, 48), mode=mode,
                       padding_mode=padding, align_corners=1)
        got, want = _compiled(model, [x, grid], threads=2)
        np.testing.assert_allclose(got, want["y"], rtol=1e-6, atol=1e-6)


def test_grid_sample_of_an_empty_image_names_the_node() -> None:
    x = np.zeros((1, 1, 0, 3), np.float32)
    grid = np.zeros((1, 2, 2, 2), np.float32)
    g = import_onnx(_model("GridSample", [x, grid], (1, 1, 2, 2)))
    with pytest.raises(UnsupportedError, match="GRID_SAMPLE node .*grid_sample of an empty"):
        lower(g, threads=1)
