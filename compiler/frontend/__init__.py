"""Model importers: ONNX → graph IR."""

from .onnx import import_onnx

__all__ = ["import_onnx"]
