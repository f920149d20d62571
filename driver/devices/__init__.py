"""Devices behind the :class:`~vtakit.driver.device.Device` interface: ``sim`` now; the RTL
(Verilator) and board devices come with the hardware."""

from vtakit.driver.devices.sim import SimDevice

__all__ = ["SimDevice"]
