"""Errors raised by the compiler for bad input (at the ONNX boundary and in the verifier)."""

from __future__ import annotations


class UnsupportedError(ValueError):
    """A model uses an operator, attribute value, dtype or domain the compiler does not support.

    The message names the node (its name, or its index when it has none), the operator and what
    is supported instead.
    """


class InvalidModelError(ValueError):
    """The input is not a valid ONNX model: malformed, truncated, fails the checker, or holds
    contradictory data (a negative dimension, an initializer whose data does not fill its dims,
    a declared shape or type that contradicts what the model computes). The message names the
    tensor or node, what it holds and what was expected."""


class VerifyError(ValueError):
    """A graph breaks an IR invariant; the message names the offending node."""


class NonConstantError(UnsupportedError):
    """An operand that decides an output shape (Reshape's shape, Slice's starts...) is not a
    constant at import time. `tensor` is the ONNX name of that operand; `inputs` names the
    graph inputs its value depends on."""

    def __init__(self, message: str, tensor: str, inputs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.inputs = inputs


class TensorTooLargeError(UnsupportedError):
    """A tensor of the model (a graph input, an initializer, a node's output) would take more
    than the importer's per-tensor limit (`frontend.onnx.MAX_TENSOR_BYTES`); raised from the
    shapes at import, before anything that large is allocated. `size_bytes` is its size."""

    def __init__(self, message: str, size_bytes: int) -> None:
        super().__init__(message)
        self.size_bytes = size_bytes
