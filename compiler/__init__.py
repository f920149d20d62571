"""vtakit.compiler: ONNX import, graph optimisation, quantisation and code generation.

    from vtakit.compiler import compile_model, lower_model
"""

from __future__ import annotations

from typing import Any

__all__ = ["compile_model", "lower_model"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `import vtakit.compiler.ir` and friends stay light.
    if name in __all__:
        from . import compile as _compile

        return getattr(_compile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
