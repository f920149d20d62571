"""The distribution maps each top-level folder to one `vtakit` subpackage."""

import importlib
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

ROOT = Path(__file__).parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TOP = ["compiler", "vta_hw", "vta_sim", "driver", "runtime", "boards"]


def test_every_package_folder_is_listed():
    setup = PYPROJECT["tool"]["setuptools"]
    assert setup["package-dir"] == {"vtakit": "vtakit", **{f"vtakit.{t}": t for t in TOP}}
    found = {"vtakit"}
    for top in TOP:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            found.add("vtakit." + ".".join(rel.parts))
    assert found == set(setup["packages"])


def test_no_bare_top_level_packages():
    for top in TOP:
        module = importlib.import_module(f"vtakit.{top}")
        assert Path(module.__file__).parent == ROOT / top
        assert top not in sys.modules  # nothing imported as a bare `compiler`, `runtime`, ...


def test_isa_and_config_do_not_import_amaranth():
    code = ("import sys, vtakit.vta_hw.isa, vtakit.vta_hw.config; "
            "assert 'amaranth' not in sys.modules")
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)
