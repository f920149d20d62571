"""vtakit.compiler: ONNX import, graph optimisation, quantisation and code generation."""
