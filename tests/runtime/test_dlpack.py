"""Zero-copy interop: inputs from anything with ``__dlpack__``, outputs shared without a copy."""

from __future__ import annotations

import numpy as np
import pytest

from vtakit import models
from vtakit.compiler.compile import lower_model
from vtakit.runtime import GraphExecutor


@pytest.fixture(scope="module")
def ex() -> GraphExecutor:
    return GraphExecutor(lower_model(models.mlp(), threads=1))


class _Tensor:
    """A minimal DLPack producer that is not a numpy array (as a foreign framework's is)."""

    def __init__(self, a: np.ndarray, device: tuple[int, int] = (1, 0)) -> None:
        self.a, self.device = a, device

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.device


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 784)).astype(np.float32)


def test_input_through_dlpack_and_output_without_a_copy(ex: GraphExecutor) -> None:
    x = _x()
    ex.set_input(0, x)
    ex.run()
    want = ex.get_output(0)
    ex.set_input(0, _Tensor(x))
    ex.run()
    shared = ex.get_output(0, dlpack=True)
    np.testing.assert_array_equal(shared, want)
    assert np.from_dlpack(shared).ctypes.data == shared.ctypes.data  # no copy on the way out
    copy = ex.get_output(0)
    ex.set_input(0, _x(1))
    ex.run()  # the shared array follows the executor; the copy does not
    assert not np.array_equal(shared, want) and np.array_equal(copy, want)


def test_dlpack_errors_name_the_input(ex: GraphExecutor) -> None:
    name = ex.input_names[0]
    with pytest.raises(TypeError, match=f"input '{name}': the DLPack tensor lives on device "
                                        r"type 2, expected the CPU \(1\)"):
        ex.set_input(0, _Tensor(_x(), device=(2, 0)))
    with pytest.raises(TypeError, match=f"input '{name}': got dtype float64, expected float32"):
        ex.set_input(0, _Tensor(_x().astype(np.float64)))
    with pytest.raises(TypeError, match="expected a numpy.ndarray or an object with "
                                        "__dlpack__, got object"):
        ex.set_input(0, object())


def test_torch_tensors_in_and_out(ex: GraphExecutor) -> None:
    torch = pytest.importorskip("torch", reason="pip install torch (CPU build) to test the "
                                                "interop with PyTorch")
    x = _x(3)
    ex.set_input(0, torch.from_numpy(x))
    ex.run()
    y = torch.from_dlpack(ex.get_output(0, dlpack=True))
    assert y.data_ptr() == ex.get_output(0, dlpack=True).ctypes.data  # shared, not copied
    ex.set_input(0, x)
    ex.run()
    np.testing.assert_array_equal(y.numpy(), ex.get_output(0))
    with pytest.raises(TypeError, match="could not read Tensor through DLPack"):
        ex.set_input(0, torch.from_numpy(x).requires_grad_())
