"""The project's own gates: ruff (style, imports, bugbear) and mypy on the typed packages."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _tool(name):
    exe = Path(sys.executable).parent / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"needs {name}: pip install -e '.[dev]'")
    return found


def test_ruff_is_clean():
    result = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean():
    # STYLE.md: check_untyped_defs on compiler, vta_sim, driver and runtime (config in
    # pyproject.toml), plus the pure-Python contracts of vta_hw.
    targets = ["compiler", "vta_sim", "driver", "runtime", "vta_hw/config.py", "vta_hw/isa.py",
               "vtakit"]
    result = subprocess.run([_tool("mypy"), *targets], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
