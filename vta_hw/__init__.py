"""vtakit.vta_hw: the accelerator, its configuration and its instruction set.

``config`` and ``isa`` are pure Python and cheap to import; the Amaranth components live in
their own modules and are imported only by code that builds hardware.
"""
