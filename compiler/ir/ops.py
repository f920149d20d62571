"""The operators of the graph IR and its node type.

Every node produces exactly one tensor. ONNX operators with several outputs are split at import
(Split becomes one SLICE per output, TopK a TOPK of indices plus a GATHER_ELEMENTS of values);
Flatten, Squeeze and Unsqueeze become RESHAPE; operators that ONNX defines by a function body
(Attention, RotaryEmbedding...) arrive as the operators of that body. Attributes
are typed, frozen, per-op dataclasses; value-dependent ONNX inputs (Reshape's shape, Slice's
starts, Pad's pads, Clip's bounds...) are resolved to constants at import and stored as attributes,
so the shape of every node is static.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import DType


class Op(enum.Enum):
    # Sources.
    INPUT = "input"
    CONST = "const"
    # Elementwise, one operand.
    IDENTITY = "identity"
    CAST = "cast"
    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    ERF = "erf"
    NEG = "neg"
    ABS = "abs"
    RECIPROCAL = "reciprocal"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    SIGN = "sign"
    NOT = "not"
    SOFTPLUS = "softplus"
    SOFTSIGN = "softsign"
    HARD_SWISH = "hard_swish"
    ISNAN = "isnan"
    MISH = "mish"
    LEAKY_RELU = "leaky_relu"
    ELU = "elu"
    SELU = "selu"
    CELU = "celu"
    THRESHOLDED_RELU = "thresholded_relu"
    HARD_SIGMOID = "hard_sigmoid"
    GELU = "gelu"
    CLIP = "clip"
    # Elementwise, two or three operands with numpy broadcasting.
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MOD = "mod"
    MAX = "max"
    MIN = "min"
    PRELU = "prelu"
    EQUAL = "equal"
    LESS = "less"
    GREATER = "greater"
    LESS_EQUAL = "less_equal"
    GREATER_EQUAL = "greater_equal"
    AND = "and"
    OR = "or"
    XOR = "xor"
    WHERE = "where"
    # Linear algebra and neural-network operators.
    MATMUL = "matmul"
    GEMM = "gemm"
    CONV = "conv"
    CONV_TRANSPOSE = "conv_transpose"
    MAX_POOL = "max_pool"
    MAX_POOL_INDEX = "max_pool_index"  # where MAX_POOL's maxima are, as flat input indices
    COL2IM = "col2im"  # the adjoint of im2col: sum column blocks back into an image
    AVG_POOL = "avg_pool"
    GLOBAL_AVG_POOL = "global_avg_pool"
    GLOBAL_MAX_POOL = "global_max_pool"
    BATCH_NORM = "batch_norm"
    LAYER_NORM = "layer_norm"
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    # Data movement.
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    CONCAT = "concat"
    PAD = "pad"
    SLICE = "slice"
    GATHER = "gather"
    EXPAND = "expand"
    TILE = "tile"
    # Reductions.
    REDUCE_SUM = "reduce_sum"
    REDUCE_MEAN = "reduce_mean"
    REDUCE_MAX = "reduce_max"
    REDUCE_MIN = "reduce_min"
    REDUCE_PROD = "reduce_prod"
    REDUCE_L1 = "reduce_l1"
    REDUCE_L2 = "reduce_l2"
    REDUCE_SUM_SQUARE = "reduce_sum_square"
    REDUCE_LOG_SUM_EXP = "reduce_log_sum_exp"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    # Quantised arithmetic.
    QUANTIZE_LINEAR = "quantize_linear"
    DEQUANTIZE_LINEAR = "dequantize_linear"
    QLINEAR_CONV = "qlinear_conv"
    QLINEAR_MATMUL = "qlinear_matmul"
    MATMUL_INTEGER = "matmul_integer"
    CONV_INTEGER = "conv_integer"
    REQUANTIZE = "requantize"  # int32 -> int8/int32 with the accelerator's ALU arithmetic
    # Integer bit manipulation (requantisation on the accelerator uses shifts).
    SHL = "shl"
    SHR = "shr"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    BITWISE_NOT = "bitwise_not"
    # Less common tensor operators.
    ISINF = "isinf"
    TRILU = "trilu"
    GATHER_ELEMENTS = "gather_elements"
    CUMSUM = "cumsum"
    CUMPROD = "cumprod"
    HARDMAX = "hardmax"
    REDUCE_LOG_SUM = "reduce_log_sum"
    GATHER_ND = "gather_nd"
    SCATTER_ELEMENTS = "scatter_elements"
    SCATTER_ND = "scatter_nd"
    RESIZE = "resize"
    GRID_SAMPLE = "grid_sample"
    LP_POOL = "lp_pool"
    LRN = "lrn"
    EINSUM = "einsum"
    DET = "det"
    REVERSE_SEQUENCE = "reverse_sequence"
    TOPK = "topk"  # the indices of the top k; the values are GATHER_ELEMENTS of them
    # Produced by the optimisation passes, never by the frontend.
    FUSED_ELEMENTWISE = "fused_elementwise"  # a straight-line program; see FusedElementwiseAttrs


@dataclass(frozen=True, slots=True)
class Attrs:
    """Base class of the per-op attribute records."""


@dataclass(frozen=True, slots=True)
class NoAttrs(Attrs):
    pass


NO_ATTRS = NoAttrs()


@dataclass(frozen=True, slots=True, eq=False)
class ConstAttrs(Attrs):
    """The value of a CONST node; read-only, shape and dtype equal to the node's."""

    value: np.ndarray


@dataclass(frozen=True, slots=True)
class InputAttrs(Attrs):
    """Position of an INPUT node in the graph's inputs."""

    index: int


@dataclass(frozen=True, slots=True)
class AlphaAttrs(Attrs):
    """LEAKY_RELU, ELU, CELU, THRESHOLDED_RELU."""

    alpha: float


@dataclass(frozen=True, slots=True)
class SeluAttrs(Attrs):
    alpha: float
    gamma: float


@dataclass(frozen=True, slots=True)
class HardSigmoidAttrs(Attrs):
    """y = max(0, min(1, alpha * x + beta))."""

    alpha: float
    beta: float


@dataclass(frozen=True, slots=True)
class GeluAttrs(Attrs):
    approximate: str = "none"  # "none" (erf) or "tanh"


@dataclass(frozen=True, slots=True)
class ClipAttrs(Attrs):
    """Bounds of CLIP; None means unbounded on that side."""

    min: float | None
    max: float | None


@dataclass(frozen=True, slots=True)
class ModAttrs(Attrs):
    fmod: bool  # True: sign of the dividend (C fmod); False: sign of the divisor (Python %)


EPILOGUE_ACTIVATIONS = frozenset({"relu", "clip", "leaky_relu", "sigmoid", "tanh", "gelu"})


@dataclass(frozen=True, slots=True)
class Epilogue:
    """What CONV, GEMM and MATMUL apply to their result before storing it (fusion).

    y = act(conv_or_gemm(x, w) + bias [+ residual]). When residual is set, the residual tensor
    is the node's LAST operand, after the bias, which is then required (a producer without a
    bias gets a zero bias): CONV (x, w, bias, residual), GEMM (a, b, c, residual), MATMUL
    (a, b, bias, residual); its dtype and shape equal the node's. activation is None or one of
    EPILOGUE_ACTIVATIONS: "relu"; "clip" to [clip_min, clip_max] (None: unbounded on that
    side); "leaky_relu" with slope alpha; "sigmoid"; "tanh"; "gelu" (erf form). The default,
    Epilogue(), does nothing. Only float dtypes take a non-default epilogue.
    """

    activation: str | None = None
    alpha: float = 0.0
    clip_min: float | None = None
    clip_max: float | None = None
    residual: bool = False

    def __str__(self) -> str:
        parts = ["+residual"] if self.residual else []
        if self.activation == "clip":
            parts.append(f"clip({self.clip_min}, {self.clip_max})")
        elif self.activation == "leaky_relu":
            parts.append(f"leaky_relu({self.alpha})")
        elif self.activation is not None:
            parts.append(self.activation)
        return " ".join(parts) or "none"


NO_EPILOGUE = Epilogue()


@dataclass(frozen=True, slots=True)
class GemmAttrs(Attrs):
    """y = act(alpha * op(a) @ op(b) + beta * c [+ residual]), op = transpose when trans_* is
    set; operands (a, b[, c][, residual]), see Epilogue."""

    alpha: float = 1.0
    beta: float = 1.0
    trans_a: bool = False
    trans_b: bool = False
    epilogue: Epilogue = NO_EPILOGUE


@dataclass(frozen=True, slots=True)
class MatMulAttrs(Attrs):
    """MATMUL with an epilogue: y = act(a @ b [+ bias] [+ residual]); operands
    (a, b[, bias][, residual]) with bias of shape [y.shape[-1]] (added along the last axis).
    A MATMUL with NO_ATTRS is the plain two-operand numpy matmul."""

    epilogue: Epilogue = NO_EPILOGUE


# Step names of FUSED_ELEMENTWISE programs: (operand indices, float constants) they take.
# Binary steps take either two indices, or one index and one constant (x op c).
FUSED_UNARY = frozenset({"relu", "sigmoid", "tanh", "exp", "log", "sqrt", "erf", "neg", "abs",
                         "reciprocal", "floor", "ceil", "round", "sin", "cos", "softplus",
                         "softsign", "hard_swish", "gelu", "identity"})
FUSED_BINARY = frozenset({"add", "sub", "mul", "div", "max", "min", "pow"})
FUSED_PARAMETRIC = {"clip": 2, "leaky_relu": 1, "hard_sigmoid": 2, "elu": 1}  # constants


@dataclass(frozen=True, slots=True)
class FusedElementwiseAttrs(Attrs):
    """A straight-line float32 program over the node's k operands (broadcast numpy-style to the
    node's shape). Values are numbered: operands 0..k-1, then step i's result k + i; each step
    is (name, value indices, float constants) and may use only values numbered before it; the
    last step's result is the node's value. Steps: FUSED_UNARY names take one index; FUSED_BINARY
    names take two indices, or one index and one constant (x op c); "clip" one index and
    (min, max) (+-inf when unbounded); "leaky_relu"/"elu" one index and (alpha,);
    "hard_sigmoid" one index and (alpha, beta). Each step computes exactly what the unfused op
    computes in float32. Example, relu(x * 2 + y): program (("mul", (0,), (2.0,)),
    ("add", (2, 1), ()), ("relu", (3,), ())) over operands (x, y)."""

    program: tuple[tuple[str, tuple[int, ...], tuple[float, ...]], ...]

    def __str__(self) -> str:
        steps = []
        for name, idx, consts in self.program:
            args = [f"${i}" for i in idx] + [repr(c) for c in consts]
            steps.append(f"{name}({', '.join(args)})")
        return "; ".join(steps)


@dataclass(frozen=True, slots=True)
class ConvAttrs(Attrs):
    """Convolution over the trailing spatial axes of an N, C, *spatial tensor.

    pads is (begin_0, begin_1, ..., end_0, end_1, ...) as in ONNX; auto_pad is resolved at import.
    """

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    group: int = 1
    epilogue: Epilogue = NO_EPILOGUE  # CONV only: operands (x, w[, bias][, residual])


@dataclass(frozen=True, slots=True)
class ConvTransposeAttrs(Attrs):
    """Transposed convolution (the gradient of CONV with the same attributes). Weights are
    C_in, C_out / group, *kernel. Output length per axis:
    stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1 - pad_begin - pad_end."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    output_padding: tuple[int, ...]
    group: int = 1


@dataclass(frozen=True, slots=True)
class PoolAttrs(Attrs):
    """MAX_POOL and AVG_POOL; the output shape of the node is already rounded (ceil_mode)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    ceil_mode: bool = False
    count_include_pad: bool = False
    column_major: bool = False  # MAX_POOL_INDEX only: ONNX storage_order=1


@dataclass(frozen=True, slots=True)
class LpPoolAttrs(Attrs):
    """LP_POOL: (sum over the window of |x|^p)^(1/p); padding contributes zeros."""

    pool: PoolAttrs
    p: int = 2


@dataclass(frozen=True, slots=True)
class LrnAttrs(Attrs):
    """Local response normalisation across channels:
    y = x / (bias + alpha / size * sum of x^2 over `size` neighbouring channels)^beta."""

    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0


@dataclass(frozen=True, slots=True)
class EinsumAttrs(Attrs):
    """An explicit equation ("ij,jk->ik"), as numpy.einsum takes it."""

    equation: str


@dataclass(frozen=True, slots=True)
class ReverseSequenceAttrs(Attrs):
    """Reverse the first lengths[b] elements along time_axis of each batch_axis entry b."""

    batch_axis: int = 1
    time_axis: int = 0


@dataclass(frozen=True, slots=True)
class RequantAttrs(Attrs):
    """REQUANTIZE: int32 → int8 / uint8 / int32 in the accelerator ALU's arithmetic (32-bit,
    two's-complement wrap-around; MUL, ADD, SHR, MAX, MIN), per channel c of `axis` (tuples of
    one value apply to every element)::

        t = x (+ bias[c])                     the optional int32 operand of shape (C,)
        t = min(max(t, -clamp[c]), clamp[c])  when clamp[c] > 0 (0: no clamp)
        t = t * multiplier[c]                 low 32 bits of the product
        t = t + (1 << (shift[c] - 1))         when shift[c] > 0: round half up (toward +inf)
        t = t >> shift[c]                     arithmetic
        t = t + zero_point                    the output's zero point (0 for symmetric int8)
        y = min(max(t, lo), hi)               ReLU / ReLU6 / the output type's range

    y ≈ (x + bias) * multiplier / 2**shift: a real scale written as a fixed-point multiplier
    (``multiplier`` = 1 for a power-of-two scale). Example: scale 0.0123 with shift 20 is
    multiplier round(0.0123 * 2**20) = 12897; x = 1000 gives (12897000 + 2**19) >> 20 = 12.

    ``clamp`` saturates the accumulator before the multiply. The quantisers set it where every
    larger magnitude gives ``lo`` or ``hi`` anyway, so that it changes no result of the exact
    arithmetic but bounds the product: the multiplier keeps its bits without the product
    leaving int32 (see `quantize.requant`). Example: multiplier 12897, shift 20, into [-128,
    127]: clamp 10407 = ceil(128 * 2**20 / 12897), since x = 10407 already gives 128 → 127 and
    x = -10407 gives -128; x = 10**6 gives 127 as the exact product would, where without the
    clamp 10**6 * 12897 wraps int32.

    ``pre_shift`` (0 to 30; 0: none) divides the accumulator by ``2**p`` (rounding half up)
    before the clamp and the multiply, for a multiplier so small against an accumulator so
    large that no 32-bit product keeps its bits (a tiny input scale, a bias near the int32
    limits: see `quantize.requant`). With ``p = pre_shift[c] > 0`` the first step is instead::

        t = x + ((bias[c] & (2**p - 1)) + 2**(p - 1))   the bias's low p bits, the rounding
        t = t >> p                                       arithmetic
        t = t + (bias[c] >> p)                           the bias's high bits

    which is ``floor((x + bias + 2**(p-1)) / 2**p)`` without ever forming ``x + bias`` (which
    may leave int32 where ``bias`` is near its limits); the constant in the first line fits
    int32 for ``p <= 30``. Example: pre_shift 8, x = 1000, bias = 2**31 - 5: t = 1000 + (251 +
    128) = 1379, >> 8 = 5, + 8388607 = 8388612 = floor((1000 + 2**31 - 5 + 128) / 256).
    """

    multiplier: tuple[int, ...]
    shift: tuple[int, ...]
    axis: int
    lo: int
    hi: int
    zero_point: int = 0
    clamp: tuple[int, ...] = (0,)
    pre_shift: tuple[int, ...] = (0,)


@dataclass(frozen=True, slots=True)
class AxisAttrs(Attrs):
    """One non-negative axis: SOFTMAX, LOG_SOFTMAX, CONCAT, GATHER, quantisation axis."""

    axis: int


@dataclass(frozen=True, slots=True)
class EpsilonAttrs(Attrs):
    """BATCH_NORM (axis is 1) and LAYER_NORM (normalises axes axis..rank-1)."""

    epsilon: float
    axis: int = 1


@dataclass(frozen=True, slots=True)
class TransposeAttrs(Attrs):
    perm: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SliceAttrs(Attrs):
    """One entry per input axis, already clamped: out[i] = in[starts + i * steps]."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    steps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PadAttrs(Attrs):
    """pads is (begin_0, ..., begin_n, end_0, ..., end_n); negative values crop."""

    pads: tuple[int, ...]
    mode: str = "constant"  # "constant", "reflect", "edge" or "wrap"
    value: float = 0.0


@dataclass(frozen=True, slots=True)
class TileAttrs(Attrs):
    repeats: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReduceAttrs(Attrs):
    """Reduction over sorted, non-negative, non-empty axes."""

    axes: tuple[int, ...]
    keepdims: bool = True


@dataclass(frozen=True, slots=True)
class ArgAttrs(Attrs):
    axis: int
    keepdims: bool = True
    select_last_index: bool = False


@dataclass(frozen=True, slots=True)
class IsInfAttrs(Attrs):
    detect_positive: bool = True
    detect_negative: bool = True


@dataclass(frozen=True, slots=True)
class TriluAttrs(Attrs):
    """Keep the upper (or lower) triangle of the last two axes, from diagonal k on."""

    upper: bool
    k: int = 0


@dataclass(frozen=True, slots=True)
class ScatterAttrs(Attrs):
    """SCATTER_ELEMENTS (along axis) and SCATTER_ND (axis unused); reduction combines an update
    with the existing value: "none" (replace), "add", "mul", "max" or "min"."""

    axis: int = 0
    reduction: str = "none"


@dataclass(frozen=True, slots=True)
class ResizeAttrs(Attrs):
    """RESIZE, applied axis by axis (last axis first). For output index i of an axis with input
    length n, output length m and scale s, the input coordinate is given by coordinate_mode
    ("half_pixel": (i + 0.5) / s - 0.5, "asymmetric": i / s, "align_corners":
    i * (n - 1) / (n * s - 1), ...; see the ONNX Resize operator), then sampled by mode:
    "nearest" (rounded by nearest_mode), "linear" or "cubic" (coefficient cubic_a).
    roi (begins, then ends, as fractions) and extrapolation_value serve
    "tf_crop_and_resize" only."""

    scales: tuple[float, ...]
    mode: str = "nearest"
    coordinate_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    roi: tuple[float, ...] = ()
    extrapolation_value: float = 0.0


@dataclass(frozen=True, slots=True)
class GridSampleAttrs(Attrs):
    """Sample input (N, C, *spatial) at grid (N, *out, rank) positions in [-1, 1] (the last grid
    axis lists coordinates innermost spatial axis first), as ONNX GridSample."""

    mode: str = "linear"  # "nearest", "linear" or "cubic"
    padding_mode: str = "zeros"  # "zeros", "border" or "reflection"
    align_corners: bool = False


@dataclass(frozen=True, slots=True)
class GatherNdAttrs(Attrs):
    batch_dims: int = 0


@dataclass(frozen=True, slots=True)
class TopKAttrs(Attrs):
    """Indices of the k largest (or smallest) along axis, ties broken by the lower index."""

    axis: int
    k: int
    largest: bool = True


@dataclass(frozen=True, slots=True)
class CumAttrs(Attrs):
    """CUMSUM and CUMPROD along axis; exclusive leaves out the element itself."""

    axis: int
    exclusive: bool = False
    reverse: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Node:
    """One tensor-valued operation. Compared by identity; `replace()` returns a new node.

    src are the operand nodes, in the operator's order (see verify.SIGNATURES).
    """

    op: Op
    dtype: DType
    shape: tuple[int, ...]
    src: tuple[Node, ...] = ()
    attrs: Attrs = NO_ATTRS
    name: str = ""

    def replace(self, **changes: Any) -> Node:
        return dataclasses.replace(self, **changes)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def value(self) -> np.ndarray:
        """The value of a CONST node."""
        if not isinstance(self.attrs, ConstAttrs):
            raise TypeError(f"node {self.name!r} is {self.op.name}, not CONST; it has no value")
        return self.attrs.value

    def __repr__(self) -> str:
        return (f"Node({self.op.name}, {self.dtype.value}{list(self.shape)}, "
                f"name={self.name!r}, {len(self.src)} src)")


def epilogue_of(n: Node) -> Epilogue:
    """The epilogue of a CONV, GEMM or MATMUL node (NO_EPILOGUE for any other, or for a MATMUL
    with NO_ATTRS)."""
    return getattr(n.attrs, "epilogue", NO_EPILOGUE)


def const(value: np.ndarray | float | int, name: str = "", dtype: DType | None = None) -> Node:
    """A CONST node holding a read-only copy of value."""
    arr = np.array(value, dtype=dtype.np if dtype else None)
    arr.setflags(write=False)
    return Node(Op.CONST, DType.from_numpy(arr.dtype), tuple(arr.shape),
                attrs=ConstAttrs(arr), name=name)
