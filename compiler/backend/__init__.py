"""Code generators: IR to executable kernels, one subpackage per target."""
