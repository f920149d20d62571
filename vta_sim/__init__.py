"""vtakit.vta_sim: the cycle-accurate Python model of the accelerator in vta_hw."""
