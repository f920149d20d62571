"""vtakit.boards: FPGA board descriptions and SoC tops around the accelerator core."""
