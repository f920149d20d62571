"""The functional simulator bounds its work as the timed one does: the same ``cycle_limit``
(default :data:`DEFAULT_CYCLE_LIMIT`), in the same unit (cycles, counted by the functional model
in closed form as a lower bound of the timed count), refuses an instruction that asks for more
before it runs, says which one, how much it asks for, the limit and how to raise it; the
wall-clock ``timeout_s`` stops a long stream of legal heavy instructions in both models.

One class per behaviour, run in both models (``timing`` False and True); the models' agreement
on which side of a limit a stream lies is checked across them."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from click.testing import CliRunner
from sim_helpers import Image

from vtakit.vta_hw import isa
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.isa import AluInsn, FinishInsn, GemmInsn, MemInsn, MemType, Opcode
from vtakit.vta_hw.timing_facts import alu_cycles, gemm_cycles, n_uops, pad_elems
from vtakit.vta_sim import (
    DEFAULT_CYCLE_LIMIT,
    RunImage,
    SimCycleLimit,
    SimTimeout,
    Simulator,
    memory,
)
from vtakit.vta_sim.cli import sim_command
from vtakit.vta_sim.program import decode_program
from vtakit.vta_sim.testing import compiled_mix_stream, random_program
from vtakit.vta_sim.work import min_cycles, stream_min_cycles, unit_min_cycles

CFG = preset("default")
LIMIT = DEFAULT_CYCLE_LIMIT
UOP_FIELD_MAX = 64  # the random micro-ops' fields are below this
#: "well under a second": what one refusal (or one timeout's overshoot) may take on a busy host
PROMPT_S = 0.5
RAISE_HINT = r"raise the limit: cycle_limit= of Simulator\.run or SimDevice \(None: no limit\)"


def _depths(gemm: bool) -> dict[str, int]:
    return {"dst": CFG.acc_depth, "src": CFG.inp_depth if gemm else CFG.acc_depth,
            **({"wgt": CFG.wgt_depth} if gemm else {})}


def random_loop(rng: np.random.Generator, gemm: bool, *, at_least: int = 0,
                at_most: int | None = None) -> isa.Insn:
    """A GEMM or ALU instruction whose every index is in range (with micro-op fields below
    :data:`UOP_FIELD_MAX`), with random loop extents and factors, whose closed-form cycles lie
    in ``[at_least, at_most]``."""
    while True:
        nu = int(rng.integers(1, CFG.uop_depth + 1)) if rng.integers(0, 2) else \
            int(rng.integers(1, 64))
        bgn = int(rng.integers(0, CFG.uop_depth - nu + 1))
        io, ii = (min(16383, int(2 ** rng.uniform(0, 14.0)) or 1) for _ in range(2))
        use_imm = int(rng.integers(0, 2))
        cyc = gemm_cycles(nu * io * ii) if gemm else alu_cycles(nu * io * ii, bool(use_imm))
        if at_least <= cyc and (at_most is None or cyc <= at_most):
            break
    factors = {}
    for name, depth in _depths(gemm).items():
        fmax = 1023 if name == "wgt" else 2047  # the fields' widths
        room = depth - UOP_FIELD_MAX
        fo = int(rng.integers(0, min(fmax, room // max(1, io - 1)) + 1)) \
            if rng.integers(0, 2) else 0
        room -= fo * (io - 1)
        fi = int(rng.integers(0, min(fmax, room // max(1, ii - 1)) + 1)) \
            if rng.integers(0, 2) else 0
        factors |= {f"{name}_factor_out": fo, f"{name}_factor_in": fi}
    common = dict(reset=int(rng.integers(0, 8) == 0), uop_bgn=bgn, uop_end=bgn + nu,
                  iter_out=io, iter_in=ii, **factors)
    if gemm:
        return GemmInsn(**common)
    return AluInsn(alu_opcode=int(rng.integers(0, 5)), use_imm=use_imm,
                   imm=int(rng.integers(-40, 40)), **common)


def loop_cycles(insn: isa.Insn) -> int:
    """The timing contract's duration of a GEMM/ALU (timing_facts, not the code under test)."""
    n = n_uops(vars(insn))
    return gemm_cycles(n) if insn.opcode == Opcode.GEMM else alu_cycles(n, bool(insn.use_imm))


def kind(insn: isa.Insn) -> str:
    return "GEMM" if insn.opcode == Opcode.GEMM else f"ALU {isa.AluOp(insn.alu_opcode).name}"


def simulator(rng: np.random.Generator, prog: list[isa.Insn]) -> tuple[Simulator, int, int]:
    """A simulator holding ``prog`` and random on-chip data (micro-ops in range)."""
    img = Image(CFG)
    addr, n = img.put_insns(prog)
    sim = Simulator(CFG, img.dram)
    st = sim.state
    st.uop[:] = isa.encode_uops(rng.integers(0, UOP_FIELD_MAX, (CFG.uop_depth, 3)), CFG)
    st.acc[:] = rng.integers(-2**31, 2**31, st.acc.shape)
    st.inp[:] = rng.integers(-128, 128, st.inp.shape)
    st.wgt[:] = rng.integers(-128, 128, st.wgt.shape)
    return sim, addr, n


def timed_run(sim: Simulator, addr: int, n: int, timing: bool, within_s: float = PROMPT_S,
              **kw):
    """``sim.run``, which must return or raise within ``within_s`` seconds."""
    t0 = time.perf_counter()
    try:
        return sim.run(addr, n, timing=timing, **kw)
    finally:
        assert time.perf_counter() - t0 < within_s, f"took {time.perf_counter() - t0:.2f} s"


def work_text(insn: isa.Insn) -> str:
    """The message's account of what ``insn`` asks for, as a regex."""
    nu = insn.uop_end - insn.uop_bgn
    return (rf"at least {loop_cycles(insn)} cycles \({nu} micro-ops x iter_out "
            rf"{insn.iter_out} x iter_in {insn.iter_in} = {n_uops(vars(insn))} micro-op "
            rf"iterations\)")


def refusal(timing: bool, k: int, insn: isa.Insn, limit: int = LIMIT) -> str:
    """The message a refusal of instruction ``k`` (``insn``) at ``limit`` matches."""
    head = rf"^instruction #{k} {kind(insn)}\(.*uop_end={insn.uop_end}, .*\): cycle limit {limit} "
    if timing:
        return (head + rf"reached before FINISH completed \(.*compute: #{k} .*; #{k} alone takes "
                + work_text(insn) + r"; expected the run to finish within the limit; .*"
                + RAISE_HINT)
    return (head + r"exceeded \(functional run; refused before it executes\): this instruction "
            r"alone takes " + work_text(insn) + r".*\(expected the run to finish within the "
            r"limit; .*" + RAISE_HINT)


class WorkLimit:
    """The cycle limit in one model (``timing``)."""

    timing: bool

    @pytest.mark.parametrize("seed", range(24))
    def test_a_random_heavy_instruction_is_refused_promptly(self, seed):
        rng = np.random.default_rng(seed)
        heavy = random_loop(rng, gemm=seed % 2 == 0, at_least=LIMIT + 1)
        with pytest.raises(SimCycleLimit, match=refusal(self.timing, 0, heavy)) as info:
            timed_run(*simulator(rng, [heavy, FinishInsn()]), self.timing)
        assert info.value.index == 0 and info.value.insn["iter_out"] == heavy.iter_out

    @pytest.mark.parametrize("seed", range(12))
    def test_a_heavy_instruction_after_light_ones_is_refused_by_index(self, seed):
        rng = np.random.default_rng(100 + seed)
        light = [random_loop(rng, gemm=bool(rng.integers(0, 2)), at_most=5000)
                 for _ in range(int(rng.integers(1, 6)))]
        heavy = random_loop(rng, gemm=seed % 2 == 1, at_least=LIMIT + 1)
        k = len(light)
        with pytest.raises(SimCycleLimit, match=refusal(self.timing, k, heavy)) as info:
            timed_run(*simulator(rng, light + [heavy, FinishInsn()]), self.timing)
        assert info.value.index == k
        if not self.timing:  # the compute unit's sum before it, then with it
            before = sum(loop_cycles(i) for i in light)
            assert re.search(rf"with the compute unit's {k} earlier instructions? \(at least "
                             rf"{before} cycles\), at least {before + loop_cycles(heavy)} ",
                             str(info.value))

    def test_many_instructions_under_the_limit_add_up_past_it(self):
        # 2^29 + 6 cycles each (reset: quick to simulate): the 8th takes compute past 2^32
        step = GemmInsn(reset=1, uop_end=8192, iter_out=16384 - 1, iter_in=4)
        steps = [step] * 12
        cyc = loop_cycles(step)
        k = LIMIT // cyc  # 0-based index of the first one past the limit
        rng = np.random.default_rng(0)
        with pytest.raises(SimCycleLimit, match=rf"^instruction #{k} GEMM") as info:
            timed_run(*simulator(rng, steps + [FinishInsn()]), self.timing)
        if not self.timing:
            assert (f"with the compute unit's {k} earlier instructions (at least {k * cyc} "
                    f"cycles), at least {(k + 1) * cyc}") in str(info.value)

    def test_a_stream_just_under_the_default_limit_runs(self):
        # 8192 x 16383 x 32 = 2^32 - 2^18 iterations, GEMM and ALU, quick to simulate
        rng = np.random.default_rng(1)
        for insn in (GemmInsn(uop_end=8192, iter_out=16383, iter_in=32),
                     AluInsn(uop_end=8192, iter_out=16383, iter_in=32, use_imm=1, imm=3,
                             alu_opcode=isa.AluOp.MAX)):
            stats = timed_run(*simulator(rng, [insn, FinishInsn()]), self.timing,
                              within_s=5.0)
            assert stats.gemm_uops + stats.alu_uops == 8192 * 16383 * 32
            if self.timing:
                assert LIMIT - (1 << 18) < stats.cycles <= LIMIT

    @pytest.mark.parametrize("seed", range(8))
    def test_the_limit_is_exact_at_the_models_own_count(self, seed):
        """A stream runs at a limit equal to its count (the timed cycles, or the functional
        model's closed-form bound) and is refused one cycle below."""
        rng = np.random.default_rng(200 + seed)
        prog = [random_loop(rng, gemm=bool(rng.integers(0, 2)), at_most=20000)
                for _ in range(int(rng.integers(1, 5)))] + [FinishInsn()]
        sim, addr, n = simulator(rng, prog)
        dram, state = sim.dram.copy(), sim.state.copy()
        if self.timing:
            count = Simulator(CFG, dram.copy()).run(addr, n).cycles
        else:
            count = max(unit_min_cycles(CFG, decode_program(dram[addr:addr + 16 * n], CFG))
                        .values())
            assert count == sum(loop_cycles(i) for i in prog[:-1]) + 1
        for limit, ok in ((count, True), (count - 1, False)):
            sim = Simulator(CFG, dram.copy())
            sim.state = state.copy()
            if ok:
                sim.run(addr, n, timing=self.timing, cycle_limit=limit)
            else:
                with pytest.raises(SimCycleLimit, match=rf"cycle limit {limit} "):
                    sim.run(addr, n, timing=self.timing, cycle_limit=limit)

    def test_the_limit_is_overridden_the_same_way(self, tmp_path):
        from vtakit.driver import CycleLimitError
        from vtakit.driver.devices.sim import SimDevice

        # 2^33 + 6 cycles: past the default, quick to simulate (reset, every factor 0)
        huge = [GemmInsn(reset=1, uop_end=8192, iter_out=16384 - 1, iter_in=64), FinishInsn()]
        small = [GemmInsn(uop_end=1, iter_out=100, iter_in=100), FinishInsn()]
        stream = isa.encode_stream(huge, CFG)
        img = Image(CFG, size=64 << 10)
        addr, n = img.put_insns(huge)
        # Simulator.run: the default, a lower limit, none
        with pytest.raises(SimCycleLimit, match=rf"cycle limit {LIMIT} "):
            Simulator(CFG, img.dram.copy()).run(addr, n, timing=self.timing)
        Simulator(CFG, img.dram.copy()).run(addr, n, timing=self.timing, cycle_limit=None)
        Simulator(CFG, img.dram.copy()).run(addr, n, timing=self.timing, cycle_limit=1 << 40)
        # SimDevice
        dev = SimDevice(CFG, dram_bytes=1 << 16, timing=self.timing)
        assert dev.cycle_limit == LIMIT
        dev.write(0, stream)
        dev.run(0, n)
        with pytest.raises(CycleLimitError, match=rf"#0 GEMM.*cycle limit {LIMIT} .*"
                                                  + RAISE_HINT):
            dev.wait(10)
        dev = SimDevice(CFG, dram_bytes=1 << 16, timing=self.timing, cycle_limit=None)
        dev.write(0, stream)
        dev.run(0, n)
        dev.wait(10)
        dev = SimDevice(CFG, dram_bytes=1 << 16, timing=self.timing, cycle_limit=5000)
        dev.write(0, isa.encode_stream(small, CFG))
        dev.run(0, len(small))
        with pytest.raises(CycleLimitError, match=r"cycle limit 5000 "):
            dev.wait(10)
        # vtakit sim: --cycle-limit N, and 0 for none
        path = tmp_path / "huge.npz"
        RunImage(CFG, img.dram, addr, n).save(path)
        mode = [] if self.timing else ["--no-timing"]
        res = CliRunner().invoke(sim_command, [str(path), *mode])
        assert res.exit_code == 1 and f"cycle limit {LIMIT} " in res.output, res.output
        assert "--cycle-limit of vtakit sim (0: no limit)" in res.output
        res = CliRunner().invoke(sim_command, [str(path), *mode, "--cycle-limit", "0"])
        assert res.exit_code == 0, res.output

    def test_a_bad_limit_is_refused(self):
        img = Image(CFG, size=4096)
        addr, n = img.put_insns([FinishInsn()])
        sim = Simulator(CFG, img.dram)
        with pytest.raises(TypeError, match=r"cycle_limit='1000': expected an int or None, "
                                            r"got str"):
            sim.run(addr, n, timing=self.timing, cycle_limit="1000")
        with pytest.raises(ValueError, match=r"cycle_limit=-1: expected a non-negative int"):
            sim.run(addr, n, timing=self.timing, cycle_limit=-1)
        sim.run(addr, n, timing=self.timing, cycle_limit=np.int64(1000))

    @pytest.mark.parametrize("seed", range(4))
    def test_the_timeout_stops_a_long_stream_of_legal_heavy_instructions(self, seed):
        """No limit: 200 legal instructions of 2^20 to 2^32 cycles each (minutes to simulate
        in all) stop at the wall-clock timeout, within :data:`PROMPT_S` of it."""
        rng = np.random.default_rng(300 + seed)
        prog = [random_loop(rng, gemm=bool(rng.integers(0, 2)), at_least=1 << 20,
                            at_most=LIMIT) for _ in range(200)] + [FinishInsn()]
        sim, addr, n = simulator(rng, prog)
        t0 = time.perf_counter()
        with pytest.raises(SimTimeout, match=r"wall-clock timeout: the run took more than "
                                             r"0\.3 s"):
            sim.run(addr, n, timing=self.timing, cycle_limit=None, timeout_s=0.3)
        assert time.perf_counter() - t0 < 0.3 + PROMPT_S


class TestFunctional(WorkLimit):
    timing = False


class TestTimed(WorkLimit):
    timing = True


class TestModelsAgree:
    """With the limit in the same unit, cycles, the functional model's count is a lower bound
    of the timed one (each unit runs its instructions one at a time, each for at least its
    closed-form cycles, and FINISH completes after all of them): what the functional model
    refuses, the timed one refuses too, and what the timed one runs, the functional one
    runs."""

    @pytest.mark.parametrize("seed", range(20))
    def test_the_functional_count_bounds_the_timed_one(self, seed):
        img = random_program(CFG, seed)
        prog = decode_program(img.dram[img.insn_addr:img.insn_addr + 16 * img.insn_count], CFG)
        bound = unit_min_cycles(CFG, prog)
        stats, _ = img.run(timing=True)
        for u, b in bound.items():
            assert b <= stats.units[u].busy_cycles, u
        lo, hi = max(bound.values()), stats.cycles
        assert lo <= hi
        for limit in sorted({lo - 1, lo, (lo + hi) // 2, hi - 1, hi}):
            verdict = {}
            for timing in (False, True):
                try:
                    img.run(timing=timing, cycle_limit=limit)
                    verdict[timing] = "runs"
                except SimCycleLimit:
                    verdict[timing] = "refused"
            assert verdict[False] == ("runs" if limit >= lo else "refused"), limit
            assert verdict[True] == ("runs" if limit >= hi else "refused"), limit
            assert verdict[False] == "runs" or verdict[True] == "refused", limit

    @pytest.mark.parametrize("seed", range(20))
    def test_heavy_streams_get_the_same_verdict_at_the_default_limit(self, seed):
        """Streams of light and heavy loops whose bound is far from the limit (below 2^31 or
        above 2^33): both models run them, or both refuse them, at the same instruction."""
        rng = np.random.default_rng(400 + seed)
        heavy = seed % 2 == 0
        prog = [random_loop(rng, gemm=bool(rng.integers(0, 2)), at_most=1 << 16)
                for _ in range(3)]
        prog += [random_loop(rng, gemm=bool(rng.integers(0, 2)), at_least=1 << 33)
                 if heavy else GemmInsn(reset=1, uop_end=8192, iter_out=16383, iter_in=8)]
        prog += [random_loop(rng, gemm=bool(rng.integers(0, 2)), at_most=1 << 16),
                 FinishInsn()]
        sim, addr, n = simulator(rng, prog)
        dram, state = sim.dram.copy(), sim.state.copy()
        outcome = {}
        for timing in (False, True):
            sim = Simulator(CFG, dram.copy())
            sim.state = state.copy()
            try:
                timed_run(sim, addr, n, timing, within_s=5.0)
                outcome[timing] = None
            except SimCycleLimit as err:
                outcome[timing] = err.index
        assert outcome[False] == outcome[True] == (3 if heavy else None)


class TestClosedForm:
    """The closed form over a whole stream equals the timing contract's per-instruction
    durations (GEMM, ALU: exactly; LOAD, STORE: the beats of every row, exactly when the rows
    share their offset in a bus word, else a lower bound), and costs nothing measurable."""

    @pytest.mark.parametrize("seed", range(10))
    def test_it_matches_the_timing_contract(self, seed):
        rng = np.random.default_rng(500 + seed)
        insns = []
        for _ in range(300):
            r = int(rng.integers(0, 3))
            if r < 2:
                insns.append(random_loop(rng, gemm=r == 0))
                continue
            mt = MemType(int(rng.choice([m for m in MemType if m != MemType.OUT])))
            opcode = Opcode.STORE if rng.integers(0, 4) == 0 else Opcode.LOAD
            pads = [int(rng.integers(0, 16)) * (opcode == Opcode.LOAD) for _ in range(4)]
            insns.append(MemInsn(
                opcode=opcode, memory_type=MemType.OUT if opcode == Opcode.STORE else mt,
                dram_base=int(rng.integers(0, 1 << 32)), y_size=int(rng.integers(0, 70)),
                x_size=int(rng.integers(0, 300)), x_stride=int(rng.integers(0, 1 << 16)),
                y_pad_0=pads[0], y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3]))
        insns.append(FinishInsn())
        fields = isa.decode_stream(isa.encode_stream(insns, CFG), CFG)
        got = stream_min_cycles(CFG, fields)
        for k, insn in enumerate(insns):
            d = vars(insn) | {"opcode": int(insn.opcode)}
            if insn.opcode in (Opcode.GEMM, Opcode.ALU):
                assert got[k] == loop_cycles(insn)
            elif insn.opcode == Opcode.FINISH or not insn.x_size:
                assert got[k] == 1
            else:
                eb = CFG.elem_bytes(insn.memory_type)
                starts = memory.row_starts(insn.dram_base, insn.y_size, insn.x_stride, eb)
                beats = memory.total_beats(starts, insn.x_size * eb, CFG.bus_bytes)
                exact = max(1, beats + (pad_elems(d) if insn.opcode == Opcode.LOAD else 0))
                aligned = insn.y_size <= 1 or (insn.x_stride * eb) % CFG.bus_bytes == 0
                assert got[k] == exact if aligned else 1 <= got[k] <= exact
            assert min_cycles(CFG, d) == got[k]

    def test_it_is_vectorised_over_the_stream(self):
        cfg, raw, _ = compiled_mix_stream(100_000, 8)
        fields = isa.decode_stream(raw, cfg)
        stream_min_cycles(cfg, fields)  # warm up
        t0 = time.perf_counter()
        cost = stream_min_cycles(cfg, fields)
        assert time.perf_counter() - t0 < 0.1  # about 5 ms: 50 ns an instruction
        assert cost.shape == (100_000,) and (cost >= 1).all()


def test_the_huge_loop_of_the_issue_is_refused_at_once_in_both_models():
    huge = AluInsn(uop_end=8192, iter_out=16383, iter_in=16383)
    img = Image(CFG, size=64 << 10)
    addr, n = img.put_insns([huge, FinishInsn()])
    for timing in (False, True):
        with pytest.raises(SimCycleLimit, match=refusal(timing, 0, huge)):
            timed_run(Simulator(CFG, img.dram.copy()), addr, n, timing)
    assert loop_cycles(huge) == 4397509656581


@pytest.mark.parametrize("limit", [1 << 60, 1 << 62, 1 << 70])
def test_limits_beyond_int64_sums_are_exact(limit):
    """Sums that pass 2^63 (closed forms of fields wider than the ISA's, 2^53 cycles each) are
    exact up to the first past the limit: int64 below 2^61, Python ints above."""
    from vtakit.vta_sim.functional import _limit_stops
    from vtakit.vta_sim.program import Program

    n = 2000
    fields = {f: np.zeros(n, np.int64) for f in isa.decode_stream(b"", CFG)}
    fields |= {"opcode": np.full(n, int(Opcode.GEMM)), "uop_end": np.full(n, 1 << 13),
               "iter_out": np.full(n, 1 << 20), "iter_in": np.full(n, 1 << 20)}
    prog = Program([{}] * n, ["compute"] * n, fields)  # type: ignore[arg-type]
    stops, sums = _limit_stops(CFG, prog, {"compute": list(range(n))}, limit)
    cyc = (1 << 53) + 6
    first = next((k for k in range(n) if (k + 1) * cyc > limit), n)
    assert stops["compute"] == first
    if first < n:
        assert int(sums["compute"][first]) > limit >= int(sums["compute"][first - 1])
