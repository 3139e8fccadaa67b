"""Entry point for PyTorch's device-backend autoload (`torch.backends` group): registers the `tpu` device.

Runs inside `import torch`, so it never raises: a failure becomes one warning and torch still imports.
Where the real TorchTPU (`torch_tpu`) is installed, its own entry point owns the `tpu` device and this
loader steps aside. `TPUTOOL_BACKEND=0` turns the bundled backend off.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings


def real_torch_tpu_installed() -> bool:
    """True when Google's torch_tpu package is importable (it then provides the `tpu` device)."""
    return importlib.util.find_spec("torch_tpu") is not None


_loading = False


def load() -> None:
    """Register tputool's bundled `tpu` device unless torch_tpu is installed or TPUTOOL_BACKEND=0."""
    global _loading
    if _loading or os.environ.get("TPUTOOL_BACKEND", "1") == "0":
        return  # _loading: `import tputool.backend` imports torch, whose autoload calls back in here
    if real_torch_tpu_installed():
        import logging

        logging.getLogger("tputool.backend").info("tputool: using the real torch_tpu; the bundled backend stays off")
        return
    # Registering inside `import torch` (the autoload, or `import tputool.backend` before torch): the objects
    # alive are what the imports made, so they may leave the collector (device.register's freeze_gc).
    torch_mod = sys.modules.get("torch")
    in_torch_import = torch_mod is None or bool(getattr(getattr(torch_mod, "__spec__", None), "_initializing", False))
    _loading = True
    try:
        from tputool.backend import device

        device.register(freeze_gc=in_torch_import)
    except Exception as e:  # noqa: BLE001 - an autoload hook must not break `import torch`
        warnings.warn(f"tputool: the bundled tpu backend failed to load: {e}", RuntimeWarning, stacklevel=2)
    finally:
        _loading = False
