"""The CPU runner: loads a plan's CPU code (the artifact's object code, its IR compiled here when
the object does not fit this CPU, or kernels lowered in this process) and runs the CPU steps
through one compiled whole-segment function on every thread (`graphfn`, `parallel`)."""

from .runner import CpuRunner

__all__ = ["CpuRunner"]
