"""vtakit.driver: the JIT runtime driver that builds instruction streams and runs them on a device.

``Session(device)`` is the VTA-style API (``load_2d``, ``store_2d``, ``gemm``, ``alu``,
``dep_push``, ``dep_pop``, ``synchronize``); devices implement :class:`Device` and report
faults as :class:`DeviceError`. :class:`VirtualThreads` emits the dependency tokens of
double-buffered kernels; :func:`run_image` replays a run at fixed addresses (docs/timing.md).
"""

from vtakit.driver.device import Device, DeviceInfo, RunResult
from vtakit.driver.devices.sim import SimDevice
from vtakit.driver.errors import CycleLimitError, DeadlockError, DeviceError
from vtakit.driver.program import KernelBuilder, Loop, Program, Reloc, UopKernel
from vtakit.driver.session import DeviceArray, ImageRun, Session, Stage, run_image, stage_of
from vtakit.driver.threads import VirtualThreads

__all__ = [
    "Device", "DeviceInfo", "RunResult", "SimDevice", "KernelBuilder", "Loop", "Program",
    "Reloc", "UopKernel", "DeviceArray", "Session", "Stage", "stage_of", "DeviceError",
    "DeadlockError", "CycleLimitError", "ImageRun", "run_image", "VirtualThreads",
]
