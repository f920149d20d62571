"""The accelerator's layers, found in the integer graph.

A *layer* is a group of integer-graph nodes that the accelerator runs as one unit, reading and
writing int8 activations in its packed layout:

- ``conv``: CONV_INTEGER (groups 1, dilation 1, padding <= 15; zero points folded, see
  docs/vta.md "Zero points") or
  MATMUL_INTEGER (a 1x1 convolution over an (M/B) x 1 image), followed by its REQUANTIZE to
  int8 (bias, clamp, multiplier, rounding shift, zero point, ReLU/ReLU6/clip as MIN/MAX);
- ``max_pool``: MAX_POOL of an int8 tensor (its padding the least value the input can take:
  zeros where it cannot be negative, else a frame, `activation_frames`);
- ``avg_pool``: average pooling as the integer graph writes it, with int8 input and output:
  global, ``REQUANTIZE(REDUCE_SUM(CAST(x), axes (2, 3), keepdims))``, or windowed, a depthwise
  CONV_INTEGER with unit weights (an imported QDQ AveragePool) and its REQUANTIZE: the
  window's sum on the ALU, then the requantisation (the division by the window is in its
  multiplier, a zero point's correction in its bias);
- ``add``: the residual add of the integer graph, ``REQUANTIZE(ADD(REQUANTIZE(CAST(a)),
  REQUANTIZE(CAST(b))))`` with int8 ``a``, ``b`` and output.

`find_layers` returns them in graph order with the reason every other candidate node was left
to the CPU (for the compile report).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from vtakit.vta_hw.config import HwConfig

from ...ir.dtypes import DType
from ...ir.graph import Graph
from ...ir.ops import ConvAttrs, Node, Op, PoolAttrs, RequantAttrs

MAX_PAD = 15  # the LOAD's 4-bit padding fields
INT8_MIN, INT8_MAX = -128, 127

__all__ = ["Layer", "ConvLayer", "PoolLayer", "AddLayer", "Operand", "find_layers", "node_dims",
           "operand_dims", "activation_frames", "MAX_PAD"]


@dataclass(frozen=True)
class Operand:
    """An int8 activation a layer reads or writes, as the layer sees it: (N, C, H, W). A matrix
    (..., M, K) is the 1x1-convolution image N=B, C=K, H=M/B, W=1; the input of a dense layer
    that flattens a 4-d activation is that activation's packed blocks as C (see `_flattened`).
    How the value is laid out in device memory depends only on its node (`node_dims`)."""

    node: Node
    n: int
    c: int
    h: int
    w: int
    im2col: tuple[int, ...] = ()  # kh, kw, sh, sw, pad top, left, bottom, right (see _im2col)


def node_dims(n: Node, cfg: HwConfig) -> tuple[int, int, int, int] | None:
    """The (N, C, H, W) of node `n`'s value in device memory: a 4-d activation as it is; a
    matrix (..., M, K) (leading dimensions folded into M) as (B, K, M/B, 1). None if the
    accelerator cannot hold it (not int8, batch not a multiple of the core's)."""
    if n.dtype is not DType.INT8 or n.rank < 2:
        return None
    if n.rank == 4:
        nn, c, h, w = n.shape
        return (nn, c, h, w) if nn % cfg.batch == 0 else None
    m = int(np.prod(n.shape[:-1]))
    if m % cfg.batch:
        return None
    return cfg.batch, n.shape[-1], m // cfg.batch, 1


def operand_dims(x: Operand, cfg: HwConfig) -> tuple[int, int, int, int]:
    """The (N, C, H, W) of the device buffer a layer reads operand `x` from: an im2col input's
    patches (``C*KH*KW`` channels at the output's H x W, which the runtime packs from the host
    value); any other operand its node's value (`node_dims`)."""
    if x.im2col:
        return x.n, x.c, x.h, x.w
    dims = node_dims(x.node, cfg)
    assert dims is not None  # find_layers takes only values the accelerator holds
    return dims


@dataclass
class Layer:
    """Nodes the accelerator runs as one unit; ``out`` is the node whose value it produces.

    ``fill`` is the range of int8 values the padding around its first input may hold for the
    layer to be exact: a convolution's the input's zero point (the integer graph pads ``x -
    z_x`` with zeros), a max pool's any value no larger than its input can be, a layer that
    reads no padding any value. `activation_frames` chooses one value per activation for all
    of its readers."""

    name: str
    kind: str
    nodes: list[Node]
    inputs: list[Operand]
    out: Operand
    fill: tuple[int, int] = (INT8_MIN, INT8_MAX)
    #: per output channel, a bound on |acc + bias| as the integer graph computes the sum its
    #: (last) requantisation starts from; None where unknown (`requant.requant_program`)
    acc_bound: np.ndarray | None = None

    @property
    def macs(self) -> int:
        return 0

    @property
    def pad(self) -> int:
        """The widest padding the layer reads around its first input."""
        return max(getattr(self, "pads", (0,)))


@dataclass
class ConvLayer(Layer):
    weight: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 1, 1), np.int8))
    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    requant: RequantAttrs | None = None
    bias: np.ndarray | None = None

    @property
    def macs(self) -> int:
        o = self.out
        return o.n * o.c * o.h * o.w * self.inputs[0].c * self.kernel[0] * self.kernel[1]


@dataclass
class PoolLayer(Layer):
    """``max_pool``: the window's maximum; ``avg_pool``: its sum, then `requant`."""

    kernel: tuple[int, int] = (1, 1)
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    requant: RequantAttrs | None = None
    bias: np.ndarray | None = None


@dataclass
class AddLayer(Layer):
    """``requant(requant_a(a) + requant_b(b) + bias)``: each operand rescaled to the sum's
    scale, the operands' zero points in the sum's ``bias`` (per output channel)."""

    requant_a: RequantAttrs | None = None
    requant_b: RequantAttrs | None = None
    requant: RequantAttrs | None = None
    bias: np.ndarray | None = None


def _operand(n: Node, cfg: HwConfig) -> Operand | None:
    dims = node_dims(n, cfg)
    return None if dims is None else Operand(n, *dims)


def _flattened(x: Node, cfg: HwConfig) -> tuple[Operand, np.ndarray] | None:
    """A RESHAPE flattening a 4-d int8 activation (B, C, H, W) to (B, C*H*W), read in place: the
    dense layer takes the activation's packed elements (channel block, row, column; BI lanes
    each) as its Cb*H*W*BI input channels, and `order[k']` is the flattened index of channel
    k' (-1 for a padding lane)."""
    if x.op is not Op.RESHAPE or x.rank != 2:
        return None
    a = x.src[0]
    if a.rank != 4 or a.dtype is not DType.INT8 or a.shape[0] != cfg.batch \
            or x.shape != (a.shape[0], int(np.prod(a.shape[1:]))):
        return None
    _, c, h, w = a.shape
    bi = cfg.block_in
    cb = -(-c // bi)
    idx = np.arange(cb * bi)  # channel of each (block, lane)
    chan = idx.reshape(cb, 1, 1, bi)
    hw = np.arange(h * w).reshape(1, h, w, 1)
    order = np.where(chan < c, chan * h * w + hw.reshape(1, h, w, 1), -1)
    return Operand(a, cfg.batch, cb * h * w * bi, 1, 1), order.reshape(-1)


def _zero(n: Node) -> bool:
    return n.op is Op.CONST and not np.any(n.value)


def _single_requant(n: Node, users: dict[Node, list[Node]], out_dtype: DType) -> Node | None:
    us = users.get(n, [])
    if len(us) == 1 and us[0].op is Op.REQUANTIZE and us[0].src[0] is n \
            and us[0].dtype is out_dtype:
        return us[0]
    return None


def _requant_ok(rq: Node, channels: int, channel_axis: int) -> str | None:
    a = rq.attrs
    assert isinstance(a, RequantAttrs)
    per_channel = max(len(a.multiplier), len(a.shift), len(getattr(a, "clamp", ())) or 1)
    if per_channel > 1 and a.axis != channel_axis:
        return f"per-channel requantisation along axis {a.axis}, not the channel axis"
    if len(rq.src) > 1 and (rq.src[1].op is not Op.CONST or rq.src[1].value.size != channels):
        return "a bias that is not a constant per output channel"
    return None


def find_layers(g: Graph, cfg: HwConfig) -> tuple[list[Layer], dict[str, str]]:
    """The layers of `g` the accelerator can run, in graph order, and for every conv / matmul
    / pool / add node left to the CPU the reason."""
    users = g.users()
    layers: list[Layer] = []
    why: dict[str, str] = {}
    claimed: set[int] = set()
    same_blocks = cfg.block_in == cfg.block_out
    for n in g.nodes:
        if id(n) in claimed:
            continue
        reason: str | None
        layer: Layer | None = None
        if n.op in (Op.CONV_INTEGER, Op.MATMUL_INTEGER):
            layer, reason = _conv(n, users, cfg)
        elif n.op is Op.MAX_POOL:
            layer, reason = _pool(n, cfg) if same_blocks else (
                None, "block_in != block_out: pooling reads the OUT layout as ACC rows")
        elif n.op is Op.REDUCE_SUM and n.dtype is DType.INT32 and n.rank == 4 \
                and n.src[0].op is Op.CAST:  # a pooling sum, not any integer reduction
            layer, reason = _avg_pool(n, users, cfg) if same_blocks else (
                None, "block_in != block_out: pooling reads the OUT layout as ACC rows")
        elif n.op is Op.ADD and n.dtype is DType.INT32:
            layer, reason = _add(n, users, cfg) if same_blocks else (
                None, "block_in != block_out: the add reads the OUT layout as ACC rows")
        else:
            continue
        if layer is None:
            why[n.name] = reason or "not supported"
            continue
        claimed.update(id(m) for m in layer.nodes)
        layers.append(layer)
    made = {id(L.out.node) for L in layers}
    layers = [_im2col(L, users, cfg) if isinstance(L, ConvLayer) and id(L.inputs[0].node)
              not in made else L for L in layers]
    return _agree_on_fills(layers, why), why


def _agree_on_fills(layers: list[Layer], why: dict[str, str]) -> list[Layer]:
    """The layers whose padding every other reader of the same activation can share: the
    first reader (in graph order) of each activation sets the range its padding may take, and
    a later one whose range does not meet it runs on the CPU, its reason naming the first."""
    ranges: dict[int, tuple[int, int, str]] = {}
    kept = []
    for L in layers:
        if L.inputs[0].im2col:  # packed by the host from its own value, padding and all
            kept.append(L)
            continue
        key = id(L.inputs[0].node)
        lo, hi = L.fill
        if key in ranges:
            plo, phi, first = ranges[key]
            if max(lo, plo) > min(hi, phi):
                why[L.name] = (f"its input's padding must hold {_span(lo, hi)}, but "
                               f"{first} reads the same activation with padding "
                               f"{_span(plo, phi)}")
                continue
            lo, hi = max(lo, plo), min(hi, phi)
        ranges[key] = (lo, hi, ranges.get(key, (0, 0, L.name))[2])
        kept.append(L)
    return kept


def _span(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def activation_frames(layers: list[Layer]) -> dict[int, tuple[int, int]]:
    """``id(node) -> (frame, fill)`` for each activation whose readers need padding that is not
    zero: it lives in device memory with a border of ``frame`` elements around each plane
    (the widest padding a reader takes), holding ``fill`` (written once, when the runtime
    places the slot), and its readers load windows of it without the LOAD's zero padding.
    Every other activation has no frame; the LOAD pads it with zeros."""
    ranges: dict[int, tuple[int, int]] = {}
    width: dict[int, int] = {}
    for L in layers:
        if L.inputs[0].im2col:
            continue
        key = id(L.inputs[0].node)
        lo, hi = ranges.get(key, (INT8_MIN, INT8_MAX))
        ranges[key] = (max(lo, L.fill[0]), min(hi, L.fill[1]))
        width[key] = max(width.get(key, 0), L.pad)
    frames = {}
    for key, (lo, hi) in ranges.items():
        if width[key] and not lo <= 0 <= hi:
            frames[key] = (width[key], lo if lo == hi else hi)
    return frames


def _im2col(L: ConvLayer, users: dict[Node, list[Node]], cfg: HwConfig) -> ConvLayer:
    """A convolution over few channels whose input comes from the host (a graph input, or a
    value the CPU makes) becomes a 1x1 convolution over its patches: the runtime packs the
    input's ``C*KH*KW`` patch values of every output pixel as channels (im2col), so the GEMM
    core is not ``block_in / C`` idle (ResNet's 3-channel 7x7 stem, the digits CNN's 1-channel
    first layer). Kept as it is when that saves less than half the GEMM work."""
    x = L.inputs[0]
    kh, kw = L.kernel
    if x.im2col or len(users.get(x.node, [])) != 1 or x.node.rank != 4:
        return L
    bi = cfg.block_in
    direct = -(-x.c // bi) * kh * kw
    patched = -(-(x.c * kh * kw) // bi)
    if 2 * patched > direct:
        return L
    o = L.out
    weight = L.weight.reshape(L.weight.shape[0], -1)[:, :, None, None]  # (O, C*KH*KW, 1, 1)
    spec = (kh, kw, *L.strides, *L.pads)
    xin = Operand(x.node, x.n, x.c * kh * kw, o.h, o.w, im2col=spec)
    return replace(L, inputs=[xin], weight=np.ascontiguousarray(weight), kernel=(1, 1),
                   strides=(1, 1), pads=(0, 0, 0, 0))


def _conv(n: Node, users: dict[Node, list[Node]], cfg: HwConfig
          ) -> tuple[Layer | None, str | None]:
    x, w, xzp, wzp = n.src
    if w.op is not Op.CONST or w.dtype not in (DType.INT8, DType.UINT8):
        return None, "weights that are not an int8 constant"
    zx, why = _input_zero_point(xzp)
    if why:
        return None, why
    wval, why = _zero_point_folded(w.value, wzp, 0 if n.op is Op.CONV_INTEGER else 1)
    if why:
        return None, why
    flat = _flattened(x, cfg) if n.op is Op.MATMUL_INTEGER else None
    xin = flat[0] if flat else _operand(x, cfg)
    if xin is None:
        return None, f"an input of {x.dtype.value}{list(x.shape)} (int8 with the batch a " \
                     f"multiple of {cfg.batch} expected)"
    rq = _single_requant(n, users, DType.INT8)
    if rq is None:
        return None, "an accumulator not requantised to int8 by its only user"
    if n.op is Op.MATMUL_INTEGER:
        if wval.ndim != 2:
            return None, "a matmul with batched weights"
        wt = wval.T  # (N, K)
        if flat:
            order = flat[1]
            wt = np.where(order[None, :] >= 0, wt[:, np.maximum(order, 0)], 0).astype(np.int8)
        weight = np.ascontiguousarray(wt)[:, :, None, None]
        kernel, strides, pads = (1, 1), (1, 1), (0, 0, 0, 0)
        axis = rq.rank - 1
    else:
        a = n.attrs
        assert isinstance(a, ConvAttrs)
        if len(a.kernel) != 2:
            return None, f"a {len(a.kernel)}-d convolution"
        if a.group != 1 and _unit_depthwise(n, wval, a):
            return _window_sum(n, a, xin, rq, zx, cfg)
        if a.group != 1:
            return None, (f"group={a.group} (a grouped or depthwise convolution uses 1/"
                          f"{cfg.block_in} of the GEMM core; the CPU's depthwise kernel is "
                          f"faster, see docs/vta.md)")
        if tuple(a.dilations) != (1, 1):
            return None, f"dilations {tuple(a.dilations)}"
        if max(a.pads) > MAX_PAD:
            return None, f"padding {tuple(a.pads)} beyond the LOAD's {MAX_PAD}"
        weight = wval
        kernel = (int(a.kernel[0]), int(a.kernel[1]))
        strides = (int(a.strides[0]), int(a.strides[1]))
        pads = (int(a.pads[0]), int(a.pads[1]), int(a.pads[2]), int(a.pads[3]))
        axis = 1
    out = _operand(rq, cfg)
    if out is None:
        return None, "an output the accelerator cannot hold"
    bad = _requant_ok(rq, out.c, axis)
    if bad:
        return None, bad
    flat_w = weight.astype(np.int64).reshape(weight.shape[0], -1)
    bias = _bias_folded(rq, zx, flat_w.sum(1))
    bound = _conv_bound(rq, zx, flat_w)
    attrs = rq.attrs
    assert isinstance(attrs, RequantAttrs)
    kind = "dense" if n.op is Op.MATMUL_INTEGER else "conv2d"
    nodes = [n, rq] + ([x] if flat and len(users.get(x, [])) == 1 else [])
    # a flattened input is read in place, element by element: it can have no frame
    fill = (0, 0) if flat else (zx, zx) if max(pads) else (INT8_MIN, INT8_MAX)
    return ConvLayer(rq.name, kind, nodes, [xin], out, fill=fill, acc_bound=bound,
                     weight=weight, kernel=kernel, strides=strides, pads=pads, requant=attrs,
                     bias=bias), None


def _conv_bound(rq: Node, zx: int, w: np.ndarray) -> np.ndarray:
    """The largest ``|acc + b|`` any int8 input gives a convolution with weights `w` (output
    channels, taps), ``acc = sum (x - z_x) w``: with ``d = x - z_x`` in ``[lo, hi]`` the
    extremes are ``pos*hi + neg*lo`` and ``pos*lo + neg*hi`` (``pos``, ``neg`` the sums of the
    positive and negative weights), exact for weights that are constants."""
    b = rq.src[1].value.astype(np.int64).reshape(-1) if len(rq.src) > 1 else 0
    lo, hi = INT8_MIN - zx, INT8_MAX - zx
    pos, neg = np.maximum(w, 0).sum(1), np.minimum(w, 0).sum(1)
    return np.maximum(np.abs(pos * hi + neg * lo + b), np.abs(pos * lo + neg * hi + b))


def _sum_bound(rq: Node, x_reach: int, weight_sums: np.ndarray) -> np.ndarray:
    """``x_reach * sum |w| + |b|`` per output channel: a bound on the integer graph's
    ``acc + bias`` where every input is at most `x_reach` from its zero point."""
    b = np.abs(rq.src[1].value.astype(np.int64).reshape(-1)) if len(rq.src) > 1 else 0
    return x_reach * weight_sums.astype(np.int64) + b


def _input_zero_point(z: Node) -> tuple[int, str | None]:
    """The activation's zero point as an int8 value (one for the whole tensor)."""
    if z.op is not Op.CONST:
        return 0, "an input zero point that is not a constant"
    v = np.asarray(z.value)
    if v.size != 1 and np.any(v.reshape(-1) != v.reshape(-1)[0]):
        return 0, "an input zero point per row or channel (the bias takes one per tensor)"
    zx = int(v.reshape(-1)[0]) if v.size else 0
    if not INT8_MIN <= zx <= INT8_MAX:
        return 0, f"an input zero point {zx} outside int8 (a uint8 input not made int8)"
    return zx, None


def _zero_point_folded(w: np.ndarray, z: Node, axis: int) -> tuple[np.ndarray, str | None]:
    """The weights minus their zero point (one per tensor, or one per output channel along
    `axis`) as int8: exact where every difference fits, as it does for uint8 weights with
    zero point 128 and for symmetric int8 weights (zero point 0)."""
    if z.op is not Op.CONST:
        return w, "a weight zero point that is not a constant"
    zw = np.asarray(z.value, dtype=np.int64)
    if zw.size > 1:
        shape = [1] * w.ndim
        shape[axis] = zw.size
        if w.shape[axis] != zw.size:
            return w, "weight zero points along another axis than the output channels"
        zw = zw.reshape(shape)
    elif not np.any(zw) and w.dtype == np.int8:
        return w, None
    diff = w.astype(np.int64) - zw
    if diff.min(initial=0) < INT8_MIN or diff.max(initial=0) > INT8_MAX:
        return w, (f"weights minus their zero point span {int(diff.min())}..{int(diff.max())}, "
                   f"beyond int8 (the GEMM core multiplies int8 by int8)")
    return diff.astype(np.int8), None


def _bias_folded(rq: Node, zx: int, wsum: np.ndarray) -> np.ndarray | None:
    """The requantisation's bias with the input zero point folded in: ``sum((x - z_x) * w) +
    b = sum(x * w) + (b - z_x * sum(w))`` per output channel, in int32 wrap-around as the
    integer graph adds it (so the accelerator's sum of ``x * w`` lands on the same int32)."""
    bias = rq.src[1].value.astype(np.int64) if len(rq.src) > 1 else None
    if not zx:
        return None if bias is None else bias.astype(np.int32)
    folded = (0 if bias is None else bias) - zx * wsum
    return ((folded + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def _window_sum(n: Node, a: ConvAttrs, xin: Operand, rq: Node, zx: int, cfg: HwConfig
                ) -> tuple[Layer | None, str | None]:
    """A depthwise convolution with unit weights as an ``avg_pool`` layer: the ALU sums the
    window (its padding holds the input's zero point, which the convolution's ``x - z_x``
    makes zero) and requantises, the zero point's ``- z_x * window`` folded into the bias."""
    if cfg.block_in != cfg.block_out:
        return None, "block_in != block_out: pooling reads the OUT layout as ACC rows"
    if tuple(a.dilations) != (1, 1):
        return None, f"dilations {tuple(a.dilations)}"
    if max(a.pads) > MAX_PAD:
        return None, f"padding {tuple(a.pads)} beyond the LOAD's {MAX_PAD}"
    out = _operand(rq, cfg)
    if out is None:
        return None, "an output the accelerator cannot hold"
    bad = _requant_ok(rq, out.c, 1)
    if bad:
        return None, bad
    attrs = rq.attrs
    assert isinstance(attrs, RequantAttrs)
    kernel = (int(a.kernel[0]), int(a.kernel[1]))
    bias = _bias_folded(rq, zx, np.full(out.c, kernel[0] * kernel[1], np.int64))
    pads = (int(a.pads[0]), int(a.pads[1]), int(a.pads[2]), int(a.pads[3]))
    window = np.full(out.c, kernel[0] * kernel[1], np.int64)
    return PoolLayer(rq.name, "avg_pool", [n, rq], [xin], out,
                     fill=(zx, zx) if max(pads) else (INT8_MIN, INT8_MAX),
                     acc_bound=_sum_bound(rq, max(INT8_MAX - zx, zx - INT8_MIN), window),
                     kernel=kernel,
                     strides=(int(a.strides[0]), int(a.strides[1])), pads=pads,
                     requant=attrs, bias=bias), None


def _nonnegative(x: Node) -> bool:
    return x.op is Op.REQUANTIZE and isinstance(x.attrs, RequantAttrs) and x.attrs.lo >= 0


def _pool(n: Node, cfg: HwConfig) -> tuple[Layer | None, str | None]:
    a = n.attrs
    assert isinstance(a, PoolAttrs)
    x = n.src[0]
    xin = _operand(x, cfg)
    if xin is None or n.rank != 4 or len(a.kernel) != 2:
        return None, "not a 2-d int8 pooling the accelerator can hold"
    if tuple(a.dilations) != (1, 1):
        return None, f"dilations {tuple(a.dilations)}"
    kh, kw = int(a.kernel[0]), int(a.kernel[1])
    sh, sw = int(a.strides[0]), int(a.strides[1])
    pt, pl = int(a.pads[0]), int(a.pads[1])
    oh, ow = n.shape[2], n.shape[3]
    pb = max(0, (oh - 1) * sh + kh - x.shape[2] - pt)  # ceil_mode windows count as padding
    pr = max(0, (ow - 1) * sw + kw - x.shape[3] - pl)
    if max(pt, pl, pb, pr) > MAX_PAD:
        return None, f"padding beyond the LOAD's {MAX_PAD}"
    out = _operand(n, cfg)
    assert out is not None
    # the padding must lose every comparison: at most the least value the input can take
    least = x.attrs.lo if x.op is Op.REQUANTIZE and isinstance(x.attrs, RequantAttrs) \
        else INT8_MIN
    fill = (INT8_MIN, max(INT8_MIN, min(INT8_MAX, least))) if max(pt, pl, pb, pr) \
        else (INT8_MIN, INT8_MAX)
    return PoolLayer(n.name, "max_pool", [n], [xin], out, fill=fill, kernel=(kh, kw),
                     strides=(sh, sw), pads=(pt, pl, pb, pr)), None


def _avg_pool(n: Node, users: dict[Node, list[Node]], cfg: HwConfig
              ) -> tuple[Layer | None, str | None]:
    """Global average pooling: REQUANTIZE(REDUCE_SUM(CAST(int8 x), axes (2, 3), keepdims))."""
    a = n.attrs
    cast = n.src[0]
    if cast.op is not Op.CAST or cast.src[0].dtype is not DType.INT8 or cast.rank != 4:
        return None, "a sum that is not over a widened 4-d int8 tensor"
    if tuple(getattr(a, "axes", ())) != (2, 3) or not getattr(a, "keepdims", False):
        return None, f"a sum over axes {tuple(getattr(a, 'axes', ()))} (the spatial axes " \
                     f"(2, 3) with keepdims expected)"
    x = cast.src[0]
    rq = _single_requant(n, users, DType.INT8)
    if rq is None:
        return None, "a sum not requantised to int8 by its only user"
    xin, out = _operand(x, cfg), _operand(rq, cfg)
    if xin is None or out is None:
        return None, "operands the accelerator cannot hold"
    bad = _requant_ok(rq, out.c, 1)
    if bad:
        return None, bad
    if len(users.get(cast, [])) != 1:
        return None, "a widened input that other nodes also use"
    attrs = rq.attrs
    assert isinstance(attrs, RequantAttrs)
    h, w = x.shape[2], x.shape[3]
    bias = rq.src[1].value.astype(np.int32) if len(rq.src) > 1 else None
    return PoolLayer(rq.name, "avg_pool", [cast, n, rq], [xin], out, kernel=(h, w),
                     requant=attrs, bias=bias,
                     acc_bound=_sum_bound(rq, -INT8_MIN, np.full(out.c, h * w, np.int64))
                     ), None


def _unit_depthwise(n: Node, w: np.ndarray, a: ConvAttrs) -> bool:
    """A depthwise convolution whose weights (less their zero point) are all 1: a window sum
    (an imported QDQ AveragePool, see `frontend.qdq`)."""
    c = n.src[0].shape[1] if n.src[0].rank == 4 else -1
    return a.group == c and w.shape[:2] == (c, 1) and bool(np.all(w == 1))


def _int8_source(r: Node) -> tuple[Node, RequantAttrs | None] | None:
    """``r`` as REQUANTIZE(CAST(int8)) or CAST(int8): the int8 node and the requantisation."""
    rq: RequantAttrs | None = None
    if r.op is Op.REQUANTIZE and len(r.src) == 1:
        assert isinstance(r.attrs, RequantAttrs)
        rq = r.attrs
        r = r.src[0]
    if r.op is Op.CAST and r.src[0].dtype is DType.INT8:
        return r.src[0], rq
    return None


def _add(n: Node, users: dict[Node, list[Node]], cfg: HwConfig
         ) -> tuple[Layer | None, str | None]:
    srcs = [_int8_source(s) for s in n.src]
    if any(s is None for s in srcs):
        return None, "operands that are not rescaled int8 tensors"
    (a, ra), (b, rb) = srcs  # type: ignore[misc]
    if a.shape != b.shape or a.shape != n.shape:
        return None, "a broadcasting add"
    rq = _single_requant(n, users, DType.INT8)
    if rq is None:
        return None, "a sum not requantised to int8 by its only user"
    ia, ib, out = _operand(a, cfg), _operand(b, cfg), _operand(rq, cfg)
    if ia is None or ib is None or out is None or n.rank != 4:
        return None, "operands the accelerator cannot hold"
    assert isinstance(rq.attrs, RequantAttrs)
    for r in (ra, rb, rq.attrs):
        if r is not None and max(len(r.multiplier), len(r.shift)) > 1 and r.axis != 1:
            return None, "per-channel rescaling along another axis than the channels"
    bias = None
    if len(rq.src) > 1:  # the operands' zero points, folded into one offset of the sum
        b = rq.src[1]
        if b.op is not Op.CONST or b.value.size not in (1, out.c) or (
                b.value.size > 1 and rq.attrs.axis != 1):
            return None, "a bias on the sum that is not a constant per tensor or channel"
        bias = np.broadcast_to(b.value.astype(np.int32).reshape(-1), (out.c,)).copy()
    nodes = [n, rq] + [s for s in n.src] + [s.src[0] for s in n.src if s.op is Op.REQUANTIZE]
    exclusive = [s for s in nodes if s is not n and s is not rq]
    if any(len(users.get(s, [])) != 1 for s in exclusive):
        return None, "a rescaled operand that other nodes also use"
    attrs = rq.attrs
    assert isinstance(attrs, RequantAttrs)
    scales = sum(np.abs(np.asarray(r.multiplier, np.int64)) if r is not None else 1
                 for r in (ra, rb))
    bound = -INT8_MIN * np.broadcast_to(scales, (out.c,)) + (
        0 if bias is None else np.abs(bias.astype(np.int64)))
    if any(r is not None and (any(r.shift) or any(getattr(r, "clamp", ()) or ())
                              or any(getattr(r, "pre_shift", ()) or ()) or r.zero_point
                              or r.lo != -(1 << 31) or r.hi != (1 << 31) - 1)
           for r in (ra, rb)):
        bound = None  # operands rescaled otherwise than by a multiplier alone
    return AddLayer(rq.name, "add", nodes, [ia, ib], out, acc_bound=bound, requant_a=ra,
                    requant_b=rb, requant=attrs, bias=bias), None
