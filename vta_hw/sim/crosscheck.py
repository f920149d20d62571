"""``python -m vtakit.vta_hw.sim.crosscheck --count 1000``: the README's name for the sim-vs-RTL
cross-check command, kept working.

The cross-check (:class:`~vtakit.driver.devices.crosscheck.CrossCheckDevice`, the command and its
helpers) lives in :mod:`vtakit.driver.devices.crosscheck`: it needs both the simulator and the RTL
device, and only the driver sits above both. This file is only an entry point: importing it
imports nothing, so ``vta_hw`` does not depend on the driver.
"""

if __name__ == "__main__":
    import sys

    from vtakit.driver.devices.crosscheck import main

    sys.exit(main())
