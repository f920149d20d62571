"""The GEMM core: ``BATCH x BLOCK_IN x BLOCK_OUT`` int8 products summed into int32.

``sums[b][o] = sum_k inp[b][k] * wgt[o][k]`` (the product is ``x @ W.T``). The products are
registered (one pipeline stage, so multipliers map to DSP blocks with output registers); the
balanced adder tree after them is combinational, so ``sums`` belongs to the operands presented
one cycle earlier. Element layouts are those of the SRAMs: INP ``(batch, block_in)``, WGT
``(block_out, block_in)``, ACC ``(batch, block_out)``, row-major, little-endian lanes.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.config import HwConfig

__all__ = ["GemmCore", "tree_sum"]


def tree_sum(values: list, width: int):
    """A balanced adder tree (deep linear chains are slow to simulate and to time)."""
    vals = list(values)
    while len(vals) > 1:
        nxt = [(vals[i] + vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


class GemmCore(wiring.Component):
    """One micro-op's matrix product.

    Parameters
    ----------
    cfg : HwConfig

    Attributes
    ----------
    inp : In(batch * block_in * 8)
    wgt : In(block_out * block_in * 8)
    sums : Out(batch * block_out * 32)
        The products of the operands of the previous cycle, summed (wrapped to 32 bits).
    """

    def __init__(self, cfg: HwConfig):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"GemmCore: cfg must be an HwConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        super().__init__({
            "inp": In(cfg.inp_elem_bits), "wgt": In(cfg.wgt_elem_bits),
            "sums": Out(cfg.acc_elem_bits),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        bi, bo = cfg.block_in, cfg.block_out
        for b in range(cfg.batch):
            for o in range(bo):
                prods = []
                for k in range(bi):
                    x = self.inp[(b * bi + k) * 8:(b * bi + k + 1) * 8].as_signed()
                    w = self.wgt[(o * bi + k) * 8:(o * bi + k + 1) * 8].as_signed()
                    # no reset, so the register can be the DSP block's output register
                    p = Signal(signed(16), name=f"p_{b}_{o}_{k}", reset_less=True)
                    m.d.sync += p.eq(x * w)
                    prods.append(p)
                lane = b * bo + o
                m.d.comb += self.sums[lane * 32:(lane + 1) * 32].eq(tree_sum(prods, 32))
        return m
