"""Devices behind the :class:`~vtakit.driver.device.Device` interface: ``sim`` (the Python
simulator), ``rtl`` (the core's Verilog under Verilator) and ``crosscheck`` (both, compared run
by run); board devices come with the boards."""

from vtakit.driver.devices.crosscheck import CrossCheckDevice
from vtakit.driver.devices.rtl import RtlDevice
from vtakit.driver.devices.sim import SimDevice

__all__ = ["SimDevice", "RtlDevice", "CrossCheckDevice"]
