"""A small CNN for scikit-learn's 8×8 handwritten digits, trained here in numpy.

It is the project's built-in real model (for int8 calibration and the accelerator), shipped in
``vtakit/data/``:

- ``digits_cnn.onnx``: opset 13, input ``input`` of shape N×1×8×8 float32, output ``logits``
  of shape N×10;
- ``digits_test.npz``: the 360 test images, ``x`` uint8 N×8×8 raw pixels 0..16, ``y`` uint8;
- ``digits_calib.npz``: 64 training images for calibration, already in the model's input
  format, so that ``vtakit compile digits_cnn.onnx --quantize --calib digits_calib.npz`` takes
  it as it is: ``input`` float32 N×1×8×8 (``preprocess`` of the raw pixels, keyed by the
  model's input name), and their labels ``y`` uint8.

The network sees ``preprocess(raw) = raw / 16`` as float32 N×1×8×8. Retrain with
``python -m vtakit.digits train [-o DIR]`` (needs scikit-learn); nothing here trains or
downloads at import time.

    from vtakit import digits
    x, y = digits.test_split()
    model = digits.load_model()
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from threadpoolctl import threadpool_limits

__all__ = ["model_path", "load_model", "test_split", "calibration_set", "preprocess", "build",
           "forward", "backward", "softmax_cross_entropy", "predict", "train", "to_onnx",
           "train_and_export", "main"]

DATA_DIR = Path(__file__).with_name("data")
IMAGE_SIZE = 8
PIXEL_MAX = 16  # load_digits counts 0..16 set pixels in each 4×4 block of a 32×32 bitmap
TEST_SIZE = 360
CALIB_SIZE = 64


def model_path() -> Path:
    """The shipped trained model, ``vtakit/data/digits_cnn.onnx``."""
    return DATA_DIR / "digits_cnn.onnx"


def load_model() -> onnx.ModelProto:
    return onnx.load(model_path())


def preprocess(raw: Any) -> np.ndarray:
    """Raw pixels 0..16 (any shape holding whole 8×8 images) → float32 N×1×8×8 in [0, 1]."""
    raw = np.asarray(raw)
    if raw.size % (IMAGE_SIZE * IMAGE_SIZE) or raw.size == 0:
        raise ValueError(f"expected whole 8×8 images, got an array of shape {raw.shape}")
    if raw.min() < 0 or raw.max() > PIXEL_MAX:
        raise ValueError(f"expected raw pixels in 0..{PIXEL_MAX}, got values in "
                         f"{raw.min()}..{raw.max()}")
    x = raw.reshape(-1, 1, IMAGE_SIZE, IMAGE_SIZE).astype(np.float32)
    return x / np.float32(PIXEL_MAX)


def test_split() -> tuple[np.ndarray, np.ndarray]:
    """The shipped test images, preprocessed (float32 N×1×8×8), and their labels (int64 N)."""
    with np.load(DATA_DIR / "digits_test.npz") as f:
        return preprocess(f["x"]), f["y"].astype(np.int64)


def calibration_set() -> np.ndarray:
    """The shipped calibration images (from the training split), preprocessed (float32
    N×1×8×8, as the file holds them)."""
    with np.load(DATA_DIR / "digits_calib.npz") as f:
        return f["input"]


# The network: layers with hand-written forward and backward passes. A layer keeps what its
# backward pass needs from the last forward pass; `grads` has the keys of `params`.

class Layer:
    params: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]

    def __init__(self) -> None:
        self.params, self.grads = {}, {}

    def forward(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """The gradient for the input of the last forward pass; sets `grads`."""
        raise NotImplementedError

    def node(self, name: str, x: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        """This layer as one ONNX node reading `x` and writing `name`, and its initializers."""
        raise NotImplementedError


class Conv3x3(Layer):
    """3×3 convolution, stride 1, one pixel of zero padding: N×C×H×W → N×O×H×W."""

    def __init__(self, c_in: int, c_out: int, rng: np.random.Generator, dtype: Any) -> None:
        super().__init__()
        w = rng.standard_normal((c_out, c_in, 3, 3)) * math.sqrt(2 / (c_in * 9))  # He init
        self.params = {"w": w.astype(dtype), "b": np.zeros(c_out, dtype)}

    def forward(self, x: np.ndarray) -> np.ndarray:
        n, _, h, w = self.x_shape = x.shape
        self.cols = _im2col(x)
        w_mat = self.params["w"].reshape(len(self.params["b"]), -1)
        y = np.matmul(w_mat, self.cols) + self.params["b"][:, None]
        return y.reshape(n, -1, h, w)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        w = self.params["w"]
        dy = dy.reshape(dy.shape[0], dy.shape[1], -1)
        self.grads = {"w": np.tensordot(dy, self.cols, ([0, 2], [0, 2])).reshape(w.shape),
                      "b": dy.sum((0, 2))}
        return _col2im(np.matmul(w.reshape(len(w), -1).T, dy), self.x_shape)

    def node(self, name: str, x: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        inits = [numpy_helper.from_array(v.astype(np.float32), f"{name}_{k}")
                 for k, v in self.params.items()]
        return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], name=name,
                                kernel_shape=[3, 3], pads=[1, 1, 1, 1]), inits


def _im2col(x: np.ndarray) -> np.ndarray:
    """N×C×H×W → N×(C·9)×(H·W): column p holds the 3×3 window (padded) around pixel p, in the
    order of a C×3×3 weight."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((n, c, 3, 3, h, w), x.dtype)
    for i in range(3):
        for j in range(3):
            cols[:, :, i, j] = xp[:, :, i:i + h, j:j + w]
    return cols.reshape(n, c * 9, h * w)


def _col2im(cols: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The transpose of `_im2col`: sums each window's entries back onto its pixels."""
    n, c, h, w = shape
    cols = cols.reshape(n, c, 3, 3, h, w)
    xp = np.zeros((n, c, h + 2, w + 2), cols.dtype)
    for i in range(3):
        for j in range(3):
            xp[:, :, i:i + h, j:j + w] += cols[:, :, i, j]
    return xp[:, :, 1:-1, 1:-1]


class Relu(Layer):
    def forward(self, x: np.ndarray) -> np.ndarray:
        self.mask = x > 0
        return x * self.mask

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return dy * self.mask

    def node(self, name: str, x: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        return helper.make_node("Relu", [x], [name], name=name), []


class MaxPool2x2(Layer):
    """2×2 max-pool, stride 2 (H and W even). The gradient goes to the first maximum of each
    window, as in the forward pass."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.x_shape = x.shape
        win = _windows(x)
        self.argmax = win.argmax(-1)[..., None]
        return np.take_along_axis(win, self.argmax, -1)[..., 0]

    def backward(self, dy: np.ndarray) -> np.ndarray:
        n, c, h, w = self.x_shape
        dwin = np.zeros((n, c, h // 2, w // 2, 4), dy.dtype)
        np.put_along_axis(dwin, self.argmax, dy[..., None], -1)
        return dwin.reshape(n, c, h // 2, w // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
            self.x_shape)

    def node(self, name: str, x: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        return helper.make_node("MaxPool", [x], [name], name=name, kernel_shape=[2, 2],
                                strides=[2, 2]), []


def _windows(x: np.ndarray) -> np.ndarray:
    """N×C×H×W → N×C×(H/2)×(W/2)×4, the 2×2 windows in row-major order."""
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
        n, c, h // 2, w // 2, 4)


class Flatten(Layer):
    def forward(self, x: np.ndarray) -> np.ndarray:
        self.x_shape = x.shape
        return x.reshape(len(x), -1)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        return dy.reshape(self.x_shape)

    def node(self, name: str, x: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        return helper.make_node("Flatten", [x], [name], name=name, axis=1), []


class Dense(Layer):
    """y = x·wᵀ + b with w of shape out×in, as ONNX Gemm with transB=1."""

    def __init__(self, n_in: int, n_out: int, rng: np.random.Generator, dtype: Any) -> None:
        super().__init__()
        w = rng.standard_normal((n_out, n_in)) * math.sqrt(2 / n_in)
        self.params = {"w": w.astype(dtype), "b": np.zeros(n_out, dtype)}

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.x = x
        return x @ self.params["w"].T + self.params["b"]

    def backward(self, dy: np.ndarray) -> np.ndarray:
        self.grads = {"w": dy.T @ self.x, "b": dy.sum(0)}
        return dy @ self.params["w"]

    def node(self, name: str, x: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        inits = [numpy_helper.from_array(v.astype(np.float32), f"{name}_{k}")
                 for k, v in self.params.items()]
        return helper.make_node("Gemm", [x, f"{name}_w", f"{name}_b"], [name], name=name,
                                transB=1), inits


def build(*, seed: int = 0, image_size: int = IMAGE_SIZE, channels: Sequence[int] = (16, 32, 16),
          hidden: int = 64, classes: int = 10, dtype: Any = np.float32) -> list[Layer]:
    """The network, He-initialised from `seed`: Conv→ReLU→Conv→ReLU→MaxPool→Conv→ReLU→Flatten
    →Dense→ReLU→Dense, with `channels` for the three convolutions (defaults: 8×8 digits)."""
    if image_size % 2:
        raise ValueError(f"image_size must be even (for the 2×2 max-pool), got {image_size}")
    c1, c2, c3 = channels
    rng = np.random.default_rng(seed)
    side = image_size // 2
    return [Conv3x3(1, c1, rng, dtype), Relu(), Conv3x3(c1, c2, rng, dtype), Relu(), MaxPool2x2(),
            Conv3x3(c2, c3, rng, dtype), Relu(), Flatten(),
            Dense(c3 * side * side, hidden, rng, dtype), Relu(), Dense(hidden, classes, rng, dtype)]


def forward(layers: Sequence[Layer], x: np.ndarray) -> np.ndarray:
    for layer in layers:
        x = layer.forward(x)
    return x


def backward(layers: Sequence[Layer], dy: np.ndarray) -> None:
    """Back-propagates `dy` (the gradient for the last forward pass's output); sets `grads`."""
    for layer in reversed(layers):
        dy = layer.backward(dy)


def softmax_cross_entropy(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """The mean cross-entropy of softmax(logits) against labels y, and its gradient."""
    z = logits - logits.max(1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
    n = len(y)
    grad = np.exp(log_p)
    grad[np.arange(n), y] -= 1
    return float(-log_p[np.arange(n), y].mean()), grad / n


def predict(layers: Sequence[Layer], x: np.ndarray) -> np.ndarray:
    return forward(layers, x).argmax(1)


class Adam:
    """Adam (Kingma & Ba) over every parameter of `layers`; `lr` may be changed between steps."""

    def __init__(self, layers: Sequence[Layer], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.layers, self.lr, self.betas, self.eps, self.t = layers, lr, betas, eps, 0
        self.m = [{k: np.zeros_like(v) for k, v in la.params.items()} for la in layers]
        self.v = [{k: np.zeros_like(v) for k, v in la.params.items()} for la in layers]

    def step(self) -> None:
        b1, b2 = self.betas
        self.t += 1
        lr = self.lr * math.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
        for layer, m, v in zip(self.layers, self.m, self.v):
            for k, p in layer.params.items():
                g = layer.grads[k]
                m[k] = b1 * m[k] + (1 - b1) * g
                v[k] = b2 * v[k] + (1 - b2) * g * g
                p -= (lr * m[k] / (np.sqrt(v[k]) + self.eps)).astype(p.dtype)


def train(layers: Sequence[Layer], x: np.ndarray, y: np.ndarray, *, epochs: int = 12,
          batch_size: int = 32, lr: float = 2e-3, seed: int = 0,
          log: Callable[[str], None] | None = None) -> list[float]:
    """Trains `layers` in place with Adam and a cosine learning-rate decay; returns the mean
    training loss of each epoch."""
    # The matrices are small: BLAS threads cost more than they save (4× slower on 2 cores).
    with threadpool_limits(1, user_api="blas"):
        return _train(layers, x, y, epochs, batch_size, lr, seed, log)


def _train(layers: Sequence[Layer], x: np.ndarray, y: np.ndarray, epochs: int, batch_size: int,
           lr: float, seed: int, log: Callable[[str], None] | None) -> list[float]:
    rng = np.random.default_rng(seed)
    opt = Adam(layers, lr)
    steps_per_epoch = -(-len(x) // batch_size)
    total_steps, losses = epochs * steps_per_epoch, []
    for epoch in range(epochs):
        order, total = rng.permutation(len(x)), 0.0
        for i, start in enumerate(range(0, len(x), batch_size)):
            idx = order[start:start + batch_size]
            loss, grad = softmax_cross_entropy(forward(layers, x[idx]), y[idx])
            backward(layers, grad)
            done = (epoch * steps_per_epoch + i) / total_steps
            opt.lr = lr * 0.5 * (1 + math.cos(math.pi * done))
            opt.step()
            total += loss * len(idx)
        losses.append(total / len(x))
        if log is not None:
            log(f"epoch {epoch + 1:2d}/{epochs}: loss {losses[-1]:.4f}")
    return losses


def to_onnx(layers: Sequence[Layer], *, image_size: int = IMAGE_SIZE) -> onnx.ModelProto:
    """The network as a checked ONNX model (opset 13, float32): input ``input`` N×1×H×W,
    output ``logits`` N×classes."""
    nodes, inits, x = [], [], "input"
    for i, layer in enumerate(layers):
        name = f"{type(layer).__name__.lower()}_{i}"
        node, params = layer.node(name, x)
        nodes.append(node)
        inits += params
        x = name
    nodes[-1].output[0] = "logits"
    classes = len(layers[-1].params["b"])
    x_shape: list[int | str] = ["N", 1, image_size, image_size]
    graph = helper.make_graph(
        nodes, "digits_cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="vtakit.digits")
    model.ir_version = 10  # readable by onnxruntime releases of the last two years
    onnx.checker.check_model(model, full_check=True)
    return model


def _load_sklearn_split(seed: int) -> tuple[np.ndarray, ...]:
    """Raw uint8 train images, train labels, test images, test labels: a stratified split."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        raise ImportError("training the digits model needs scikit-learn (its bundled digits "
                          "data set): pip install scikit-learn (or 'vtakit[digits]')") from None
    data = load_digits()
    x = data.images.astype(np.uint8)
    y = data.target.astype(np.uint8)
    split = train_test_split(x, y, test_size=TEST_SIZE, stratify=y, random_state=seed)
    x_train, x_test, y_train, y_test = split
    return x_train, y_train, x_test, y_test


def train_and_export(out_dir: Path, *, epochs: int = 12, seed: int = 0,
                     log: Callable[[str], None] = print) -> float:
    """Trains on the digits training split and writes the model and the two npz files to
    `out_dir`; returns the test accuracy."""
    x_train, y_train, x_test, y_test = _load_sklearn_split(seed)
    t0 = time.perf_counter()
    layers = build(seed=seed)
    train(layers, preprocess(x_train), y_train.astype(np.int64), epochs=epochs, seed=seed,
          log=log)
    log(f"trained on {len(x_train)} images in {time.perf_counter() - t0:.1f} s")
    accuracy = float((predict(layers, preprocess(x_test)) == y_test).mean())
    log(f"test accuracy (numpy): {accuracy:.4f} on {len(x_test)} images")
    model = to_onnx(layers)
    model.doc_string = (f"CNN for scikit-learn's 8x8 digits (vtakit.digits, seed {seed}); "
                        f"input = raw pixels (0..16) / 16; test accuracy {accuracy:.4f}")
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out_dir / "digits_cnn.onnx")
    np.savez_compressed(out_dir / "digits_test.npz", x=x_test, y=y_test)
    calib = np.random.default_rng(seed).choice(len(x_train), CALIB_SIZE, replace=False)
    np.savez_compressed(out_dir / "digits_calib.npz", input=preprocess(x_train[calib]),
                        y=y_train[calib])
    log(f"wrote digits_cnn.onnx, digits_test.npz, digits_calib.npz to {out_dir}")
    return accuracy


def main(argv: Sequence[str] | None = None) -> None:
    import click

    @click.group()
    def cli() -> None:
        """The 8×8 digits CNN."""

    @cli.command("train")
    @click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
                  default=DATA_DIR, show_default=True, help="Folder to write the files to.")
    @click.option("--epochs", type=click.IntRange(min=1), default=12, show_default=True)
    @click.option("--seed", type=int, default=0, show_default=True)
    def train_cmd(output: Path, epochs: int, seed: int) -> None:
        """Train on scikit-learn's digits; write the model, test split and calibration set."""
        try:
            train_and_export(output, epochs=epochs, seed=seed, log=click.echo)
        except ImportError as e:
            raise click.ClickException(str(e)) from None

    cli.main(args=list(argv) if argv is not None else None, prog_name="python -m vtakit.digits")


if __name__ == "__main__":
    main()
