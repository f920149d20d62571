"""vtakit.runtime: loads compiled artifacts and executes graphs on CPU and accelerator."""
