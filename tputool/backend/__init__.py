"""The bundled TorchTPU backend: PyTorch's PrivateUse1 device renamed `tpu`, tensors held as JAX arrays.

Importing this package registers the device (the torch.backends entry point imports it on
`import torch`), unless Google's torch_tpu is installed or TPUTOOL_BACKEND=0; a failure is one warning.
"""

from tputool.backend import _loader as _loader

_loader.load()
