"""The bundled TorchTPU backend: PyTorch's PrivateUse1 device renamed `tpu`, tensors held as JAX arrays."""
