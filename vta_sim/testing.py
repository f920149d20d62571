"""Random legal instruction streams, shared by the simulator's tests and the RTL cross-check.

:func:`random_program` builds a stream that any correct implementation must execute the same
way: every cross-unit data dependency is ordered by dependency tokens, the token queues are
empty at FINISH, and every DRAM and SRAM access is in range. Its shape::

    prologue  load:    LOAD INP, WGT (both thread halves), push l2g
              compute: LOAD UOP, LOAD ACC (both halves), ALU ADD 0 over them (defines OUT),
                       the first popping l2g
    phase p   load:    random LOAD INP/WGT (pads, strides, padding-only, NOPs) into half t,
                       popping g2l when p >= threads, pushing l2g
              compute: random GEMM (reset, loops), ALU (MIN MAX ADD SHR MUL, immediates incl.
                       negative shifts, tensor operands), LOAD ACC/ACC_8BIT/UOP, NOPs on half t;
                       popping l2g (and s2g when p >= threads), pushing g2l and g2s
              store:   random STOREs of OUT half t (and NOPs), popping g2s, pushing s2g
    epilogue  load NOPs drain g2l and push l2g; compute NOPs drain s2g; FINISH

where ``t = p % threads`` and ``threads`` is 1 or 2 (two virtual threads double-buffer the
SRAMs). The prologue defines every SRAM row the program can read, so the result does not depend
on what the buffers held before (a device that keeps its SRAMs between runs gives the same
answer as a fresh one).
"""

from __future__ import annotations

import numpy as np

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import HwConfig, preset
from vtakit.vta_hw.isa import AluInsn, AluOp, FinishInsn, GemmInsn, MemInsn, MemType, Opcode

from .image import RunImage

__all__ = ["random_program", "compiled_mix_stream", "IMAGE_BYTES"]

#: Bytes of the DRAM image of a random program (data, micro-ops, outputs, instructions).
IMAGE_BYTES = 256 << 10
_DATA = 64 << 10      # random input data: INP, WGT, ACC loads read [0, _DATA)
_UOPS = _DATA         # the micro-ops
_OUT = 96 << 10       # STOREs write [_OUT, _OUT + 64 KiB)
_INSNS = 160 << 10    # the stream (at a random 16-byte offset above this)
_R = 32               # SRAM rows per buffer and thread that a program uses
_SET = 8              # micro-ops per (thread, GEMM/ALU) set


def _mem(opcode: Opcode, mt: MemType, sram: int, dram: int, y: int, x: int, stride: int,
         pads: tuple[int, int, int, int] = (0, 0, 0, 0)) -> MemInsn:
    return MemInsn(opcode=opcode, memory_type=mt, sram_base=sram, dram_base=dram, y_size=y,
                   x_size=x, x_stride=stride, y_pad_0=pads[0], y_pad_1=pads[1],
                   x_pad_0=pads[2], x_pad_1=pads[3])


class _Gen:
    def __init__(self, cfg: HwConfig, rng: np.random.Generator, threads: int):
        self.cfg, self.rng, self.threads = cfg, rng, threads
        need = 2 * _R
        for name, depth in (("inp", cfg.inp_depth), ("wgt", cfg.wgt_depth),
                            ("acc", cfg.acc_depth)):
            if depth < need:
                raise ValueError(f"random_program needs {need} rows of {name.upper()} "
                                 f"(configuration has {depth})")
        self.base = {n: [0, d // 2 - _R if threads == 2 else _R]
                     for n, d in (("inp", cfg.inp_depth), ("wgt", cfg.wgt_depth),
                                  ("acc", cfg.acc_depth))}
        self.base["acc"][1] = cfg.acc_depth // 2 if threads == 2 else _R
        # micro-op sets: [0, 2) prologue; then per thread a GEMM set and an ALU set
        self.set_at = {(t, k): 2 + (2 * t + k) * _SET for t in range(2) for k in range(2)}

    def r(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def uops(self) -> np.ndarray:
        rows = [(self.base["acc"][t], self.base["acc"][t], 0) for t in range(2)]
        h = _R // 2
        for t in range(2):
            a, i, w = self.base["acc"][t], self.base["inp"][t], self.base["wgt"][t]
            rows += [(a + self.r(0, h - 1), i + self.r(0, h - 1), w + self.r(0, h - 1))
                     for _ in range(_SET)]
            rows += [(a + self.r(0, h - 1), a + self.r(0, h - 1), 0) for _ in range(_SET)]
        return np.array(rows, dtype=np.int64)

    def load(self, mt: MemType, t: int, opcode: Opcode = Opcode.LOAD) -> MemInsn:
        """A random in-range 2-D load (or store) of half ``t``."""
        buf = {MemType.INP: "inp", MemType.WGT: "wgt", MemType.ACC: "acc",
               MemType.ACC_8BIT: "acc", MemType.OUT: "acc"}[mt]
        e = self.cfg.elem_bytes(mt)
        while True:
            y, x = self.r(0, 3), self.r(1, 4)
            pads = ((0, 0, 0, 0) if opcode == Opcode.STORE
                    else tuple(self.r(0, 2) if self.r(0, 1) else 0 for _ in range(4)))
            rows = (pads[0] + y + pads[1]) * (pads[2] + x + pads[3])
            if rows <= _R and (y > 0 or opcode == Opcode.LOAD):
                break
        stride = x + self.r(0, 3)
        span = (max(y, 1) - 1) * stride + x
        if opcode == Opcode.STORE:
            lo, hi = _OUT // e, (_OUT + (64 << 10)) // e - span
        else:
            lo, hi = 0, _DATA // e - span
        sram = self.base[buf][t] + self.r(0, _R - rows)
        return _mem(opcode, mt, sram, self.r(lo, hi), y, x, stride, pads)  # type: ignore

    def loops(self, t: int, kind: int) -> dict:
        bgn = self.set_at[(t, kind)] + self.r(0, _SET)
        end = min(bgn + self.r(0, 4), self.set_at[(t, kind)] + _SET)
        return dict(uop_bgn=bgn, uop_end=end, iter_out=self.r(1, 3), iter_in=self.r(1, 3),
                    dst_factor_out=self.r(0, 3), dst_factor_in=self.r(0, 3),
                    src_factor_out=self.r(0, 3), src_factor_in=self.r(0, 3),
                    reset=int(self.r(0, 7) == 0))

    def compute(self, t: int) -> isa.Insn:
        kind = self.rng.choice(["gemm", "gemm", "alu", "alu", "alu", "acc", "uop", "nop"])
        if kind == "gemm":
            return GemmInsn(**self.loops(t, 0), wgt_factor_out=self.r(0, 3),
                            wgt_factor_in=self.r(0, 3))
        if kind == "alu":
            op = AluOp(self.r(0, 4))
            use_imm = self.r(0, 1)
            if op == AluOp.SHR and self.r(0, 3) == 0:
                imm = int(self.rng.choice([31, 32, 40, -31, -32, -40, -1]))
            elif op == AluOp.MUL:
                imm = self.r(-300, 300)
            else:
                imm = self.r(-40, 40)
            return AluInsn(**self.loops(t, 1), alu_opcode=op, use_imm=use_imm, imm=imm)
        if kind == "acc":
            return self.load(MemType.ACC if self.r(0, 1) else MemType.ACC_8BIT, t)
        if kind == "uop":  # reload a set of micro-ops with the same contents
            at = self.set_at[(self.r(0, self.threads - 1), self.r(0, 1))]
            return _mem(Opcode.LOAD, MemType.UOP, at, _UOPS // isa.UOP_BYTES + at, 1, _SET, _SET)
        return GemmInsn(uop_bgn=self.set_at[(t, 0)], uop_end=self.set_at[(t, 0)])

    def stage(self, make, n: int, nop: isa.Insn) -> list[isa.Insn]:
        out = [make() for _ in range(n)]
        for _ in range(self.r(0, 1)):
            out.insert(self.r(0, len(out)), nop)
        return out


def _flag(stage: list[isa.Insn], first: dict, last: dict) -> None:
    stage[0] = isa.replace(stage[0], **first)
    stage[-1] = isa.replace(stage[-1], **last)


def random_program(cfg: HwConfig, seed: int, *, phases: int | None = None,
                   threads: int | None = None) -> RunImage:
    """A random legal stream with its DRAM image (:data:`IMAGE_BYTES` bytes), reproducible from
    ``seed``. See the module docstring for its shape."""
    cfg = cfg.validate()
    rng = np.random.default_rng(seed)
    threads = threads or int(rng.integers(1, 3))
    phases = phases or int(rng.integers(1, 5))
    g = _Gen(cfg, rng, threads)
    dram = np.zeros(IMAGE_BYTES, np.uint8)
    dram[:_DATA] = rng.integers(0, 256, _DATA, dtype=np.uint8)
    uops = g.uops()
    dram[_UOPS:_UOPS + isa.UOP_BYTES * len(uops)] = isa.encode_uops(uops, cfg).view(np.uint8)
    L, S = Opcode.LOAD, Opcode.STORE
    load_nop = _mem(L, MemType.INP, 0, 0, 0, 0, 0)
    store_nop = _mem(S, MemType.OUT, 0, 0, 0, 0, 0)
    prog: list[isa.Insn] = []
    for t in range(2):
        for mt, buf in ((MemType.INP, "inp"), (MemType.WGT, "wgt")):
            prog.append(_mem(L, mt, g.base[buf][t], g.r(0, _DATA // cfg.elem_bytes(mt) - _R),
                             1, _R, _R))
    prog[-1] = isa.replace(prog[-1], push_next=1)
    prog.append(_mem(L, MemType.UOP, 0, _UOPS // isa.UOP_BYTES, 1, len(uops), len(uops)))
    for t in range(2):
        prog.append(_mem(L, MemType.ACC, g.base["acc"][t],
                         g.r(0, _DATA // cfg.elem_bytes(MemType.ACC) - _R), 1, _R, _R))
    for t in range(2):
        prog.append(AluInsn(uop_bgn=t, uop_end=t + 1, iter_out=_R, dst_factor_out=1,
                            src_factor_out=1, alu_opcode=AluOp.ADD, use_imm=1, imm=0,
                            pop_prev=int(t == 0)))
    for p in range(phases):
        t = p % threads
        ld = g.stage(lambda t=t: g.load(MemType.INP if g.r(0, 1) else MemType.WGT, t), g.r(1, 3),
                     load_nop)
        _flag(ld, {"pop_next": int(p >= threads)}, {"push_next": 1})
        cp = g.stage(lambda t=t: g.compute(t), g.r(1, 4),
                     GemmInsn(uop_bgn=g.set_at[(t, 0)], uop_end=g.set_at[(t, 0)]))
        _flag(cp, {"pop_prev": 1, "pop_next": int(p >= threads)},
              {"push_prev": 1, "push_next": 1})
        st = g.stage(lambda t=t: g.load(MemType.OUT, t, S), g.r(1, 2), store_nop)
        _flag(st, {"pop_prev": 1}, {"push_prev": 1})
        prog += ld + cp + st
    left = min(phases, threads)
    drain = [isa.replace(load_nop, pop_next=1) for _ in range(left)]
    drain[-1] = isa.replace(drain[-1], push_next=1)
    prog += drain
    prog += [GemmInsn(pop_next=1) for _ in range(left - 1)]
    prog.append(FinishInsn(pop_prev=1, pop_next=1))
    insn_addr = _INSNS + 16 * int(rng.integers(0, 64))
    raw = np.frombuffer(isa.encode_stream(prog, cfg), np.uint8)
    dram[insn_addr:insn_addr + raw.size] = raw
    desc = (f"random_program(cfg {cfg.hash}, seed={seed}): {len(prog)} instructions, "
            f"{phases} phases, {threads} thread(s)")
    return RunImage(cfg=cfg, dram=dram, insn_addr=insn_addr, insn_count=len(prog),
                    description=desc)


def compiled_mix_stream(n: int, uop_every: int) -> tuple[HwConfig, np.ndarray, np.ndarray]:
    """``(cfg, stream, dram)``: ``n`` instructions of a compiled layer's mix on the ``default``
    preset (LOAD INP, GEMM, ALU, STORE, and a LOAD UOP before every ``uop_every``-th of them; a
    random block of 2,000 repeated, FINISH last), every index in range, and a DRAM image with
    the micro-ops the LOAD UOPs read. For the stream checker's test and benchmark; the
    tokens are not balanced, so it is not meant to run."""
    rng = np.random.default_rng(0)
    cfg = preset("default")
    out: list[isa.Insn] = []
    k = 0
    while len(out) < 2000:
        if k % uop_every == 0:
            b = int(rng.integers(0, 4000))
            out.append(isa.MemInsn(memory_type=MemType.UOP, sram_base=b, dram_base=b, y_size=1,
                                   x_size=64, x_stride=64))
        b = int(rng.integers(0, 4000))
        out.append([
            isa.MemInsn(memory_type=MemType.INP, sram_base=b % 1000, dram_base=1 << 16, y_size=4,
                        x_size=16, x_stride=16),
            isa.GemmInsn(uop_bgn=b, uop_end=b + 32, iter_out=4, iter_in=8, dst_factor_out=16,
                         dst_factor_in=1, src_factor_out=16, src_factor_in=1,
                         wgt_factor_out=4, wgt_factor_in=1),
            isa.AluInsn(uop_bgn=b, uop_end=b + 8, iter_out=4, iter_in=8, dst_factor_out=16,
                        dst_factor_in=1, src_factor_out=16, src_factor_in=1, use_imm=1),
            isa.MemInsn(opcode=Opcode.STORE, memory_type=MemType.OUT, sram_base=b % 1000,
                        dram_base=(4 << 20) // 16, y_size=4, x_size=16, x_stride=16),
        ][k % 4])
        k += 1
    block = np.frombuffer(isa.encode_stream(out[:2000], cfg), np.uint8)
    raw = np.concatenate([np.tile(block, -(-(n - 1) // 2000))[:(n - 1) * isa.INSN_BYTES],
                          np.frombuffer(isa.encode_stream([isa.FinishInsn()], cfg), np.uint8)])
    dram = np.zeros(8 << 20, np.uint8)
    uops = rng.integers(0, 64, (4096, 3))
    dram[:4096 * 4] = isa.encode_uops(uops, cfg).view(np.uint8)
    return cfg, raw, dram
