"""The tensor ALU: ``op(a, b)`` on every int32 lane of an accumulator element, combinational.

MIN, MAX, ADD, MUL (low 32 bits of the product) and SHR: ``b >= 0`` is an arithmetic right
shift by ``min(b, 31)``; ``b < 0`` a left shift by ``-b``, 0 when ``-b >= 32`` (docs/timing.md
§8). Every result wraps to int32.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.isa import ALU_OPCODE_BITS, AluOp

__all__ = ["TensorAlu", "alu_lane"]


def alu_lane(m: Module, op, a, b, name: str = "alu"):
    """The 32-bit result of ``op(a, b)`` for signed 32-bit ``a``, ``b``."""
    a, b = a.as_signed(), b.as_signed()
    r = Signal(signed(32), name=name)
    neg = b[31]
    # One barrel shifter for both directions (half the LUTs of two): a left shift by n is a
    # logical right shift by n of the bit-reversed operand, reversed back.
    nb = Signal(32, name=f"{name}_nb")
    m.d.comb += nb.eq(-b)
    amt = Signal(5, name=f"{name}_amt")
    m.d.comb += amt.eq(Mux(neg, nb[:5], Mux(b[5:31].any(), 31, b[:5])))
    src = Mux(neg, Cat(*reversed(list(a[:32]))), a)
    fill = Mux(neg, 0, a[31])
    shifted = Signal(32, name=f"{name}_sh")
    m.d.comb += shifted.eq((Cat(src, fill.replicate(32)) >> amt)[:32])
    left = Mux(nb[5:].any(), 0, Cat(*reversed(list(shifted))))
    lt = Signal(name=f"{name}_lt")
    m.d.comb += lt.eq(a < b)
    with m.Switch(op):
        with m.Case(AluOp.MIN):
            m.d.comb += r.eq(Mux(lt, a, b))
        with m.Case(AluOp.MAX):
            m.d.comb += r.eq(Mux(lt, b, a))
        with m.Case(AluOp.ADD):
            m.d.comb += r.eq(a + b)
        with m.Case(AluOp.SHR):
            m.d.comb += r.eq(Mux(neg, left, shifted))
        with m.Case(AluOp.MUL):
            m.d.comb += r.eq((a * b)[:32])
    return r


class TensorAlu(wiring.Component):
    """``out = op(a, b)`` lane by lane over ``batch * block_out`` int32 lanes.

    Parameters
    ----------
    cfg : HwConfig
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"TensorAlu: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        super().__init__({"op": In(ALU_OPCODE_BITS), "a": In(cfg.acc_elem_bits),
                          "b": In(cfg.acc_elem_bits), "out": Out(cfg.acc_elem_bits)})

    def elaborate(self, platform):
        m = Module()
        for lane in range(self.cfg.batch * self.cfg.block_out):
            s = slice(lane * 32, (lane + 1) * 32)
            m.d.comb += self.out[s].eq(alu_lane(m, self.op, self.a[s], self.b[s], f"lane{lane}"))
        return m
