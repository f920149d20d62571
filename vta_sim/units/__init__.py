"""When things happen (docs/timing.md): the event kernel and its queues, the memory port, the
fetch unit, and the load/compute/store units. :mod:`vtakit.vta_sim.timing` wires them up."""
