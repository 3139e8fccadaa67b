"""CUDA-to-TPU codemods: rules, the Python rewriters, the non-Python scanners and the port/check engine."""
