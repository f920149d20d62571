"""The GEMM core: ``BATCH x BLOCK_IN x BLOCK_OUT`` int8 products summed into int32.

``sums[b][o] = sum_k inp[b][k] * wgt[o][k]`` (the product is ``x @ W.T``). The products are
registered (one pipeline stage, so multipliers map to DSP blocks with output registers); the
balanced adder tree after them is combinational, so ``sums`` belongs to the operands presented
one cycle earlier. With ``operand_regs`` the operands are registered as well (the block RAM
outputs that feed them get a cycle of their own: the ECP5 clock) and ``sums`` belongs to the
operands of two cycles earlier. Element layouts are those of the SRAMs: INP
``(batch, block_in)``, WGT ``(block_out, block_in)``, ACC ``(batch, block_out)``, row-major,
little-endian lanes.

Where a part has fewer multiplier blocks than products (a 16x16 core on the ECP5-85F: 256
products, 156 MULT18X18D), ``dsp_products`` keeps the first products (in ``(b, o, k)`` order,
whole output lanes first) as ``*``, which synthesis maps to DSP blocks, and builds the others as
radix-4 Booth multipliers in logic (:func:`booth_mul8`): four partial products of
``{0, +-x, +-2x}``, summed by carry chains. Synthesis does not turn those back into DSPs.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig

__all__ = ["GemmCore", "tree_sum", "booth_mul8", "dsp_split"]


def tree_sum(values: list, width: int):
    """A balanced adder tree (deep linear chains are slow to simulate and to time)."""
    vals = list(values)
    while len(vals) > 1:
        nxt = [(vals[i] + vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


def dsp_split(cfg: HwConfig, dsp_blocks: int) -> int | None:
    """How many of ``cfg``'s GEMM products fit the ``dsp_blocks`` multiplier blocks of a part
    (whole output lanes, the ``dsp_products`` of :class:`GemmCore`), or None when all of them
    do: the blocks less three per ALU lane (the low word of its MUL from three 18-bit partial
    products) and four for the rest of the core (the read DMAs' first-row products)."""
    products = cfg.macs_per_cycle
    free = dsp_blocks - 3 * cfg.batch * cfg.block_out - 4
    if products <= free:
        return None
    return max(0, free) // cfg.block_in * cfg.block_in


def check_dsp_products(value, who: str) -> None:
    """``ValueError`` unless ``value`` is None or a non-negative int."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 0):
        raise ValueError(f"{who}: dsp_products={value!r} must be None or a non-negative int")


def booth_mul8(m: Module, x, w, name: str):
    """``x * w`` of two signed 8-bit values as a 16-bit signed value, in logic: radix-4 Booth
    recoding of ``w`` into four digits ``d_i in {-2..2}``; partial product ``i`` is ``d_i * x``
    (a multiplexer of ``x``, ``2x`` and 0, inverted for a negative digit, the +1 of the two's
    complement added with the partial products)."""
    x, w = x.as_signed(), w.as_signed()
    terms = []
    negs = []
    for i in range(4):
        b2, b1 = w[2 * i + 1], w[2 * i]
        b0 = w[2 * i - 1] if i else 0
        one = Signal(name=f"{name}_one{i}")
        two = Signal(name=f"{name}_two{i}")
        neg = Signal(name=f"{name}_neg{i}")
        m.d.comb += [one.eq(b1 ^ b0), two.eq((b2 & ~b1 & ~b0) | (~b2 & b1 & b0)),
                     neg.eq(b2 & ~(b1 & b0))]
        mag = Signal(signed(10), name=f"{name}_mag{i}")
        m.d.comb += mag.eq(Mux(two, x << 1, Mux(one, x, 0)))
        pp = Signal(signed(10), name=f"{name}_pp{i}")
        m.d.comb += pp.eq(Mux(neg, ~mag, mag))  # -mag = ~mag + 1: the 1 comes below
        terms.append(pp << (2 * i))
        negs += [neg, 0] if i < 3 else [neg]
    terms.append(Cat(*negs).as_unsigned())
    return tree_sum(terms, 16)[:16].as_signed()


class GemmCore(wiring.Component):
    """One micro-op's matrix product.

    Parameters
    ----------
    cfg : HwConfig
    dsp_products : int or None
        How many products (the first, in ``(b, o, k)`` order) are written as ``*`` for DSP
        blocks; the others are Booth multipliers in logic. ``None``: all of them are ``*``.
    operand_regs : bool
        Register ``inp`` and ``wgt`` before the multipliers (one more cycle to ``sums``).

    Attributes
    ----------
    inp : In(batch * block_in * 8)
    wgt : In(block_out * block_in * 8)
    sums : Out(batch * block_out * 32)
        The products of the operands of the previous cycle (with ``operand_regs``: of the
        cycle before that), summed (wrapped to 32 bits).
    """

    def __init__(self, cfg: HwConfig, dsp_products: int | None = None,
                 operand_regs: bool = False):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"GemmCore: cfg must be an HwConfig, got {type(cfg).__name__}")
        check_dsp_products(dsp_products, "GemmCore")
        if not isinstance(operand_regs, bool):
            raise TypeError(f"GemmCore: operand_regs must be a bool, got {operand_regs!r}")
        self.cfg = cfg
        self.dsp_products = dsp_products
        self.operand_regs = operand_regs
        super().__init__({
            "inp": In(cfg.inp_elem_bits), "wgt": In(cfg.wgt_elem_bits),
            "sums": Out(cfg.acc_elem_bits),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        bi, bo = cfg.block_in, cfg.block_out
        inp, wgt = self.inp, self.wgt
        if self.operand_regs:
            # no reset: plain registers beside the block RAMs' outputs
            inp = Signal.like(self.inp, name="inp_reg", reset_less=True)
            wgt = Signal.like(self.wgt, name="wgt_reg", reset_less=True)
            m.d.sync += [inp.eq(self.inp), wgt.eq(self.wgt)]
        for b in range(cfg.batch):
            for o in range(bo):
                prods = []
                for k in range(bi):
                    x = inp[(b * bi + k) * 8:(b * bi + k + 1) * 8].as_signed()
                    w = wgt[(o * bi + k) * 8:(o * bi + k + 1) * 8].as_signed()
                    # no reset, so the register can be the DSP block's output register
                    p = Signal(signed(16), name=f"p_{b}_{o}_{k}", reset_less=True)
                    n = (b * bo + o) * bi + k
                    if self.dsp_products is None or n < self.dsp_products:
                        m.d.sync += p.eq(x * w)
                    else:
                        m.d.sync += p.eq(booth_mul8(m, x, w, f"booth_{b}_{o}_{k}"))
                    prods.append(p)
                lane = b * bo + o
                m.d.comb += self.sums[lane * 32:(lane + 1) * 32].eq(tree_sum(prods, 32))
        return m
