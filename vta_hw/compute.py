"""The compute unit: LOAD of UOP/ACC/ACC_8BIT, GEMM, ALU and FINISH (docs/timing.md §4).

GEMM and ALU walk the loop ``i < iter_out, j < iter_in, u in uop_bgn..uop_end-1`` issuing one
iteration per cycle (two for a tensor-operand ALU) from ``s + 1``; the finish cycle is the last
issue plus 6 for a GEMM, 5 for an ALU with an immediate (6 for a tensor ALU, whose first issue
also is at ``s + 1``), which gives ``s + n + 6``, ``s + n + 5`` and ``s + 2n + 5``. Pipeline,
for an iteration issued at ``t``:

* ``t - 1``: read the micro-op; ``t``: form the ACC/INP/WGT indices, read INP and WGT;
* GEMM / ALU immediate: ``t+1`` read ``ACC[dst]`` (GEMM products registered); then on the
  compact datapath of one-lane cores (:func:`~vtakit.vta_hw.alu.compact_datapath`) ``t+2`` the
  ALU (GEMM: adder tree and accumulate), whose result is that cycle's ACC and OUT write; on
  the registered datapath of wider cores ``t+2`` the word into the operand register, ``t+3``
  the ALU into the result register, ``t+4`` the write;
* tensor ALU: ``t+1`` reads ``ACC[src]``, ``t+2`` reads ``ACC[dst]``; the ALU and the write one
  cycle later than above;
* GEMM on the registered datapath: the INP and WGT indices registered at ``t``, read at
  ``t+1``; ``t+2`` the INP and WGT words into the multipliers' operand registers, ``t+3`` the
  products registered and ``ACC[dst]`` read, ``t+4`` the word into the operand register and
  the adder tree into its register, ``t+5`` the ALU (ADD), ``t+6`` the write: in the finish
  cycle, so the OUT buffer is transparent (a STORE that pops the GEMM's token reads its first
  element in that cycle and sees the write). On the compact datapath a GEMM finishes a cycle
  after its last write (the same contract, ``GEMM_PIPELINE_CYCLES``).
* MUL's product is never forwarded into the operands (registered datapath): an immediate
  MUL's word that the iteration in the ALU is about to write is computed from that
  iteration's operand (or from the result being written) times the immediate's square, so
  the multipliers' path ends in the result register: no loop runs through them.

On the registered datapath the ALU's operands and result are registers, so the paths around
it are short (the ``ecp5`` preset's clock); the compact one saves the registers and two
forwarding patches (iCE40 logic cells). The lanes' ALUs do the accumulation too (ADD), so
there is one adder per lane. Back-to-back updates of one ACC row are forwarded: a word read
from the ACC block RAM is patched with the results its read missed (written in the cycle of
the read; on the registered datapath also computed or written in its arrival cycle), so each
iteration sees every earlier iteration's result, as the loop semantics say.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from vtakit.vta_hw.alu import ALU_CONTROL, TensorAlu, alu_control, compact_datapath
from vtakit.vta_hw.config import HwConfig
from vtakit.vta_hw.control import command_member, unit_control
from vtakit.vta_hw.dma import IDX_BITS, ReadDMA, lanes_of
from vtakit.vta_hw.gemm import GemmCore, check_dsp_products
from vtakit.vta_hw.interfaces import MemClientSignature, TokenPopSignature, TokenPushSignature
from vtakit.vta_hw.isa import AluOp, MemType, Opcode
from vtakit.vta_hw.layouts import insn_layouts
from vtakit.vta_hw.synth import REPLICA_SUFFIX
from vtakit.vta_hw.timing_facts import (
    ALU_PIPELINE_CYCLES,
    GEMM_PIPELINE_CYCLES,
    LOAD_UNIT_MEMORY_TYPES,
    NOP_CYCLES,
    TOKEN_POPS,
    TOKEN_PUSHES,
)

__all__ = ["Compute", "COMPUTE_TARGETS"]

#: The LOADs fetch routes to this unit (docs/timing.md §3): every memory type but the load
#: unit's and OUT (which cannot be loaded).
COMPUTE_TARGETS = tuple(t for t in MemType
                        if t not in LOAD_UNIT_MEMORY_TYPES and t != MemType.OUT)

# Cycles from the last issue of a loop to its finish: an issue at t writes ACC at t + 4 at the
# latest (t + 5 for a tensor ALU, t + 6 for a GEMM; the registered datapath), so the finish of
# docs/timing.md (s + n + 6, s + n + 5, s + 2n + 5 with the last of the tensor ALU's issues,
# two cycles apart, at s + 2n - 1) comes after the write or, for a GEMM, with it: the next
# instruction of this unit reads ACC two cycles after its start at the earliest, and a STORE
# that starts at the finish reads OUT, which is transparent to this unit's writes (vta_hw.top).
_DRAIN_GEMM = GEMM_PIPELINE_CYCLES
_DRAIN_ALU_IMM = ALU_PIPELINE_CYCLES
_DRAIN_ALU_TENSOR = ALU_PIPELINE_CYCLES + 1
assert _DRAIN_GEMM >= 6 and _DRAIN_ALU_IMM >= 5 and _DRAIN_ALU_TENSOR >= 6, \
    "the finish would come before the ACC write of the last iteration"
# FINISH and empty loops finish the cycle after their start (the "short" register below).
assert NOP_CYCLES == 1, "Compute finishes a FINISH or an empty loop at s + 1"


class Compute(wiring.Component):
    """Executes the compute queue.

    Parameters
    ----------
    cfg : HwConfig
    dsp_products : int or None
        :class:`~vtakit.vta_hw.gemm.GemmCore`'s: GEMM products written for DSP blocks (the
        others are multipliers in logic); None: all of them.

    Attributes
    ----------
    cmd : In(CommandSignature)
        The compute command queue (:func:`~vtakit.vta_hw.control.command_member`).
    l2g, s2g : Out(TokenPopSignature()); g2l, g2s : Out(TokenPushSignature())
        Token queues.
    mem : Out(MemClientSignature(cfg))
        The memory-port client (read).
    uop_*, inp_r_*, wgt_r_*, acc_*, out_w_* : SRAM ports.
    finish_start : Out
        A FINISH starts in this cycle (it finishes, and the run ends, in the next).
    idle, active : Out
        No instruction taken; the unit makes progress in this cycle
        (:class:`~vtakit.vta_hw.control.UnitControl`), for the core's deadlock detection.
    """

    def __init__(self, cfg: HwConfig, dsp_products: int | None = None):
        if not isinstance(cfg, HwConfig):
            raise TypeError(f"Compute: cfg must be an HwConfig, got {type(cfg).__name__}")
        check_dsp_products(dsp_products, "Compute")
        self.cfg = cfg
        self.dsp_products = dsp_products
        self.compact = compact_datapath(cfg)
        ru = lanes_of(cfg, MemType.UOP)
        ra = max(lanes_of(cfg, MemType.ACC), lanes_of(cfg, MemType.ACC_8BIT))
        self.acc_lanes = ra
        # ACC write lanes 1.. carry only ACC_8BIT's sign-extended int8s when an ACC element
        # (one int32) takes one lane: the buffer rotates just the low bytes and extends them
        # (BankedMemory's w_sext_bits; acc_w_sext says that lane 0 is one of them)
        self.acc_w_sext_bits = (8 if ra > 1 and lanes_of(cfg, MemType.ACC) == 1
                                and cfg.elem_bytes(MemType.ACC_8BIT) == 1 else 0)
        arr = data.ArrayLayout
        super().__init__({
            "cmd": command_member(cfg),
            "l2g": Out(TokenPopSignature()), "s2g": Out(TokenPopSignature()),
            "g2l": Out(TokenPushSignature()), "g2s": Out(TokenPushSignature()),
            "mem": Out(MemClientSignature(cfg)),
            "uop_w_en": Out(arr(1, ru)), "uop_w_addr": Out(IDX_BITS),
            "uop_w_data": Out(arr(32, ru)),
            "uop_r_addr": Out(IDX_BITS), "uop_r_data": In(arr(32, 1)),
            "inp_r_addr": Out(IDX_BITS), "inp_r_data": In(arr(cfg.inp_elem_bits, 1)),
            "wgt_r_addr": Out(IDX_BITS), "wgt_r_data": In(arr(cfg.wgt_elem_bits, 1)),
            "acc_w_en": Out(arr(1, ra)), "acc_w_sext": Out(1), "acc_w_addr": Out(IDX_BITS),
            "acc_w_data": Out(arr(cfg.acc_elem_bits, ra)),
            "acc_r_addr": Out(IDX_BITS), "acc_r_data": In(arr(cfg.acc_elem_bits, 1)),
            "out_w_en": Out(arr(1, 1)), "out_w_addr": Out(IDX_BITS),
            "out_w_data": Out(arr(cfg.out_elem_bits, 1)),
            "finish_start": Out(1), "idle": Out(1), "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lays = insn_layouts(cfg)
        fin, fin_next = Signal(), Signal()
        tokens = {"l2g": self.l2g, "s2g": self.s2g, "g2l": self.g2l, "g2s": self.g2s}
        ctl = unit_control(m, "compute", lays.gemm, self.cmd,
                           [(flag, tokens[q]) for flag, q in TOKEN_POPS["compute"]],
                           [(flag, tokens[q]) for flag, q in TOKEN_PUSHES["compute"]], fin,
                           fin_next)
        m.d.comb += [self.idle.eq(ctl.idle), self.active.eq(ctl.active)]
        cand_bits = ctl.cand.as_value()
        op = ctl.cand.opcode
        g = data.View(lays.gemm, cand_bits)
        a_ = data.View(lays.alu, cand_bits)

        # ---- LOAD UOP / ACC / ACC_8BIT through the read DMA ---------------------------------
        dma = m.submodules.dma = ReadDMA(cfg, COMPUTE_TARGETS)
        wiring.connect(m, wiring.flipped(self.mem), dma.mem)
        m.d.comb += [dma.start.eq(ctl.start & (op == Opcode.LOAD)), dma.insn.eq(cand_bits),
                     dma.insn_reg.eq(ctl.insn)]
        d_uop, d_acc, d_acc8 = (dma.writes[MemType.UOP], dma.writes[MemType.ACC],
                                dma.writes[MemType.ACC_8BIT])
        m.d.comb += [self.uop_w_en.eq(d_uop.en), self.uop_w_addr.eq(d_uop.addr),
                     self.uop_w_data.eq(d_uop.data)]
        # ACC writes: this unit's GEMM/ALU results (lane 0) or the DMA's ACC / ACC_8BIT
        # elements (the DMA's targets share one index); ACC_8BIT's int8 values sign-extended
        # (from the unit's register: the DMA writes from s + 2, PAD_ONLY_SETUP_CYCLES, so no
        # path runs from the start cycle's take into the ACC buffer's write data)
        acc8 = Signal()
        m.d.comb += acc8.eq(data.View(lays.mem, ctl.insn).memory_type == MemType.ACC_8BIT)
        n_lanes8 = cfg.elem_bytes(MemType.ACC_8BIT)  # int8 values (one byte each) per element
        wr_en = Signal()  # defined with the pipeline below
        wr_a = Signal(cfg.log_acc_depth)
        wr_v = Signal(cfg.acc_elem_bits)
        m.d.comb += self.acc_w_addr.eq(Mux(wr_en, wr_a, d_acc.addr))
        for lane in range(self.acc_lanes):
            dat = Const(0, cfg.acc_elem_bits)
            en = Const(0)
            if lane < len(d_acc.en):
                dat, en = d_acc.data[lane], d_acc.en[lane]
            if lane < len(d_acc8.en):
                d8 = d_acc8.data[lane]
                aw8 = cfg.acc_width_bits
                ext = Cat(*[Cat(d8[8 * v:8 * v + 8], d8[8 * v + 7].replicate(aw8 - 8))
                            for v in range(n_lanes8)])
                if lane == 0 and self.acc_w_sext_bits:  # the buffer extends the int8
                    dat = Cat(Mux(acc8, ext[:8], dat[:8]), dat[8:])
                else:
                    dat = Mux(acc8, ext, dat)
                en = en | d_acc8.en[lane]
            if lane == 0:
                dat, en = Mux(wr_en, wr_v, dat), en | wr_en
            m.d.comb += [self.acc_w_en[lane].eq(en), self.acc_w_data[lane].eq(dat)]
        # (acc8 views the unit's register: high for a GEMM whose bits there say ACC_8BIT)
        m.d.comb += self.acc_w_sext.eq(acc8 & ~wr_en)

        # ---- GEMM / ALU loop --------------------------------------------------------------
        # g, a_ view the instruction starting at ctl.start (the candidate), which sets up the
        # loop; gr, ar the control's register, which holds it while the loop runs (from
        # s + 1), so the loop's steps hang off no path through the start cycle's take
        gr = data.View(lays.gemm, ctl.insn)
        ar = data.View(lays.alu, ctl.insn)
        lay_a = cfg.log_acc_depth
        lay_i = cfg.log_inp_depth
        lay_w = cfg.log_wgt_depth
        is_loop = (op == Opcode.GEMM) | (op == Opcode.ALU)
        n_zero = (g.uop_end <= g.uop_bgn) | (g.iter_out == 0) | (g.iter_in == 0)
        is_alu = Signal()
        tensor = Signal()
        reset = Signal()
        active = Signal()
        tog = Signal()
        u = Signal(len(g.uop_end))
        # outer and inner iterations left, the current one included: counting down, the last
        # one is a comparison with a constant and the decrement feeds only the register
        i_left = Signal(len(g.iter_out))
        j_left = Signal(len(g.iter_in))
        src_w = max(lay_a, lay_i)
        # index offsets: base_* = i * factor_out, off_* = base_* + j * factor_in
        off_d, base_d = Signal(lay_a), Signal(lay_a)
        off_s, base_s = Signal(src_w), Signal(src_w)
        off_w, base_w = Signal(lay_w), Signal(lay_w)
        # cycles to the finish after the last issue (0: not draining)
        drain = Signal(range(max(_DRAIN_GEMM, _DRAIN_ALU_IMM, _DRAIN_ALU_TENSOR) + 1))
        issue = active & (~tensor | ~tog)
        m.d.sync += tog.eq(active & ~tog)
        u1 = Signal(len(u) + 1)
        m.d.comb += u1.eq(u + 1)
        # micro-ops left in this pass of the inner loop, the current one included
        # (uop_end - u): the pass's last is a comparison of a register with a constant, not
        # of u + 1's carry chain with uop_end, on the way to the micro-op RAM's address (the
        # ECP5 clock; the compact datapath, short of logic cells, compares u + 1)
        k_left = None if self.compact else Signal(len(g.uop_end))
        next_j = issue & ((u1 == gr.uop_end) if self.compact else (k_left == 1))
        next_i = next_j & (j_left == 1)
        # u in the next cycle, the micro-op RAM's read address. Outside a loop it is the
        # uop_bgn of the instruction a start would begin, whether or not one starts (a read
        # has no effect), selected by the unit's state register (`startable`): the start's
        # decision (a finish, its pushes, the take, tokens, an empty loop) selects nothing on
        # the way to the RAM, whose banks lie across the die (the ECP5 clock)
        u_d = Signal.like(u)
        m.d.comb += u_d.eq(Mux(active, u, ctl.startable.uop_bgn))
        m.d.sync += u.eq(u_d)
        with m.If(issue):
            m.d.comb += u_d.eq(Mux(next_j, gr.uop_bgn, u1))
        with m.If(next_j):
            m.d.sync += j_left.eq(Mux(next_i, gr.iter_in, j_left - 1))
        if k_left is not None:
            with m.If(next_j):
                m.d.sync += k_left.eq(gr.uop_end - gr.uop_bgn)
            with m.Elif(issue):
                m.d.sync += k_left.eq(k_left - 1)
        with m.If(next_i):
            m.d.sync += i_left.eq(i_left - 1)
            with m.If(i_left == 1):
                drain_issue = (_DRAIN_GEMM if _DRAIN_GEMM == _DRAIN_ALU_IMM
                               else Mux(is_alu, _DRAIN_ALU_IMM, _DRAIN_GEMM))
                m.d.sync += [active.eq(0), drain.eq(Mux(tensor, _DRAIN_ALU_TENSOR, drain_issue))]
        src_in = Mux(is_alu, ar.src_factor_in, gr.src_factor_in)
        src_out = Mux(is_alu, ar.src_factor_out, gr.src_factor_out)
        # The loop's registers are set up whenever no loop runs, not by the start: the
        # candidate's counts, zero offsets, and (from the finish cycle on, as the previous
        # instruction's pipeline reads them until then) its kind. So the start cycle's
        # decision (the take, the tokens, an empty loop) drives one flip-flop, `active`,
        # instead of a hundred (the ECP5 clock).
        with m.If(~active):
            m.d.sync += [i_left.eq(g.iter_out), j_left.eq(g.iter_in)]
            if k_left is not None:
                m.d.sync += k_left.eq(g.uop_end - g.uop_bgn)
            with m.If(drain <= 1):
                m.d.sync += [is_alu.eq(op == Opcode.ALU),
                             tensor.eq((op == Opcode.ALU) & ~a_.use_imm), reset.eq(g.reset)]
        for off, base, f_in, f_out in ((off_d, base_d, gr.dst_factor_in, gr.dst_factor_out),
                                       (off_s, base_s, src_in, src_out),
                                       (off_w, base_w, gr.wgt_factor_in, gr.wgt_factor_out)):
            nbase = base + f_out
            with m.If(~active):
                m.d.sync += [base.eq(0), off.eq(0)]
            with m.Elif(next_i):
                m.d.sync += [base.eq(nbase), off.eq(nbase)]
            with m.Elif(next_j):
                m.d.sync += off.eq(off + f_in)
        with m.If(drain != 0):
            m.d.sync += drain.eq(drain - 1)

        # short instructions (FINISH, empty loops) finish at s + 1
        short, short_d = Signal(), Signal()
        m.d.comb += short_d.eq(ctl.start & Mux(is_loop, n_zero, op != Opcode.LOAD))
        m.d.sync += short.eq(short_d)
        with m.If(ctl.start & is_loop & ~n_zero):
            m.d.sync += active.eq(1)
        m.d.comb += [fin.eq((drain == 1) | short | dma.finish),
                     fin_next.eq((drain == 2) | short_d | dma.finish_next),
                     self.finish_start.eq(ctl.start & (op == Opcode.FINISH))]

        # ---- pipeline -----------------------------------------------------------------------
        # An iteration issued at t: t-1 read the micro-op (from u's next value); t form the
        # indices, read INP and WGT; t+1 read ACC[dst] (a tensor ALU: ACC[src], then ACC[dst]
        # at t+2, its issues being two cycles apart), the GEMM products registered. Then, on
        # the compact datapath (one lane):
        #   t+2  the ALU on the word from the ACC RAM (GEMM: and the adder tree); its result is
        #        the ACC and OUT write of this cycle  [tensor: t+3]
        # and on the registered one (every wider core):
        #   t+2  the word into the operand register, the adder tree into its register
        #        [tensor: the source word into the source register; t+3 the dst word]
        #   t+3  the ALU on registers only, into the result register  [t+4]
        #   t+4  write ACC and OUT from the result register  [t+5]
        # A GEMM there registers its INP and WGT words at t+1 and reads ACC[dst] at t+2, as a
        # tensor ALU its dst: its word, sums, ALU and write come a cycle later (t+5).
        # A word from the ACC RAM misses the results written in its read cycle and later: it is
        # patched with the write of the previous cycle (whether the read hit it is registered
        # with it) and, on the registered datapath, newer first, with the result being
        # computed and the result being written in its arrival cycle.
        m.d.comb += self.uop_r_addr.eq(u_d)
        uop = data.View(lays.uop, self.uop_r_data[0])
        isrc = Signal(src_w)
        iw = Signal(lay_w)
        m.d.comb += [isrc.eq(uop.src + off_s), iw.eq(uop.wgt + off_w)]
        if self.compact:
            m.d.comb += [self.inp_r_addr.eq(isrc[:lay_i]), self.wgt_r_addr.eq(iw)]
        else:
            # the INP and WGT indices registered: the micro-op RAM's output and the index
            # adders in one cycle, the route to the INP and WGT block RAMs (the WGT buffer's
            # are 29 on the ECP5) in the next (GEMM_PIPELINE_CYCLES: a GEMM's finish is a
            # cycle later than on the compact datapath's pipeline)
            m.d.sync += [self.inp_r_addr.eq(isrc[:lay_i]), self.wgt_r_addr.eq(iw)]
        p1, p1_a, p1_s = Signal(), Signal(lay_a), Signal(lay_a)
        m.d.sync += [p1.eq(issue), p1_a.eq(uop.dst + off_d), p1_s.eq(isrc[:lay_a])]
        # a read at t+2 of the row issued at t: a tensor ALU's second read (its dst); on the
        # compact datapath also a GEMM's. On the registered one a GEMM reads its dst at t+3:
        # its INP and WGT words are read at t+1 and registered on their way from the block
        # RAMs to the multipliers (GemmCore's operand_regs)
        late = tensor if self.compact else tensor | ~is_alu
        t2, q2_a = Signal(), Signal(lay_a)
        m.d.sync += [t2.eq(p1 & late), q2_a.eq(p1_a)]
        rd_a = Signal(lay_a)
        t3, q3_a = Signal(), Signal(lay_a)
        if self.compact:
            m.d.comb += rd_a.eq(Mux(t2, q2_a, Mux(tensor, p1_s, p1_a)))
        else:
            m.d.sync += [t3.eq(t2 & ~is_alu), q3_a.eq(q2_a)]
            m.d.comb += rd_a.eq(Mux(t3, q3_a, Mux(t2 & tensor, q2_a,
                                                  Mux(tensor, p1_s, p1_a))))
        m.d.comb += self.acc_r_addr.eq(rd_a)
        # the write of the cycle before, for a word read in it
        lw_v = Signal(cfg.acc_elem_bits)
        m.d.sync += lw_v.eq(wr_v)

        # the lanes' adders, shifters and multipliers are the ALU's; GEMM accumulates with ADD
        gemm = m.submodules.gemm = GemmCore(cfg, self.dsp_products,
                                            operand_regs=not self.compact)
        alu = m.submodules.alu = TensorAlu(cfg, decoded=not self.compact)
        m.d.comb += [gemm.inp.eq(self.inp_r_data[0]), gemm.wgt.eq(self.wgt_r_data[0])]
        # the compact datapath's ALU result, written in its cycle (0 for a GEMM with reset)
        x_res = Signal(cfg.acc_elem_bits)
        lanes = cfg.batch * cfg.block_out
        # The ALU works from t+2 >= s+3, while the unit is busy and takes nothing, when the
        # candidate instruction is the unit's register: read the operation and the immediate
        # from the register itself, so no path runs from the command queue's memory (the
        # candidate's multiplexer input at a take) through the ALU (timing, not behaviour).
        a_run = data.View(lays.alu, ctl.insn)
        alu_op = Mux(is_alu, a_run.alu_opcode, AluOp.ADD)  # GEMM accumulates with ADD
        imm = Signal(cfg.acc_width_bits)
        m.d.comb += imm.eq(a_run.imm)  # sign-extended
        imm_vec = Cat(*[imm for _ in range(lanes)])
        if self.compact:
            src_v = Signal(cfg.acc_elem_bits)  # a tensor ALU's source word
            p2, t3, t3_a = Signal(), Signal(), Signal(lay_a)
            m.d.sync += [p2.eq(p1 & ~tensor), t3.eq(t2), t3_a.eq(q2_a)]
            lw_hit = Signal()  # the word read hit that write
            m.d.sync += lw_hit.eq(wr_en & (wr_a == rd_a))
            ram_word = Signal(cfg.acc_elem_bits)
            m.d.comb += ram_word.eq(Mux(lw_hit, lw_v, self.acc_r_data[0]))
            # the source arrives at t+2 and is held for the ALU at t+3 (writes land at odd
            # offsets from an issue, t+3, t+1, ..., so none is missed)
            with m.If(t2):
                m.d.sync += src_v.eq(ram_word)
            operand = ram_word
            operand_b = Mux(tensor, src_v, Mux(is_alu, imm_vec, gemm.sums))
            # the result is the write of its cycle, not a register of it: one forwarding
            # patch instead of three (about 180 iCE40 logic cells)
            m.d.comb += [wr_en.eq(p2 | t3), wr_a.eq(Mux(tensor, t3_a, q2_a)), wr_v.eq(x_res)]
        else:
            # the word arriving in this cycle: its row; an operand (GEMM, ALU immediate, a
            # tensor ALU's dst) or a tensor ALU's source
            d_a, d_op, d_src = Signal(lay_a), Signal(), Signal()
            m.d.sync += [d_a.eq(rd_a), d_op.eq((p1 & is_alu & ~tensor) | (t2 & tensor) | t3),
                         d_src.eq(p1 & tensor)]
            # X: the iteration the ALU works on in this cycle; W: the one written
            x_v, w_v = Signal(), Signal()
            x_a, w_a = Signal(lay_a), Signal(lay_a)
            operand = Signal(cfg.acc_elem_bits)
            # the ALU's second operand, one register: a tensor ALU's source word (loaded when
            # it arrives), else the immediate or the adder tree's sums of the cycle before
            # (is_alu and tensor hold from s + 1 to the finish, the ALU's cycles and the one
            # before them), so the multiplier's inputs are registers
            operand_b = Signal(cfg.acc_elem_bits, reset_less=True)
            # the result of the iteration the ALU worked on in the cycle before (W's): one of
            # two result registers (below)
            r_reg = Signal(cfg.acc_elem_bits)
            # the forwarded word: the result being computed (hit_x), else the one being
            # written (hit_w), else the RAM's. MUL's product is not forwarded (below), so no
            # path runs from the multiplier blocks back into the operand registers.
            # The comparisons are made in the read's cycle, a cycle before the word arrives
            # (the word's row is rd_a then, X's is d_a, W's x_a), and registered: the block
            # RAM's word comes late in its cycle (the ECP5 block's clock-to-output and the
            # route from it) and meets only flip-flop-selected multiplexers. In each lane the
            # word meets one, the last before the operand register, selected by a register
            # of the lane's own (ram_a, ram_b: no forwarding and no write of the cycle before,
            # for operand_b a tensor ALU's source word too), so no select fans out to every
            # operand bit and no comparator precedes the word's multiplexer.
            hit_x, hit_w = Signal(), Signal()
            hit_x_n, hit_w_n, hit_l_n = Signal(), Signal(), Signal()
            m.d.comb += [hit_x_n.eq(d_op & (d_a == rd_a)), hit_w_n.eq(x_v & (x_a == rd_a)),
                         hit_l_n.eq(w_v & (w_a == rd_a))]
            m.d.sync += [hit_x.eq(hit_x_n), hit_w.eq(hit_w_n)]
            no_hit_n = ~hit_x_n & ~hit_w_n & ~hit_l_n
            ram_a = [Signal(name=f"ram_a{k}{REPLICA_SUFFIX}") for k in range(lanes)]
            ram_b = [Signal(name=f"ram_b{k}{REPLICA_SUFFIX}") for k in range(lanes)]
            for k in range(lanes):
                m.d.sync += [ram_a[k].eq(no_hit_n), ram_b[k].eq(no_hit_n & p1 & tensor)]
            ram_raw = self.acc_r_data[0]
            # The ALU's operation, decoded into a register of each lane's own (ALU_CONTROL):
            # no decoding on the ALU's paths, and no one net to all the lanes' adders and
            # multiplexers, which lie across the die along the ALU's multiplier blocks (the
            # ECP5 clock). The build keeps the copies apart (REPLICA_SUFFIX). The operation
            # holds from s + 1 (is_alu and the control's register), its copies from s + 2,
            # the ALU's first cycle is t + 3 >= s + 4; a copy changes a cycle after the
            # operation, later than the previous instruction's last use of it.
            ctl_now = alu_control(alu_op)
            ctl = [Signal(ALU_CONTROL, name=f"alu_ctl{k}{REPLICA_SUFFIX}")
                   for k in range(lanes)]
            for k in range(lanes):
                m.d.sync += ctl[k].eq(ctl_now)
                m.d.comb += alu.control[k].eq(ctl[k])
            # (`keep`: synthesis maps the rest apart, so the chain's multiplexer below meets
            # one LUT instead of a wide multiplexer tree)
            # (the forwarded word where some forwarding or the last write applies: lw_v when
            # neither hit)
            fwd_other = Signal(cfg.acc_elem_bits, attrs={"keep": 1})
            m.d.comb += fwd_other.eq(Mux(hit_x, alu.other, Mux(hit_w, r_reg, lw_v)))
            is_mul = ctl[0].mul
            # An immediate MUL's word that the iteration in the ALU (X) is about to write
            # (mul_hit): its value is X's product a * imm, which is not forwarded. The word
            # takes X's own operand a and the immediate's square instead, a * imm * imm being
            # the product of the product (modulo 2**32, as every MUL). When X itself was such
            # a word (x_chain: its operands a' and imm**2, its product a' * imm**3), the word
            # takes the result being written, W's a' * imm, with imm**2 again. The result
            # register always holds true results. A tensor ALU's dst words arrive two
            # cycles apart, never while the iteration before is in the ALU, and GEMM adds.
            mul_hit, x_chain = Signal(), Signal()
            m.d.comb += mul_hit.eq(d_op & hit_x & is_mul & ~tensor)
            m.d.sync += x_chain.eq(mul_hit)
            imm_sq = Signal(cfg.acc_width_bits)  # from s + 2; the first mul_hit is at s + 4
            m.d.sync += imm_sq.eq(a_run.imm * a_run.imm)
            mul_a = Signal(cfg.acc_elem_bits)
            m.d.comb += mul_a.eq(Mux(x_chain, r_reg, operand))
            fwd_alt = Signal(cfg.acc_elem_bits, attrs={"keep": 1})
            fwd = Signal(cfg.acc_elem_bits)
            for k in range(lanes):
                w = slice(32 * k, 32 * (k + 1))
                m.d.comb += [fwd_alt[w].eq(Mux(hit_x & ctl[k].mul, mul_a[w], fwd_other[w])),
                             fwd[w].eq(Mux(ram_a[k], ram_raw[w], fwd_alt[w]))]
            # operand_b takes no result being computed: a tensor ALU's source word that the
            # iteration in the ALU is about to write (its issues are two cycles apart, so the
            # ALU reads the source two cycles after it arrives) is patched from the result
            # register in the next cycle, when no source word arrives. So no path runs from
            # the ALU back into its second operand (the ECP5 clock), and MUL's product, which
            # is never forwarded, needs no case of its own.
            patch_b = Signal()
            m.d.sync += patch_b.eq(d_src & hit_x)
            imm_b = Mux(mul_hit, Cat(*[imm_sq for _ in range(lanes)]), imm_vec)
            # (a tensor ALU's source where the write being made or the last one applies;
            # anything where the result being computed does: it is patched)
            src_b = Mux(hit_w, r_reg, lw_v)
            b_alt = Signal(cfg.acc_elem_bits, attrs={"keep": 1})
            m.d.comb += b_alt.eq(Mux(patch_b, r_reg, Mux(tensor, src_b, imm_b)))
            # The adder tree's sums (late: the products' registers, then three adders) meet
            # one multiplexer before the RAM word's, selected by a copy of is_alu of each
            # lane's own (set as is_alu is) and patch_b: a tensor ALU, the only one patched,
            # is an ALU, so this is the chain patch_b, tensor, is_alu with sums last
            alu_b = [Signal(name=f"alu_b{k}{REPLICA_SUFFIX}") for k in range(lanes)]
            with m.If(~active & (drain <= 1)):
                m.d.sync += [alu_b[k].eq(op == Opcode.ALU) for k in range(lanes)]
            b_sel = Signal(cfg.acc_elem_bits, attrs={"keep": 1})
            b_next = Signal(cfg.acc_elem_bits)
            for k in range(lanes):
                w = slice(32 * k, 32 * (k + 1))
                m.d.comb += [b_sel[w].eq(Mux(~alu_b[k] & ~patch_b, gemm.sums[w], b_alt[w])),
                             b_next[w].eq(Mux(ram_b[k], ram_raw[w], b_sel[w]))]
            m.d.sync += [x_v.eq(d_op), x_a.eq(d_a), w_v.eq(x_v), w_a.eq(x_a)]
            # MUL's product and every other result in registers of their own, selected after
            # them by the operation (which holds past the instruction's last write)
            r_mul = Signal(cfg.acc_elem_bits)
            r_oth = Signal(cfg.acc_elem_bits)
            m.d.sync += [r_mul.eq(alu.product), r_oth.eq(alu.other)]
            for k in range(lanes):
                w = slice(32 * k, 32 * (k + 1))
                m.d.comb += r_reg[w].eq(Mux(ctl[k].mul, r_mul[w], r_oth[w]))
            # MUL's operands: registers of their own, loaded as the operand registers, so
            # that they can sit beside the lanes' pinned multiplier blocks while operand_b
            # sits between the adder tree and the lanes' adders and shifters (the ECP5
            # clock). The second's never takes the adder tree's sums (a GEMM only adds): a
            # multiplexer less in front of it. The first's has operand's very input, and
            # yosys merges the two (the `_rep` keep does not hold on these registers); the
            # measured netlist is this source's.
            op_a_m = Signal(cfg.acc_elem_bits, name=f"mul_op_a{REPLICA_SUFFIX}")
            op_b_m = Signal(cfg.acc_elem_bits, name=f"mul_op_b{REPLICA_SUFFIX}",
                            reset_less=True)
            b_next_m = Signal(cfg.acc_elem_bits)
            for k in range(lanes):
                w = slice(32 * k, 32 * (k + 1))
                m.d.comb += b_next_m[w].eq(Mux(ram_b[k], ram_raw[w], b_alt[w]))
            with m.If(d_op):
                m.d.sync += [operand.eq(fwd), op_a_m.eq(fwd)]
            with m.If(~tensor | d_src | patch_b):
                m.d.sync += [operand_b.eq(b_next), op_b_m.eq(b_next_m)]
            # reset: the operands are zeros (the flip-flops' synchronous reset), and every
            # operation of two zeros is zero, so no multiplexer follows the ALU (MUL's path
            # into the result register is the ECP5 clock). `reset` holds from the start to
            # the finish, and the previous instruction's last operands were taken before its
            # finish.
            with m.If(reset):
                m.d.sync += [operand.eq(0), operand_b.eq(0), op_a_m.eq(0), op_b_m.eq(0)]
            m.d.comb += [alu.mul_a.eq(op_a_m), alu.mul_b.eq(op_b_m)]
            m.d.comb += [wr_en.eq(w_v), wr_a.eq(w_a), wr_v.eq(r_reg)]
        if self.compact:
            m.d.comb += alu.op.eq(alu_op)
        m.d.comb += [alu.a.eq(operand), alu.b.eq(operand_b)]
        if self.compact:
            m.d.comb += x_res.eq(Mux(reset, 0, alu.out))
        m.d.comb += [self.out_w_en[0].eq(wr_en), self.out_w_addr.eq(wr_a),
                     self.out_w_data[0].eq(Cat(*[wr_v[k * 32:k * 32 + 8]
                                                 for k in range(lanes)]))]
        return m
