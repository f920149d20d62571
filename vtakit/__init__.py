"""vtakit: an open hardware-software co-design kit for VTA-style deep-learning accelerators.

The distribution maps each top-level folder of the repository to one subpackage:
``vtakit.compiler``, ``vtakit.vta_hw``, ``vtakit.vta_sim``, ``vtakit.driver``,
``vtakit.runtime`` and ``vtakit.boards``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vtakit")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
