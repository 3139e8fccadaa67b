"""The submodules of `torch.tpu` that the real TorchTPU has: pallas, ops, distributed, optimizers, compiler,
profiler (names from torch-tpu 0.2.0's public-API table).

`install()` (called by `tputool.backend.device.register` once `torch.tpu` exists) makes each one an attribute
of `torch.tpu` and a module `torch.tpu.<name>` in `sys.modules`, so `torch.tpu.ops.ragged_dot`,
`from torch.tpu import ops` and `import torch.tpu.pallas` all work. The submodules import nothing heavy at
module level (Pallas kernels load on first use), so installing them costs little at `import torch`.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

SUBMODULES = ("compiler", "distributed", "ops", "optimizers", "pallas", "profiler")
"""torch.tpu's submodules, as in TorchTPU."""


def install(tpu_module: ModuleType, name: str = "torch.tpu") -> None:
    """Expose every submodule as `tpu_module.<sub>` and as the module `<name>.<sub>`."""
    for sub in SUBMODULES:
        mod = importlib.import_module(f"{__name__}.{sub}")
        setattr(tpu_module, sub, mod)
        sys.modules[f"{name}.{sub}"] = mod
