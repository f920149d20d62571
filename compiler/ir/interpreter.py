"""The reference interpreter: numpy semantics of every op.

This is the executable specification of the IR and the oracle that later backends are tested
against; it is written for clarity first, but vectorised (convolution is im2col + matmul) so
that ImageNet-sized models run in seconds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping

import numpy as np

from . import ops as o
from .graph import Graph
from .infer import conv_shape
from .ops import Node, Op

Kernel = Callable[[Node, list[np.ndarray]], np.ndarray]


def run(g: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate g on feeds (one array per graph input, by name); return outputs by name.

    Inputs are checked for presence, dtype and shape; a float input of the wrong float type is
    rejected rather than silently converted.
    """
    missing = [n.name for n in g.inputs if n.name not in feeds]
    extra = sorted(set(feeds) - set(g.input_names))
    if missing or extra:
        raise ValueError(f"graph {g.name!r}: missing inputs {missing}, unknown inputs {extra}; "
                         f"expected {list(g.input_names)}")
    values: dict[int, np.ndarray] = {}
    for n in g.inputs:
        x = np.asarray(feeds[n.name])
        if x.dtype != n.dtype.np or x.shape != n.shape:
            raise ValueError(f"input {n.name!r}: got {x.dtype}{list(x.shape)}, expected "
                             f"{n.dtype.np}{list(n.shape)}")
        values[id(n)] = x
    for n in g.nodes:
        if n.op is not Op.INPUT:
            values[id(n)] = evaluate(n, [values[id(s)] for s in n.src])
    return {name: values[id(n)] for name, n in zip(g.output_names, g.outputs)}


def evaluate(n: Node, args: list[np.ndarray]) -> np.ndarray:
    """The value of node n given the values of its operands."""
    out = np.asarray(KERNELS[n.op](n, args))
    if out.dtype != n.dtype.np:
        out = out.astype(n.dtype.np)
    assert out.shape == n.shape, (n, out.shape)
    return out


def _unary(f: Callable[[np.ndarray], np.ndarray]) -> Kernel:
    return lambda n, a: f(a[0])


def _binary(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    return lambda n, a: f(a[0], a[1])


_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf(x.astype(np.float64)), np.float64).astype(x.dtype)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return a / b
    q = a // b  # rounds toward -inf; ONNX (C) division truncates toward zero
    return q + ((a % b != 0) & ((a < 0) != (b < 0)))


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return np.power(a, b.astype(a.dtype))
    if b.dtype.kind == "f":
        return np.power(a.astype(np.float64), b).astype(a.dtype)
    return np.power(a, b.astype(a.dtype))


def _clip(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.ClipAttrs)
    x = a[0]
    if n.attrs.min is not None:
        x = np.maximum(x, np.array(n.attrs.min).astype(x.dtype))
    if n.attrs.max is not None:
        x = np.minimum(x, np.array(n.attrs.max).astype(x.dtype))
    return x


def _gelu(n: Node, a: list[np.ndarray]) -> np.ndarray:
    x = a[0]
    assert isinstance(n.attrs, o.GeluAttrs)
    if n.attrs.approximate == "tanh":
        c = np.sqrt(2 / np.pi).astype(x.dtype)
        return 0.5 * x * (1 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x ** 3)))
    return 0.5 * x * (1 + erf(x / np.sqrt(np.asarray(2, x.dtype))))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def activation(name: str | None, x: np.ndarray, alpha: float = 0.0,
               lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """An epilogue activation (see ops.Epilogue); the same arithmetic as the standalone op."""
    if name is None:
        return x
    if name == "relu":
        return np.maximum(x, np.zeros((), x.dtype))
    if name == "clip":
        if lo is not None:
            x = np.maximum(x, np.array(lo).astype(x.dtype))
        if hi is not None:
            x = np.minimum(x, np.array(hi).astype(x.dtype))
        return x
    if name == "leaky_relu":
        return np.where(x >= 0, x, x * _scalar(x, alpha))
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    if name == "gelu":
        return 0.5 * x * (1 + erf(x / np.sqrt(np.asarray(2, x.dtype))))
    raise ValueError(f"unknown epilogue activation {name!r}")


def _with_epilogue(base: Kernel) -> Kernel:
    """base computes conv/gemm/matmul with its bias from the operands before the residual."""

    def kernel(n: Node, a: list[np.ndarray]) -> np.ndarray:
        ep = o.epilogue_of(n)
        if ep == o.NO_EPILOGUE:
            return base(n, a)
        y = base(n, a[:-1] if ep.residual else a)
        if ep.residual:
            y = y + a[-1]
        return activation(ep.activation, y, ep.alpha, ep.clip_min, ep.clip_max)

    return kernel


def _gemm(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.GemmAttrs)
    x = a[0].T if at.trans_a else a[0]
    w = a[1].T if at.trans_b else a[1]
    y = (x @ w) * np.asarray(at.alpha, x.dtype) if at.alpha != 1 else x @ w
    if len(a) == 3:
        y = y + (a[2] * np.asarray(at.beta, x.dtype) if at.beta != 1 else a[2])
    return y


def _matmul(n: Node, a: list[np.ndarray]) -> np.ndarray:
    y = np.matmul(a[0], a[1])
    return y + a[2] if len(a) == 3 else y


_FUSED_STEPS: dict[str, Callable[..., np.ndarray]] = {
    "identity": lambda x: x,
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "erf": lambda x: erf(x), "neg": np.negative, "abs": np.abs,
    "reciprocal": np.reciprocal, "floor": np.floor, "ceil": np.ceil, "round": np.rint,
    "sin": np.sin, "cos": np.cos,
    "softplus": lambda x: np.logaddexp(np.zeros((), x.dtype), x),
    "softsign": lambda x: x / (1 + np.abs(x)),
    "hard_swish": lambda x: x * np.clip(x / 6 + np.asarray(0.5, x.dtype), 0, 1),
    "gelu": lambda x: activation("gelu", x),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": lambda x, y: np.power(x, y.astype(x.dtype)),
    "clip": lambda x, lo, hi: activation("clip", x, lo=None if lo == -np.inf else lo,
                                         hi=None if hi == np.inf else hi),
    "leaky_relu": lambda x, alpha: activation("leaky_relu", x, alpha),
    "elu": lambda x, alpha: np.where(x > 0, x, _scalar(x, alpha) * np.expm1(np.minimum(x, 0))),
    "hard_sigmoid": lambda x, alpha, beta: np.clip(x * _scalar(x, alpha) + _scalar(x, beta),
                                                   0, 1),
}


def _fused_elementwise(n: Node, a: list[np.ndarray]) -> np.ndarray:
    """Run the program step by step, each step as the unfused op would (float32)."""
    assert isinstance(n.attrs, o.FusedElementwiseAttrs)
    vals = list(a)
    for name, idx, consts in n.attrs.program:
        args = [vals[i] for i in idx]
        if name in o.FUSED_BINARY and consts:
            args.append(np.asarray(consts[0], np.float32))
            consts = ()
        vals.append(np.asarray(_FUSED_STEPS[name](*args, *consts), np.float32))
    y = vals[-1]
    return y if y.shape == n.shape else np.broadcast_to(y, n.shape).copy()


def windows(x: np.ndarray, kernel: tuple[int, ...], strides: tuple[int, ...],
            dilations: tuple[int, ...], out: tuple[int, ...]) -> np.ndarray:
    """View of the sliding windows of an (already padded) N, C, *spatial array:
    shape (N, C, *out, *kernel); element [n, c, *p, *k] is x[n, c, *(p*stride + k*dilation)]."""
    nsp = len(kernel)
    spans = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    v = np.lib.stride_tricks.sliding_window_view(x, spans, axis=tuple(range(2, 2 + nsp)))
    idx = (slice(None), slice(None),
           *(slice(0, (p - 1) * s + 1, s) for p, s in zip(out, strides)),
           *(slice(None, None, d) for d in dilations))
    return v[idx]


def _pad_spatial(x: np.ndarray, pads: tuple[int, ...], value: float,
                 extra_end: tuple[int, ...] = ()) -> np.ndarray:
    nsp = x.ndim - 2
    extra = extra_end or (0,) * nsp
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[nsp + i] + extra[i]) for i in range(nsp)]
    if not any(b or e for b, e in widths):
        return x
    return np.pad(x, widths, constant_values=value)


def conv(x: np.ndarray, w: np.ndarray, at: o.ConvAttrs, out: tuple[int, ...]) -> np.ndarray:
    """Grouped N-d convolution (cross-correlation) by im2col and one matmul per group."""
    n, c = x.shape[:2]
    m, g = w.shape[0], at.group
    cols = windows(_pad_spatial(x, at.pads, 0), at.kernel, at.strides, at.dilations, out)
    nsp, p = len(out), math.prod(out)
    k = math.prod(at.kernel)
    # (N, G, C/G, *out, *kernel) -> (G, N * P, C/G * K)
    cols = cols.reshape(n, g, c // g, p, k).transpose(1, 0, 3, 2, 4).reshape(g, n * p, -1)
    wg = w.reshape(g, m // g, -1).transpose(0, 2, 1)  # (G, C/G * K, M/G)
    y = np.matmul(cols, wg)  # (G, N * P, M/G)
    y = y.reshape(g, n, p, m // g).transpose(1, 0, 3, 2).reshape(n, m, *out)
    assert y.ndim == nsp + 2
    return y


def _conv(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.ConvAttrs)
    y = conv(a[0], a[1], n.attrs, n.shape[2:])
    if len(a) == 3:
        y = y + a[2].reshape(-1, *([1] * (y.ndim - 2)))
    return y


def conv_transpose(x: np.ndarray, w: np.ndarray, at: o.ConvTransposeAttrs,
                   out: tuple[int, ...]) -> np.ndarray:
    """Each input pixel scatters input × kernel into the output (col2im), then the pads crop."""
    n, c, *size = x.shape
    g, nsp = at.group, len(size)
    mg = w.shape[1]
    # (G, N * P, C/G) @ (G, C/G, M/G * K) -> (N, *size, M, *kernel)
    xg = x.reshape(n, g, c // g, -1).transpose(1, 0, 3, 2).reshape(g, -1, c // g)
    cols = np.matmul(xg, w.reshape(g, c // g, -1))
    cols = cols.reshape(g, n, *size, mg, *at.kernel)
    cols = np.moveaxis(cols, 0, 1 + nsp).reshape(n, *size, g * mg, *at.kernel)
    full = [at.strides[i] * (size[i] - 1) + at.output_padding[i]
            + (at.kernel[i] - 1) * at.dilations[i] + 1 for i in range(nsp)]
    y = np.zeros((n, g * mg, *full), dtype=np.result_type(x, w))
    spatial_first = np.moveaxis(cols, 1 + nsp, 1)  # (N, M, *size, *kernel)
    for k in np.ndindex(*at.kernel):
        dst = tuple(slice(k[i] * at.dilations[i],
                          k[i] * at.dilations[i] + (size[i] - 1) * at.strides[i] + 1,
                          at.strides[i]) for i in range(nsp))
        y[(slice(None), slice(None)) + dst] += spatial_first[(Ellipsis,) + k]
    crop = tuple(slice(at.pads[i], at.pads[i] + out[i]) for i in range(nsp))
    return y[(slice(None), slice(None)) + crop]


def _conv_transpose(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.ConvTransposeAttrs)
    y = conv_transpose(a[0], a[1], n.attrs, n.shape[2:])
    if len(a) == 3:
        y = y + a[2].reshape(-1, *([1] * (y.ndim - 2)))
    return y


def _pool(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.PoolAttrs)
    x, out = a[0], n.shape[2:]
    nsp = len(out)
    # ceil_mode windows may run past the end padding: pad further, never counting those cells.
    need = [(p - 1) * s + (k - 1) * d + 1 for p, s, k, d in
            zip(out, at.strides, at.kernel, at.dilations)]
    extra = tuple(max(0, need[i] - (x.shape[2 + i] + at.pads[i] + at.pads[nsp + i]))
                  for i in range(nsp))
    axes = tuple(range(2 + nsp, 2 + 2 * nsp))
    if n.op is Op.MAX_POOL:
        lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        win = windows(_pad_spatial(x, at.pads, lowest, extra), at.kernel, at.strides,
                      at.dilations, out)
        return win.max(axis=axes)
    win = windows(_pad_spatial(x, at.pads, 0, extra), at.kernel, at.strides, at.dilations, out)
    total = win.sum(axis=axes)
    ones = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
    mask = _pad_spatial(ones, at.pads, 1 if at.count_include_pad else 0)
    mask = _pad_spatial(mask, (0,) * nsp + extra, 0)  # ceil-mode cells never count
    count = windows(mask, at.kernel, at.strides, at.dilations, out).sum(axis=axes)
    return total / count


def _lp_pool(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.LpPoolAttrs)
    x, out, pool = a[0], n.shape[2:], at.pool
    nsp = len(out)
    win = windows(_pad_spatial(np.abs(x) ** at.p, pool.pads, 0), pool.kernel, pool.strides,
                  pool.dilations, out)
    return win.sum(axis=tuple(range(2 + nsp, 2 + 2 * nsp))) ** (1 / at.p)


def _lrn(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.LrnAttrs)
    x = a[0]
    sq = np.pad(x * x, [(0, 0), ((at.size - 1) // 2, at.size // 2)] + [(0, 0)] * (x.ndim - 2))
    total = sum(sq[:, i:i + x.shape[1]] for i in range(at.size))
    return x / (at.bias + at.alpha / at.size * total) ** at.beta


def _reverse_sequence(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.ReverseSequenceAttrs)
    x = np.moveaxis(a[0], (at.batch_axis, at.time_axis), (0, 1)).copy()
    for b, length in enumerate(a[1].astype(np.int64)):
        x[b, :length] = x[b, :length][::-1]
    return np.moveaxis(x, (0, 1), (at.batch_axis, at.time_axis))


def _einsum(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.EinsumAttrs)
    return np.einsum(n.attrs.equation, *a)


def _max_pool_index(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.PoolAttrs)
    x, out = a[0], n.shape[2:]
    nsp = len(out)
    # Flat index of every input element (batch and channel included), spatial axes row-major
    # or, with column_major, reversed.
    nc, spatial = x.shape[:2], x.shape[2:]
    order = tuple(reversed(range(nsp))) if at.column_major else tuple(range(nsp))
    local = np.arange(math.prod(spatial)).reshape([spatial[i] for i in order])
    local = local.transpose(np.argsort(order))
    index = (np.arange(math.prod(nc)).reshape(*nc, *([1] * nsp)) * math.prod(spatial) + local)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    need = [(p - 1) * s + (k - 1) * d + 1 for p, s, k, d in
            zip(out, at.strides, at.kernel, at.dilations, strict=True)]
    extra = tuple(max(0, need[i] - (x.shape[2 + i] + at.pads[i] + at.pads[nsp + i]))
                  for i in range(nsp))
    win = windows(_pad_spatial(x, at.pads, lowest, extra), at.kernel, at.strides, at.dilations,
                  out)
    idx = windows(_pad_spatial(index, at.pads, -1, extra), at.kernel, at.strides, at.dilations,
                  out)
    flat = (*win.shape[:2 + nsp], -1)
    best = _first_best(win.reshape(flat), -1, largest=True, last=False,
                      valid=idx.reshape(flat) >= 0)
    return np.take_along_axis(idx.reshape(flat), best, axis=-1)[..., 0]


def _col2im(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.ConvAttrs)
    x, image = a[0], n.shape[2:]
    nsp = len(image)
    cols = conv_shape(n.shape, (1, n.shape[1], *at.kernel), at)[2:]  # block positions per axis
    blocks = x.reshape(n.shape[0], n.shape[1], *at.kernel, *cols)
    padded = [image[i] + at.pads[i] + at.pads[nsp + i] for i in range(nsp)]
    y = np.zeros((*n.shape[:2], *padded), dtype=x.dtype)
    for k in np.ndindex(*at.kernel):
        dst = tuple(slice(k[i] * at.dilations[i],
                          k[i] * at.dilations[i] + (cols[i] - 1) * at.strides[i] + 1,
                          at.strides[i]) for i in range(nsp))
        y[(slice(None), slice(None)) + dst] += blocks[(slice(None), slice(None)) + k]
    crop = tuple(slice(at.pads[i], at.pads[i] + image[i]) for i in range(nsp))
    return y[(slice(None), slice(None)) + crop]


def _batch_norm(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.EpsilonAttrs)
    x, scale, bias, mean, var = a
    shape = (-1, *([1] * (x.ndim - 2)))
    inv = scale / np.sqrt(var + np.asarray(n.attrs.epsilon, var.dtype))
    return (x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)


def _layer_norm(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.EpsilonAttrs)
    x = a[0].astype(np.float32) if a[0].dtype.itemsize < 4 else a[0]
    axes = tuple(range(n.attrs.axis, x.ndim))
    d = x - x.mean(axis=axes, keepdims=True)
    var = (d * d).mean(axis=axes, keepdims=True)
    y = (d / np.sqrt(var + np.asarray(n.attrs.epsilon, x.dtype))).astype(a[0].dtype) * a[1]
    return y + a[2] if len(a) == 3 else y


def _pad(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.PadAttrs)
    x, r = a[0], a[0].ndim
    crop = tuple(slice(max(0, -at.pads[i]), x.shape[i] - max(0, -at.pads[r + i]))
                 for i in range(r))
    x = x[crop]
    widths = [(max(0, at.pads[i]), max(0, at.pads[r + i])) for i in range(r)]
    if at.mode == "constant":
        return np.pad(x, widths, constant_values=np.asarray(at.value).astype(x.dtype))
    return np.pad(x, widths, mode=at.mode)  # type: ignore[call-overload]


def _slice(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.SliceAttrs)
    return a[0][tuple(slice(b, e if e >= 0 else None, s)
                      for b, e, s in zip(at.starts, at.ends, at.steps))]


def _reduce(f: Callable[..., np.ndarray]) -> Kernel:
    def k(n: Node, a: list[np.ndarray]) -> np.ndarray:
        assert isinstance(n.attrs, o.ReduceAttrs)
        return f(a[0], axis=n.attrs.axes, keepdims=n.attrs.keepdims)
    return k


def _lowest(dtype: np.dtype) -> np.ndarray:
    return np.asarray(-np.inf if dtype.kind == "f" else
                      False if dtype.kind == "b" else np.iinfo(dtype).min, dtype)


def _highest(dtype: np.dtype) -> np.ndarray:
    return np.asarray(np.inf if dtype.kind == "f" else
                      True if dtype.kind == "b" else np.iinfo(dtype).max, dtype)


def _reduce_max(x: np.ndarray, **k: object) -> np.ndarray:
    return np.max(x, initial=_lowest(x.dtype), **k)  # type: ignore[call-overload]


def _reduce_min(x: np.ndarray, **k: object) -> np.ndarray:
    return np.min(x, initial=_highest(x.dtype), **k)  # type: ignore[call-overload]


def _log_sum_exp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # all -inf (or inf) along the axes: no shift
    y = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return y if keepdims else np.squeeze(y, axis=axis)


def _isinf(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.IsInfAttrs)
    x = a[0]
    return (np.isposinf(x) & at.detect_positive) | (np.isneginf(x) & at.detect_negative)


def _trilu(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.TriluAttrs)
    return np.triu(a[0], at.k) if at.upper else np.tril(a[0], at.k)


def _gather_elements(n: Node, a: list[np.ndarray]) -> np.ndarray:
    x, idx, axis = a[0], a[1].astype(np.int64), _axis(n)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return np.take_along_axis(x, idx, axis=axis)


def _cum(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.CumAttrs)
    x = np.flip(a[0], at.axis) if at.reverse else a[0]
    f, unit = (np.cumsum, 0) if n.op is Op.CUMSUM else (np.cumprod, 1)
    y = f(x, axis=at.axis, dtype=x.dtype)
    if at.exclusive:
        first = np.full_like(np.take(y, [0], axis=at.axis), unit)
        y = np.concatenate([first, np.take(y, range(y.shape[at.axis] - 1), axis=at.axis)],
                           axis=at.axis)
    return np.flip(y, at.axis) if at.reverse else y


def resize_coordinates(at: o.ResizeAttrs, axis: int, n_in: int, n_out: int) -> np.ndarray:
    """Input coordinate of each output index along one axis (float64)."""
    i = np.arange(n_out, dtype=np.float64)
    s = at.scales[axis]
    mode = at.coordinate_mode
    if mode == "half_pixel":
        return (i + 0.5) / s - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (s * n_in)
        return n_in / 2 * (1 - adjustment) + (i + 0.5) / s - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / s - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "align_corners":  # the resized length is n_in * s, before rounding down
        return i * (n_in - 1) / (n_in * s - 1) if n_out > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return i / s
    begin, end = at.roi[axis], at.roi[len(at.roi) // 2 + axis]
    if n_out == 1:
        return np.full(n_out, 0.5 * (begin + end) * (n_in - 1))
    return begin * (n_in - 1) + i * (end - begin) * (n_in - 1) / (n_out - 1)


def _resize_taps(at: o.ResizeAttrs, x: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each (n_out, taps): output = sum of weights * input[indices]."""
    if at.mode == "nearest":
        frac = x - np.floor(x)
        if at.nearest_mode == "round_prefer_floor":
            idx = np.where(frac == 0.5, np.floor(x), np.round(x))
        elif at.nearest_mode == "round_prefer_ceil":
            idx = np.where(frac == 0.5, np.ceil(x), np.round(x))
        else:
            idx = np.floor(x) if at.nearest_mode == "floor" else np.ceil(x)
        return idx[:, None].astype(np.int64), np.ones((len(x), 1))
    x0 = np.floor(x)
    r = (x - x0)[:, None]
    if at.mode == "linear":
        offsets, weights = np.array([0, 1]), np.concatenate([1 - r, r], axis=1)
    else:
        a = at.cubic_a
        d = np.concatenate([r + 1, r, 1 - r, 2 - r], axis=1)  # distance to each of 4 taps
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        offsets, weights = np.array([-1, 0, 1, 2]), np.where(d <= 1, near, far)
    idx = x0[:, None].astype(np.int64) + offsets
    if at.exclude_outside:
        weights = np.where((idx >= 0) & (idx < n_in), weights, 0)
        weights = weights / weights.sum(axis=1, keepdims=True)
    return idx, weights


def _resize(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.ResizeAttrs)
    y = a[0]
    out_dtype = y.dtype
    for axis in reversed(range(y.ndim)):
        n_in, n_out = y.shape[axis], n.shape[axis]
        if n_in == n_out and at.scales[axis] == 1 and at.coordinate_mode != "tf_crop_and_resize":
            continue
        x = resize_coordinates(at, axis, n_in, n_out)
        idx, w = _resize_taps(at, x, n_in)
        taps = np.take(y.astype(np.float64), np.clip(idx, 0, n_in - 1), axis=axis)
        # taps: (..., n_out, n_taps, ...) -> weighted sum over the tap axis
        shape = [1] * taps.ndim
        shape[axis], shape[axis + 1] = w.shape
        y = (taps * w.reshape(shape)).sum(axis=axis + 1)
        if at.coordinate_mode == "tf_crop_and_resize":
            outside = ((x < 0) | (x > n_in - 1)).reshape(
                [n_out if i == axis else 1 for i in range(y.ndim)])
            y = np.where(outside, at.extrapolation_value, y)
    if np.dtype(out_dtype).kind in "iu":
        return np.clip(np.rint(y), np.iinfo(out_dtype).min, np.iinfo(out_dtype).max)
    return y


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Fold x into [lo, hi] by reflecting at the borders as often as needed."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    t = np.mod(x - lo, 2 * span)
    return lo + np.where(t > span, 2 * span - t, t)


def _grid_sample(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.GridSampleAttrs)
    x, grid = a
    dims = x.shape[2:]
    nsp = len(dims)
    g = grid.astype(np.float64)
    lo = [0.0 if at.align_corners else -0.5] * nsp
    hi = [d - 1.0 if at.align_corners else d - 0.5 for d in dims]
    coords = []
    for i, d in enumerate(dims):
        c = g[..., nsp - 1 - i]  # the grid lists the innermost axis first
        c = (c + 1) / 2 * (d - 1) if at.align_corners else ((c + 1) * d - 1) / 2
        if at.mode == "nearest":
            c = np.rint(c)
        if at.padding_mode == "border":
            c = np.where((c < lo[i]) | (c > hi[i]), np.clip(c, 0, d - 1), c)
        elif at.padding_mode == "reflection":
            c = np.where((c < lo[i]) | (c > hi[i]), _reflect(c, lo[i], hi[i]), c)
        coords.append(c)
    # Taps per axis: integer positions and weights, each (N, *out, taps).
    taps = []
    for c in coords:
        c0 = np.floor(c)
        r = (c - c0)[..., None]
        if at.mode == "nearest":
            taps.append((c[..., None].astype(np.int64), np.ones_like(r)))
        elif at.mode == "linear":
            taps.append((c0[..., None].astype(np.int64) + np.array([0, 1]),
                         np.concatenate([1 - r, r], axis=-1)))
        else:
            cubic = o.ResizeAttrs((1.0,), "cubic")
            idx, w = _resize_taps(cubic, c.reshape(-1), 0)
            taps.append((idx.reshape(*c.shape, 4), w.reshape(*c.shape, 4)))
    xt = np.moveaxis(x, 1, -1).astype(np.float64)  # (N, *dims, C)
    batch = np.arange(x.shape[0]).reshape(-1, *([1] * (grid.ndim - 2)))
    y = np.zeros((*grid.shape[:-1], x.shape[1]))
    for combo in itertools.product(*(range(t[0].shape[-1]) for t in taps)):
        weight = np.ones(grid.shape[:-1])
        index, inside = [], np.ones(grid.shape[:-1], dtype=bool)
        for i, k in enumerate(combo):
            idx, w = taps[i][0][..., k], taps[i][1][..., k]
            weight = weight * w
            if at.padding_mode == "zeros":
                inside &= (idx >= 0) & (idx < dims[i])
            elif at.padding_mode == "reflection":
                idx = _reflect(idx.astype(np.float64), lo[i], hi[i]).astype(np.int64)
            index.append(np.clip(idx, 0, dims[i] - 1))
        values = xt[tuple([batch, *index])]
        y += np.where(inside[..., None], values, 0) * weight[..., None]
    return np.moveaxis(y, -1, 1)


def _topk(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.TopKAttrs)
    x, ax = a[0], at.axis
    if at.largest:
        # Stable ascending sort of the reversed axis, reversed again: descending, ties by the
        # lower index.
        rev = np.argsort(np.flip(x, ax), axis=ax, kind="stable")
        idx = x.shape[ax] - 1 - np.flip(rev, ax)
    else:
        idx = np.argsort(x, axis=ax, kind="stable")
    return np.take(idx, range(at.k), axis=ax)


_REDUCE_AT = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_elements(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.ScatterAttrs)
    x, idx, upd = a[0].copy(), a[1].astype(np.int64), a[2]
    idx = np.where(idx < 0, idx + x.shape[at.axis], idx)
    full: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    full[at.axis] = idx
    where = tuple(np.broadcast_arrays(*full))
    if at.reduction == "none":
        x[where] = upd
    else:
        _REDUCE_AT[at.reduction].at(x, where, upd)
    return x


def _scatter_nd(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.ScatterAttrs)
    x, idx, upd = a[0].copy(), a[1].astype(np.int64), a[2]
    k = idx.shape[-1]
    where = tuple(np.moveaxis(idx, -1, 0)[i] for i in range(k))
    if at.reduction == "none":
        x[where] = upd
    else:
        _REDUCE_AT[at.reduction].at(x, where, upd)
    return x


def _gather_nd(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.GatherNdAttrs)
    x, idx, b = a[0], a[1].astype(np.int64), at.batch_dims
    batch = int(np.prod(x.shape[:b], dtype=np.int64))
    xb = x.reshape(batch, *x.shape[b:])
    ib = idx.reshape(batch, -1, idx.shape[-1])
    out = np.stack([xb[i][tuple(ib[i].T)] for i in range(batch)])
    return out.reshape(n.shape)


def _first_best(x: np.ndarray, axis: int, largest: bool, last: bool,
               valid: np.ndarray | None = None) -> np.ndarray:
    """Index along `axis` (kept, size 1) of the maximum (minimum) as onnxruntime's ArgMax /
    ArgMin / MaxPool indices find it: the first (`valid`) element starts, and a later one
    replaces it only if greater (or equal, with `last`). NaN compares false, so it is chosen
    only when it comes first: argmax([1, nan, 3]) = 2, argmax([nan, 1, 3]) = 0."""
    x = np.moveaxis(x, axis, -1)
    ok = np.ones(x.shape, bool) if valid is None else np.moveaxis(valid, axis, -1)
    best = np.full(x.shape[:-1], -1, np.int64)
    cur = np.zeros(x.shape[:-1], x.dtype)
    with np.errstate(invalid="ignore"):
        for j in range(x.shape[-1]):
            v = x[..., j]
            if largest:
                better = v >= cur if last else v > cur
            else:
                better = v <= cur if last else v < cur
            take = ok[..., j] & ((best < 0) | better)
            best = np.where(take, j, best)
            cur = np.where(take, v, cur)
    return np.expand_dims(np.maximum(best, 0), axis)


def _hardmax(n: Node, a: list[np.ndarray]) -> np.ndarray:
    x, axis = a[0], _axis(n)
    i = _first_best(x, axis, largest=True, last=False)
    y = np.zeros_like(x)
    np.put_along_axis(y, i, 1, axis=axis)
    return y


def _arg(n: Node, a: list[np.ndarray]) -> np.ndarray:
    at = n.attrs
    assert isinstance(at, o.ArgAttrs)
    i = _first_best(a[0], at.axis, largest=n.op is Op.ARGMAX, last=at.select_last_index)
    return i if at.keepdims else np.squeeze(i, axis=at.axis)


def _per_axis(v: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """Reshape a scalar or 1-D quantisation parameter to broadcast along axis."""
    if v.ndim == 0:
        return v
    return v.reshape([-1 if i == axis else 1 for i in range(rank)])


def saturate(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round half to even and saturate to an integer dtype."""
    info = np.iinfo(dtype)
    return np.clip(np.rint(y), info.min, info.max).astype(dtype)


def _quantize(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.AxisAttrs)
    x, scale, zp = a
    ax = n.attrs.axis
    y = np.rint(x / _per_axis(scale, ax, x.ndim)) + _per_axis(zp, ax, x.ndim).astype(np.float64)
    return saturate(y, n.dtype.np)


def _dequantize(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.AxisAttrs)
    x, scale, zp = a
    ax = n.attrs.axis
    d = x.astype(np.int32) - _per_axis(zp, ax, x.ndim).astype(np.int32)
    return d.astype(scale.dtype) * _per_axis(scale, ax, x.ndim)


def _conv_integer(x: np.ndarray, xzp: np.ndarray, w: np.ndarray, wzp: np.ndarray,
                  at: o.ConvAttrs, out: tuple[int, ...]) -> np.ndarray:
    xi = x.astype(np.int64) - xzp.astype(np.int64)
    wi = w.astype(np.int64) - _per_axis(wzp, 0, w.ndim).astype(np.int64)
    return conv(xi, wi, at, out)


def _qlinear_conv(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.ConvAttrs)
    x, xs, xzp, w, ws, wzp, ys, yzp = a[:8]
    acc = _conv_integer(x, xzp, w, wzp, n.attrs, n.shape[2:])
    if len(a) == 9:
        acc = acc + a[8].astype(np.int64).reshape(-1, *([1] * (acc.ndim - 2)))
    scale = (xs * _per_axis(ws, 1, acc.ndim)) / ys
    return saturate(acc * scale + yzp.astype(np.float64), n.dtype.np)


def _rows(v: np.ndarray, rank: int) -> np.ndarray:
    """A per-row (1-D) parameter of the left matmul operand broadcast over its rows."""
    return v.reshape(*v.shape, 1) if v.ndim >= 1 else v


def _qlinear_matmul(n: Node, a: list[np.ndarray]) -> np.ndarray:
    x, xs, xzp, w, ws, wzp, ys, yzp = a
    xi = x.astype(np.int64) - _rows(xzp, x.ndim).astype(np.int64)
    wi = w.astype(np.int64) - wzp.astype(np.int64)
    acc = np.matmul(xi, wi)
    return saturate(acc * ((_rows(xs, x.ndim) * ws) / ys) + yzp.astype(np.float64), n.dtype.np)


def _wrap32(v: np.ndarray) -> np.ndarray:
    """int64 values as int32 two's-complement (the low 32 bits), still held in int64."""
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def requantize(x: np.ndarray, bias: np.ndarray | None, a: o.RequantAttrs,
               out: np.dtype) -> np.ndarray:
    """REQUANTIZE, step by step in 32-bit wrapping arithmetic (see `ops.RequantAttrs`): the
    integer reference the CPU backend and the accelerator must equal bit for bit."""
    shape = [1] * x.ndim
    shape[a.axis] = -1

    def per_channel(vals: tuple[int, ...]) -> np.ndarray:
        return np.asarray(vals, np.int64).reshape(shape if len(vals) > 1 else [1] * x.ndim)

    t = x.astype(np.int64)
    if any(a.pre_shift):
        # floor((x + bias + 2**(p-1)) / 2**p) without forming x + bias: low bits, shift, high
        p = per_channel(a.pre_shift)
        b = np.zeros(1, np.int64) if bias is None else bias.astype(np.int64)
        b = b.reshape(shape if b.size > 1 else [1] * x.ndim)
        low = (b & ((1 << p) - 1)) + np.where(p > 0, np.left_shift(1, np.maximum(p - 1, 0)), 0)
        t = _wrap32(np.right_shift(_wrap32(t + low), p) + (b >> p))
    elif bias is not None:
        t = _wrap32(t + bias.astype(np.int64).reshape(shape))
    if any(a.clamp):
        c = per_channel(a.clamp)
        t = np.where(c > 0, np.clip(t, -c, c), t)
    t = _wrap32(t * per_channel(a.multiplier))
    s = per_channel(a.shift)
    t = _wrap32(t + np.where(s > 0, np.left_shift(1, np.maximum(s - 1, 0)), 0))
    t = _wrap32(np.right_shift(t, s) + a.zero_point)
    return np.clip(t, a.lo, a.hi).astype(out)


def _matmul_integer(n: Node, a: list[np.ndarray]) -> np.ndarray:
    x, w, xzp, wzp = a
    xi = x.astype(np.int32) - _rows(xzp, x.ndim).astype(np.int32)
    return np.matmul(xi, w.astype(np.int32) - wzp.astype(np.int32))


def _attr(n: Node, name: str) -> float:
    return float(getattr(n.attrs, name))


def _axis(n: Node) -> int:
    assert isinstance(n.attrs, o.AxisAttrs)
    return n.attrs.axis


def _cast(n: Node, a: list[np.ndarray]) -> np.ndarray:
    x = a[0]
    if n.dtype.is_int and x.dtype.kind == "f":
        # Out-of-range float -> int is undefined in ONNX; numpy warns on NaN, which is legal input.
        with np.errstate(invalid="ignore"):
            return x.astype(n.dtype.np)
    return x.astype(n.dtype.np)


def _mod(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.ModAttrs)
    return (np.fmod if n.attrs.fmod else np.mod)(a[0], a[1])


def _transpose(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.TransposeAttrs)
    return a[0].transpose(n.attrs.perm)


def _tile(n: Node, a: list[np.ndarray]) -> np.ndarray:
    assert isinstance(n.attrs, o.TileAttrs)
    return np.tile(a[0], n.attrs.repeats)


def _scalar(x: np.ndarray, value: float) -> np.ndarray:
    """value as a 0-d array of x's dtype, so float32 arithmetic stays float32."""
    return np.asarray(value, x.dtype)


KERNELS: dict[Op, Kernel] = {
    Op.CONST: lambda n, a: n.value,
    Op.IDENTITY: _unary(lambda x: x),
    Op.CAST: _cast,
    Op.RELU: _unary(lambda x: np.maximum(x, np.zeros((), x.dtype))),
    Op.SIGMOID: _unary(lambda x: 1 / (1 + np.exp(-x))),
    Op.TANH: _unary(np.tanh), Op.EXP: _unary(np.exp), Op.LOG: _unary(np.log),
    Op.SQRT: _unary(np.sqrt), Op.ERF: _unary(erf), Op.NEG: _unary(np.negative),
    Op.ABS: _unary(np.abs), Op.RECIPROCAL: _unary(np.reciprocal), Op.FLOOR: _unary(np.floor),
    Op.CEIL: _unary(np.ceil), Op.ROUND: _unary(np.rint), Op.SIN: _unary(np.sin),
    Op.COS: _unary(np.cos), Op.TAN: _unary(np.tan), Op.ASIN: _unary(np.arcsin),
    Op.ACOS: _unary(np.arccos), Op.ATAN: _unary(np.arctan), Op.SINH: _unary(np.sinh),
    Op.COSH: _unary(np.cosh), Op.ASINH: _unary(np.arcsinh), Op.ACOSH: _unary(np.arccosh),
    Op.ATANH: _unary(np.arctanh), Op.SIGN: _unary(np.sign), Op.NOT: _unary(np.logical_not),
    Op.ISNAN: _unary(np.isnan),
    Op.SOFTPLUS: _unary(lambda x: np.logaddexp(np.zeros((), x.dtype), x)),
    Op.SOFTSIGN: _unary(lambda x: x / (1 + np.abs(x))),
    Op.HARD_SWISH: _unary(lambda x: x * np.clip(x / 6 + np.asarray(0.5, x.dtype), 0, 1)),
    Op.MISH: _unary(lambda x: x * np.tanh(np.logaddexp(np.zeros((), x.dtype), x))),
    Op.LEAKY_RELU: lambda n, a: np.where(a[0] >= 0, a[0], a[0] * _scalar(a[0], _attr(n, "alpha"))),
    Op.ELU: lambda n, a: np.where(a[0] > 0, a[0], _scalar(a[0], _attr(n, "alpha"))
                                  * np.expm1(np.minimum(a[0], 0))),
    Op.CELU: lambda n, a: np.maximum(a[0], 0) + np.minimum(
        0, _scalar(a[0], _attr(n, "alpha")) * np.expm1(a[0] / _scalar(a[0], _attr(n, "alpha")))),
    Op.SELU: lambda n, a: _scalar(a[0], _attr(n, "gamma")) * np.where(
        a[0] > 0, a[0], _scalar(a[0], _attr(n, "alpha")) * np.expm1(np.minimum(a[0], 0))),
    Op.THRESHOLDED_RELU: lambda n, a: np.where(a[0] > _attr(n, "alpha"), a[0], 0),
    Op.HARD_SIGMOID: lambda n, a: np.clip(a[0] * _scalar(a[0], _attr(n, "alpha"))
                                          + _scalar(a[0], _attr(n, "beta")), 0, 1),
    Op.GELU: _gelu, Op.CLIP: _clip,
    Op.ADD: _binary(np.add), Op.SUB: _binary(np.subtract), Op.MUL: _binary(np.multiply),
    Op.DIV: _binary(_int_div), Op.POW: _binary(_pow),
    Op.MOD: _mod,
    Op.MAX: _binary(np.maximum), Op.MIN: _binary(np.minimum),
    Op.PRELU: lambda n, a: np.where(a[0] >= 0, a[0], a[0] * a[1]),
    Op.EQUAL: _binary(np.equal), Op.LESS: _binary(np.less), Op.GREATER: _binary(np.greater),
    Op.LESS_EQUAL: _binary(np.less_equal), Op.GREATER_EQUAL: _binary(np.greater_equal),
    Op.AND: _binary(np.logical_and), Op.OR: _binary(np.logical_or),
    Op.XOR: _binary(np.logical_xor), Op.WHERE: lambda n, a: np.where(a[0], a[1], a[2]),
    Op.MATMUL: _with_epilogue(_matmul), Op.GEMM: _with_epilogue(_gemm),
    Op.CONV: _with_epilogue(_conv), Op.FUSED_ELEMENTWISE: _fused_elementwise,
    Op.CONV_TRANSPOSE: _conv_transpose,
    Op.MAX_POOL: _pool, Op.AVG_POOL: _pool, Op.MAX_POOL_INDEX: _max_pool_index,
    Op.COL2IM: _col2im,
    Op.GLOBAL_AVG_POOL: lambda n, a: a[0].mean(axis=tuple(range(2, a[0].ndim)), keepdims=True),
    Op.GLOBAL_MAX_POOL: lambda n, a: a[0].max(axis=tuple(range(2, a[0].ndim)), keepdims=True),
    Op.BATCH_NORM: _batch_norm, Op.LAYER_NORM: _layer_norm,
    Op.SOFTMAX: lambda n, a: _softmax(a[0], _axis(n)),
    Op.LOG_SOFTMAX: lambda n, a: _log_softmax(a[0], _axis(n)),
    Op.RESHAPE: lambda n, a: a[0].reshape(n.shape),
    Op.TRANSPOSE: _transpose,
    Op.CONCAT: lambda n, a: np.concatenate(a, axis=_axis(n)),
    Op.PAD: _pad, Op.SLICE: _slice,
    Op.GATHER: lambda n, a: np.take(a[0], a[1].astype(np.int64), axis=_axis(n)),
    Op.EXPAND: lambda n, a: np.broadcast_to(a[0], n.shape).copy(),
    Op.TILE: _tile,
    Op.REDUCE_SUM: _reduce(np.sum), Op.REDUCE_MEAN: _reduce(np.mean),
    Op.REDUCE_MAX: _reduce(_reduce_max), Op.REDUCE_MIN: _reduce(_reduce_min),
    Op.REDUCE_LOG_SUM: _reduce(lambda x, **k: np.log(np.sum(x, **k))),
    Op.REDUCE_PROD: _reduce(np.prod),
    Op.REDUCE_L1: _reduce(lambda x, **k: np.sum(np.abs(x), **k)),
    Op.REDUCE_L2: _reduce(lambda x, **k: np.sqrt(np.sum(x * x, **k))),
    Op.REDUCE_SUM_SQUARE: _reduce(lambda x, **k: np.sum(x * x, **k)),
    Op.REDUCE_LOG_SUM_EXP: _reduce(_log_sum_exp),
    Op.ARGMAX: _arg, Op.ARGMIN: _arg,
    Op.QUANTIZE_LINEAR: _quantize, Op.DEQUANTIZE_LINEAR: _dequantize,
    Op.QLINEAR_CONV: _qlinear_conv, Op.QLINEAR_MATMUL: _qlinear_matmul,
    Op.MATMUL_INTEGER: _matmul_integer,
    Op.REQUANTIZE: lambda n, a: requantize(a[0], a[1] if len(a) > 1 else None,
                                           n.attrs, n.dtype.np),  # type: ignore[arg-type]
    Op.CONV_INTEGER: lambda n, a: _conv_integer(a[0], a[2], a[1], a[3], n.attrs,  # type: ignore
                                                n.shape[2:]),
    Op.SHL: _binary(np.left_shift), Op.SHR: _binary(np.right_shift),
    Op.BITWISE_AND: _binary(np.bitwise_and), Op.BITWISE_OR: _binary(np.bitwise_or),
    Op.BITWISE_XOR: _binary(np.bitwise_xor), Op.BITWISE_NOT: _unary(np.invert),
    Op.ISINF: _isinf, Op.TRILU: _trilu, Op.GATHER_ELEMENTS: _gather_elements,
    Op.CUMSUM: _cum, Op.CUMPROD: _cum, Op.HARDMAX: _hardmax,
    Op.TOPK: _topk, Op.RESIZE: _resize, Op.GRID_SAMPLE: _grid_sample, Op.LP_POOL: _lp_pool,
    Op.LRN: _lrn,
    Op.EINSUM: _einsum, Op.DET: _unary(np.linalg.det), Op.REVERSE_SEQUENCE: _reverse_sequence,
    Op.SCATTER_ELEMENTS: _scatter_elements, Op.SCATTER_ND: _scatter_nd,
    Op.GATHER_ND: _gather_nd,
}
assert set(KERNELS) == set(Op) - {Op.INPUT}, set(Op) - set(KERNELS)
