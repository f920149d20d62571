"""The RTL against the simulator: random legal programs and VTA's instruction tests must give
the same DRAM contents and the same total cycle count on both (docs/timing.md). The instruction
tests run through ``tests/conformance/test_vta_insn.py``'s ``rtl`` parametrisation, whose device
(:class:`~vtakit.driver.devices.crosscheck.CrossCheckDevice`) compares every run with ``sim``.

More programs: ``python -m vtakit.driver.devices.crosscheck --count 1000 --config default``.
"""

from __future__ import annotations

import numpy as np
import pytest
from rtl_helpers import require_rtl

from vtakit.driver.devices.crosscheck import Mismatch, check_images, compare_run
from vtakit.vta_hw import disasm, isa
from vtakit.vta_hw.config import preset
from vtakit.vta_sim.testing import IMAGE_BYTES, random_program

PROGRAMS = {"ice40": 60, "default": 25}


@pytest.fixture(scope="module", params=list(PROGRAMS))
def rtl(request):
    require_rtl()
    from vtakit.driver.devices.rtl import RtlDevice

    dev = RtlDevice(preset(request.param), dram_bytes=IMAGE_BYTES)
    yield request.param, dev
    dev.close()


@pytest.mark.rtl
def test_random_programs_give_the_same_dram_and_cycles(rtl):
    name, dev = rtl
    images = [random_program(preset(name), 1000 + seed) for seed in range(PROGRAMS[name])]
    failures = check_images(images, dev)
    assert not failures, f"{len(failures)} of {len(images)} programs differ; the first:\n" \
                         f"{failures[0]}"


def test_a_mismatch_names_the_store_and_prints_the_program():
    cfg = preset("ice40")
    img = random_program(cfg, 7)
    stats, sim = img.run()
    other = sim.dram.copy()
    written = np.flatnonzero(sim.dram != img.dram)
    other[written[0]] ^= 0xFF
    stream = img.dram[img.insn_addr:img.insn_addr + 16 * img.insn_count]
    with pytest.raises(Mismatch) as e:
        compare_run(cfg, stream, sim.dram, other, stats.cycles, stats.cycles + 3, "prog 7")
    text = str(e.value)
    assert f"cycles: sim {stats.cycles}, rtl {stats.cycles + 3}" in text
    assert f"DRAM: 1 bytes differ, the first at {int(written[0]):#x}" in text
    assert "written by STORE #" in text
    assert text.count("\n") > img.insn_count  # the disassembly, one line per instruction
    assert "FINISH" in text


@pytest.mark.parametrize("name", ["ice40", "default", "ecp5"])
def test_random_programs_are_legal_and_deterministic(name):
    """The generator's contract, checked on vta_sim alone: no device error, timed and
    functional models agree, same seed gives the same program."""
    from vtakit.vta_sim import Simulator

    cfg = preset(name)
    kinds: set[str] = set()
    for seed in range(30):
        img = random_program(cfg, seed)
        assert np.array_equal(img.dram, random_program(cfg, seed).dram)
        timed, untimed = img.dram.copy(), img.dram.copy()
        stats = Simulator(cfg, timed).run(img.insn_addr, img.insn_count)
        Simulator(cfg, untimed).run(img.insn_addr, img.insn_count, timing=False)
        assert stats.cycles > 0
        np.testing.assert_array_equal(timed, untimed)
        stream = img.dram[img.insn_addr:img.insn_addr + 16 * img.insn_count]
        kinds |= {disasm.kind_name(isa.decode(bytes(stream[k:k + 16]), cfg))
                  for k in range(0, stream.size, 16)}
    # what the cross-check exercises: every ALU op, every memory type, GEMM, FINISH
    assert {"GEMM", "FINISH", "LOAD.INP", "LOAD.WGT", "LOAD.ACC", "LOAD.ACC_8BIT", "LOAD.UOP",
            "STORE.OUT", "ALU.MIN", "ALU.MAX", "ALU.ADD", "ALU.SHR", "ALU.MUL"} <= kinds


def test_a_device_that_runs_away_is_a_mismatch_not_a_timeout(monkeypatch):
    """check_images limits a device's cycles to runaway_bound(the simulator's count): a run
    past it is reported as a mismatch with the program, and the device's own limit is put
    back. (The simulator device stands in for a core that runs away: the bound is shrunk.)"""
    from vtakit.driver.devices import crosscheck
    from vtakit.driver.devices.sim import SimDevice

    cfg = preset("ice40")
    dev = SimDevice(cfg, dram_bytes=IMAGE_BYTES, cycle_limit=None)
    images = [random_program(cfg, seed) for seed in (3, 4)]
    assert check_images(images, dev) == []  # within twice the count: no mismatch
    assert dev.cycle_limit is None
    stats, _ = images[0].run()
    assert crosscheck.runaway_bound(stats.cycles) == 2 * stats.cycles + 1000
    monkeypatch.setattr(crosscheck, "runaway_bound", lambda sim_cycles: sim_cycles // 2)
    failures = check_images(images, dev, stop_on_first=True)
    assert len(failures) == 1
    assert (f"sim finished in {stats.cycles} cycles, rtl did not finish within "
            f"{stats.cycles // 2}") in failures[0]
    assert "FINISH" in failures[0]  # the program's listing
    assert dev.cycle_limit is None


@pytest.mark.rtl
def test_the_crosscheck_device_reports_a_core_that_runs_away(rtl, monkeypatch):
    """The conformance suites' device bounds the RTL's run by runaway_bound(the simulator's
    count) too: past it, a Mismatch naming the RTL's CycleLimitError and the program (here a
    bound shrunk below the count stands in for a core that runs away); the RTL device's own
    limit is put back."""
    from vtakit.driver.devices import crosscheck
    from vtakit.driver.session import run_image

    name, dev = rtl
    own = dev.cycle_limit
    monkeypatch.setattr(crosscheck, "runaway_bound", lambda sim_cycles: sim_cycles // 2)
    both = crosscheck.CrossCheckDevice(preset(name), dram_bytes=IMAGE_BYTES, rtl=dev)
    img = random_program(preset(name), 5)
    with pytest.raises(Mismatch, match="rtl raised CycleLimitError") as e:
        run_image(both, img)
    assert "FINISH" in str(e.value)
    assert dev.cycle_limit == own
    monkeypatch.undo()
    assert run_image(both, img).result.cycles == img.run()[0].cycles  # and it runs on
