"""tputool: port CUDA PyTorch code to TPUs and run it on PyTorch's `tpu` device."""

__version__ = "0.1.0"
