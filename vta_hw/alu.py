"""The tensor ALU: ``op(a, b)`` on every int32 lane of an accumulator element, combinational.

MIN, MAX, ADD, MUL (low 32 bits of the product) and SHR: ``b >= 0`` is an arithmetic right
shift by ``min(b, 31)``; ``b < 0`` a left shift by ``-b``, 0 when ``-b >= 32`` (docs/timing.md
§8). Every result wraps to int32. One adder serves ADD, MIN and MAX; one multiplier serves MUL
and both shifts.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import ALU_OPCODE_BITS, AluOp

__all__ = ["TensorAlu", "alu_lane", "alu_control", "compact_datapath", "ALU_CONTROL",
           "MUL_PARTS", "LANE_PREFIX"]

#: The names of MUL's three partial products in a lane (``<lane>_<part>``), low by low first:
#: each is one 18x18 multiplier block on the ECP5 (the build's floorplan finds them by name)
MUL_PARTS = ("p_ll", "p_hl", "p_lh")

#: lane ``L``'s signals in :class:`TensorAlu` are named ``<LANE_PREFIX><L>_...``
LANE_PREFIX = "lane"

#: an operation decoded for the barrel-shifter datapath: MIN or MAX (the adder subtracts and
#: the result is a or b), MAX, ADD, MUL; none of them set is SHR
ALU_CONTROL = data.StructLayout({"minmax": 1, "max": 1, "add": 1, "mul": 1})


def alu_control(op):
    """``op`` (an :class:`~vtakit.vta_hw.isa.AluOp` value) decoded as :data:`ALU_CONTROL`."""
    return Cat((op == AluOp.MIN) | (op == AluOp.MAX), op == AluOp.MAX, op == AluOp.ADD,
               op == AluOp.MUL)


def compact_datapath(cfg: HwConfig) -> bool:
    """Whether ``cfg``'s compute datapath is the compact one: a core of one ACC lane (the
    ``ice40`` preset, where logic cells run out and the clock is the oscillator's) shifts
    through the multiplier and writes the ALU's result in the cycle it is computed. Wider
    cores have a barrel shifter beside the multiplier and register the ALU's operands and
    result (:mod:`~vtakit.vta_hw.compute`), for their clock. The cycle counts are the same."""
    return cfg.batch * cfg.block_out == 1


def alu_lane(m: Module, op, a, b, name: str = "alu", shift_by_multiplier: bool = True,
             parts: dict | None = None, control=None, mul_operands=None):
    """The 32-bit result of ``op(a, b)`` for signed 32-bit ``a``, ``b``.

    ``shift_by_multiplier``: shifts go through the multiplier (fewest cells: the iCE40
    preset's one lane); otherwise a barrel shifter of their own beside it (the multiplier's
    path then has no bit reversal before and after it: a faster clock on wider cores), and
    ``parts``, when given, receives the lane's ``"product"`` (MUL's result) and ``"other"``
    (the result of every other operation; anything for MUL), of which the result is the
    last multiplexer. The barrel-shifter datapath takes the operation decoded
    (:data:`ALU_CONTROL`) as ``control`` in place of ``op`` where given, and MUL's operands
    as ``mul_operands`` (a pair equal to ``(a, b)`` whenever the operation is MUL: a
    user's registers beside the multiplier blocks) where given."""
    a, b = a.as_signed(), b.as_signed()
    r = Signal(signed(32), name=name)
    # One 33-bit adder: a + b for ADD, a - b for MIN and MAX (its sign is a < b).
    sub = Signal(name=f"{name}_sub")
    if control is None:
        m.d.comb += sub.eq((op == AluOp.MIN) | (op == AluOp.MAX))
        ctl = data.View(ALU_CONTROL, alu_control(op)) if not shift_by_multiplier else None
    else:
        ctl = data.View(ALU_CONTROL, control)
        m.d.comb += sub.eq(ctl.minmax)
    a33, b33 = Cat(a, a[31]), Cat(b, b[31])
    total = Signal(33, name=f"{name}_sum")
    m.d.comb += total.eq((Cat(sub, a33) + Cat(sub, b33 ^ sub.replicate(33)))[1:])
    lt = total[32]
    if shift_by_multiplier:
        shifted = product = _shift_on_multiplier(m, op, a, b, name)
    else:
        shifted = _barrel_shift(a, b, m, name)
        ma, mb = (a, b) if mul_operands is None else mul_operands
        product = _mul_low32(m, ma, mb, name)
    if shift_by_multiplier:
        with m.Switch(op):
            with m.Case(AluOp.MIN, AluOp.MAX):
                m.d.comb += r.eq(Mux(lt ^ (op == AluOp.MAX), a, b))
            with m.Case(AluOp.ADD):
                m.d.comb += r.eq(total[:32])
            with m.Case(AluOp.SHR):
                m.d.comb += r.eq(shifted)
            with m.Case(AluOp.MUL):
                m.d.comb += r.eq(product)
        return r
    # MUL's product (the multiplier blocks and their adders: the longest path) is selected
    # last, so that a user can put that selection right in front of its registers
    other = Signal(signed(32), name=f"{name}_other")
    m.d.comb += other.eq(Mux(ctl.minmax, Mux(lt ^ ctl.max, a, b),
                             Mux(ctl.add, total[:32], shifted)))
    m.d.comb += r.eq(Mux(ctl.mul, product, other))
    if parts is not None:
        parts["product"], parts["other"] = product, other
    return r


def _shift_on_multiplier(m: Module, op, a, b, name: str):
    """MUL, and SHR through the same multiplier: 32 bits, valid for either operation."""
    # Shifts go through the multiplier (a DSP block): a << n is the low word of a * 2**n,
    # and a logical right shift is a left shift of the bit-reversed operand, reversed back;
    # an arithmetic one XORs the sign in and out (a >> n = ((a ^ s) >>> n) ^ s).
    neg = b[31]
    amt = Signal(5, name=f"{name}_amt")
    # -b for b < 0 (its low five bits), min(b, 31) for b >= 0
    m.d.comb += amt.eq(Mux(neg, (~b[:5]) + 1, Mux(b[5:31].any(), 31, b[:5])))
    big_left = neg & (~b[5:31].all() | (b[:5] == 0))  # -b >= 32: the result is 0
    is_shr = op == AluOp.SHR
    right = Signal(name=f"{name}_right")
    m.d.comb += right.eq(is_shr & ~neg)
    sign = a[31].replicate(32)
    # 2**amt (0 for big_left) as the product of two one-hot halves, of amt's low two bits and
    # its high three: each bit of the multiplier's operand is one LUT, (lo & hi) or b
    lo = Signal(4, name=f"{name}_pow2_lo")
    hi = Signal(8, name=f"{name}_pow2_hi")
    m.d.comb += [lo.eq(Const(1, 4) << amt[:2]), hi.eq(Mux(big_left, 0, Const(1, 8) << amt[2:]))]
    ma = Signal(32, name=f"{name}_ma")
    mb = Signal(32, name=f"{name}_mb")
    m.d.comb += [
        ma.eq(Mux(right, Cat(*reversed(list((a ^ sign)[:32]))), a)),
        mb.eq(Mux(is_shr, Cat(*[lo[k % 4] & hi[k // 4] for k in range(32)]), b)),
    ]
    prod = Signal(32, name=f"{name}_prod")
    m.d.comb += prod.eq((ma * mb)[:32])
    out = Signal(32, name=f"{name}_mulsh")
    m.d.comb += out.eq(Mux(right, Cat(*reversed(list(prod))) ^ sign, prod))
    return out


def _mul_low32(m: Module, a, b, name: str):
    """The low 32 bits of ``a * b`` from three unsigned partial products of 18-bit-wide
    pieces (the high-by-high one only reaches bits 36 and up): three of the ECP5's 18x18
    multipliers and 14-bit adders, where the whole 64-bit product takes four and wider ones.
    The low word of a product is the same for signed and unsigned operands."""
    lo = 18
    hi = 32 - lo
    ll, hl, lh = MUL_PARTS
    p_ll = Signal(2 * lo, name=f"{name}_{ll}")
    p_hl = Signal(hi, name=f"{name}_{hl}")
    p_lh = Signal(hi, name=f"{name}_{lh}")
    a_lo, a_hi = a.as_unsigned()[:lo], a.as_unsigned()[lo:32]
    b_lo, b_hi = b.as_unsigned()[:lo], b.as_unsigned()[lo:32]
    m.d.comb += [p_ll.eq(a_lo * b_lo), p_hl.eq((a_hi * b_lo)[:hi]),
                 p_lh.eq((a_lo * b_hi)[:hi])]
    product = Signal(32, name=f"{name}_prod")
    m.d.comb += product.eq(Cat(p_ll[:lo], (p_ll[lo:32] + p_hl + p_lh)[:hi]))
    return product


def _barrel_shift(a, b, m: Module, name: str):
    """``a >> min(b, 31)`` (arithmetic) for ``b >= 0``, ``a << -b`` (0 from 32 on) for
    ``b < 0``, in a barrel shifter of its own.

    The shifters take ``b``'s low five bits as they are, and whether the amount saturates
    (``b >= 32``, or ``-b >= 32``) is decided beside them and applied in the last
    multiplexer, so that no adder or wide OR sits in front of the shifters: for ``-31 <= b
    <= -1``, ``-b = ~b[:5] + 1``, and ``a << -b`` is ``(a << 1) << ~b[:5]``."""
    neg = b[31]
    # -b >= 32 (or b = -2**31): every bit shifted out
    big_left = Signal(name=f"{name}_lbig")
    m.d.comb += big_left.eq(~b[5:31].all() | (b[:5] == 0))
    big_right = Signal(name=f"{name}_rbig")
    m.d.comb += big_right.eq(b[5:31].any())
    left = Signal(32, name=f"{name}_lsh")
    right = Signal(signed(32), name=f"{name}_rsh")
    m.d.comb += [left.eq(((a << 1) << ~b[:5])[:32]), right.eq(a >> b[:5])]
    sh = Signal(signed(32), name=f"{name}_sh")
    m.d.comb += sh.eq(Mux(neg, Mux(big_left, 0, left), Mux(big_right, a >> 31, right)))
    return sh


class TensorAlu(wiring.Component):
    """``out = op(a, b)`` lane by lane over ``batch * block_out`` int32 lanes.

    Parameters
    ----------
    cfg : HwConfig
    decoded : bool
        Take the operation decoded, one :data:`ALU_CONTROL` per lane (input ``control``, an
        array of them), in place of ``op``; only on the barrel-shifter datapath. A user that
        registers each lane's copy apart (the compute unit) keeps the operation's decoding
        and its fan-out across the lanes off the ALU's paths. MUL then takes its operands
        from inputs of its own, ``mul_a`` and ``mul_b``, which must equal ``a`` and ``b``
        whenever a lane's operation is MUL: the compute unit gives MUL a second operand
        register of its own, which can sit beside the multiplier blocks.

    Shifts go through the multiplier on the compact datapath (:func:`compact_datapath`), else
    through a barrel shifter per lane (:func:`alu_lane`), and then ``out`` is
    ``Mux(op == MUL, product, other)`` with both halves outputs as well: MUL's ``product``,
    and ``other``, the result of every other operation (its value for MUL is unspecified).
    A user that selects the product last, right before its registers, keeps the multiplier
    blocks' path short (the ECP5 clock). On the compact datapath ``product`` and ``other``
    are both ``out``.
    """

    def __init__(self, cfg: HwConfig, decoded: bool = False):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"TensorAlu: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.shift_by_multiplier = compact_datapath(cfg)
        if decoded and self.shift_by_multiplier:
            raise ValueError("TensorAlu: decoded=True needs the barrel-shifter datapath; "
                             f"the compact one (a core of one lane) takes op, got {cfg!r}")
        self.decoded = decoded
        lanes = cfg.batch * cfg.block_out
        ports = {"a": In(cfg.acc_elem_bits), "b": In(cfg.acc_elem_bits),
                 "out": Out(cfg.acc_elem_bits), "product": Out(cfg.acc_elem_bits),
                 "other": Out(cfg.acc_elem_bits)}
        if decoded:
            ports["control"] = In(data.ArrayLayout(ALU_CONTROL, lanes))
            ports["mul_a"] = In(cfg.acc_elem_bits)
            ports["mul_b"] = In(cfg.acc_elem_bits)
        else:
            ports["op"] = In(ALU_OPCODE_BITS)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        for lane in range(self.cfg.batch * self.cfg.block_out):
            s = slice(lane * 32, (lane + 1) * 32)
            parts: dict = {}
            r = alu_lane(m, None if self.decoded else self.op, self.a[s], self.b[s],
                         f"{LANE_PREFIX}{lane}", shift_by_multiplier=self.shift_by_multiplier,
                         parts=parts, control=self.control[lane] if self.decoded else None,
                         mul_operands=((self.mul_a[s], self.mul_b[s]) if self.decoded
                                       else None))
            m.d.comb += [self.out[s].eq(r), self.product[s].eq(parts.get("product", r)),
                         self.other[s].eq(parts.get("other", r))]
        return m
