"""The packages depend one way (docs ARCHITECTURE §1): ``driver -> vta_sim, vta_hw``;
``vta_sim`` reads only ``vta_hw``'s pure-Python modules (config, isa, timing facts), never its
Amaranth components, and never the driver; ``vta_hw`` imports neither."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
PURE_HW = {"vtakit.vta_hw", "vtakit.vta_hw.config", "vtakit.vta_hw.isa",
           "vtakit.vta_hw.timing_facts"}


def _loaded_after(code: str) -> list[str]:
    code += "\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return out.stdout.split()


def test_simulator_and_sim_device_import_no_amaranth():
    mods = _loaded_after("import vtakit.vta_sim, vtakit.vta_sim.timing, vtakit.vta_sim.testing, "
                         "vtakit.vta_sim.cli, vtakit.driver, vtakit.driver.devices.sim")
    assert not [m for m in mods if m == "amaranth" or m.startswith("amaranth.")]


def test_simulator_imports_no_driver_and_no_hardware_module():
    mods = _loaded_after("import vtakit.vta_sim, vtakit.vta_sim.timing, vtakit.vta_sim.testing, "
                         "vtakit.vta_sim.functional")
    assert not [m for m in mods if m.startswith("vtakit.driver")]
    assert {m for m in mods if m.startswith("vtakit.vta_hw")} <= PURE_HW


def _imports(pkg: str):
    """(file, imported module) of every import in ``pkg`` outside ``if __name__ == "__main__"``
    blocks (relative imports resolved)."""
    for path in sorted((ROOT / pkg).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        here = ["vtakit", *path.relative_to(ROOT).with_suffix("").parts]
        main_blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If)
                       and "__name__" in ast.unparse(n.test) and "__main__" in ast.unparse(n.test)]
        skip = {id(x) for b in main_blocks for x in ast.walk(b)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield path, a.name
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                yield path, mod
                for a in node.names:  # from vtakit.vta_hw import isa
                    yield path, f"{mod}.{a.name}"


def test_source_imports_point_one_way():
    bad = []
    for path, mod in _imports("vta_sim"):
        if mod.startswith("vtakit.driver") or mod.startswith("amaranth") or (
                mod.startswith("vtakit.vta_hw.") and mod not in PURE_HW
                and not any(mod.startswith(p + ".") for p in PURE_HW - {"vtakit.vta_hw"})):
            bad.append(f"{path.relative_to(ROOT)}: {mod}")
    for path, mod in _imports("vta_hw"):
        if mod.startswith(("vtakit.driver", "vtakit.vta_sim", "vtakit.runtime",
                           "vtakit.compiler", "vtakit.boards")):
            bad.append(f"{path.relative_to(ROOT)}: {mod}")
    for name in ("config.py", "isa.py", "timing_facts.py"):
        for path, mod in _imports("vta_hw"):
            if path.name == name and path.parent.name == "vta_hw" and mod.startswith("amaranth"):
                bad.append(f"{path.relative_to(ROOT)}: {mod}")
    assert not bad, "imports against the package direction:\n" + "\n".join(bad)
