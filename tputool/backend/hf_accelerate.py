"""Hugging Face Accelerate before 1.16 on a machine with the tpu device: refused, saying why.

Accelerate learned the generic `torch.accelerator` devices (tpu among them) in 1.16. Older versions choose CUDA
or the CPU: `Accelerator()` would place the model on the CPU while the program believes it uses the device, and
`mixed_precision="bf16"` would autocast the CPU, so tpu tensors stay float32 (mixed precision silently off).
Those versions raise at `Accelerator()` instead, unless the program asks for the CPU (`cpu=True`).
"""

from __future__ import annotations

_MODULE = "accelerate.state"
MIN_VERSION = (1, 16)
"""The first Accelerate that places on the tpu device and autocasts it."""


def install() -> None:
    """Check Accelerate's version when `accelerate.state` loads (now if it already has)."""
    from tputool.backend.hf_generate import after_import

    after_import(_MODULE, _patch)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _patch(mod) -> None:
    import accelerate

    cls = getattr(mod, "PartialState", None)
    prop = getattr(cls, "default_device", None)
    if _version(accelerate.__version__) >= MIN_VERSION or not isinstance(prop, property) or \
            getattr(prop.fget, "_tputool", False):
        return
    original = prop.fget

    def default_device(self):
        device = original(self)
        if device.type == "cpu":
            raise RuntimeError(
                f"accelerate {accelerate.__version__} does not know the tpu device: Accelerator() would run on the "
                "CPU and its mixed precision would not autocast tpu tensors. Install accelerate>=1.16 "
                "(pip install -U 'accelerate>=1.16'), or pass Accelerator(cpu=True) to run on the CPU.")
        return device

    default_device._tputool = True
    cls.default_device = property(default_device, doc=prop.__doc__)
