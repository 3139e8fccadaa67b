"""On a CPU-hosted backend, show the matmul precision a TPU would use.

XLA on CPU ignores matmul precision, so a script that asks for `torch.set_float32_matmul_precision("medium")`
(one bfloat16 pass on a TPU's MXU) would compute float32 exactly here and parity could not show the
departure the TPU will have. In the tpu child, `install()` wraps `torch.set_float32_matmul_precision`: while
it is "medium" and JAX runs on a CPU, `Bf16Matmul` rounds the float32 tpu operands of matmuls and
convolutions to bfloat16 (accumulation stays float32), as the MXU does. On a TPU nothing is emulated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

aten = torch.ops.aten
MATMULS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                     aten.mv.default, aten.addmv.default, aten.dot.default, aten.convolution.default})


def _round(x):
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.device.type == "tpu":
        return x.to(torch.bfloat16).to(torch.float32)
    return x


class Bf16Matmul(TorchDispatchMode):
    """Rounds float32 tpu operands of matmuls/convolutions to bfloat16 (one MXU pass)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            args = tree_map(_round, args)
        return func(*args, **(kwargs or {}))


def _on_cpu_host() -> bool:
    try:
        import jax

        return jax.default_backend() != "tpu"
    except Exception:  # noqa: BLE001 - no JAX: not the bundled backend, nothing to emulate
        return False


def install() -> Callable[[], None]:
    """Emulate "medium" float32 matmul precision on a CPU-hosted backend (see the module doc); returns undo."""
    orig = torch.set_float32_matmul_precision
    mode: list[Bf16Matmul] = []
    emulate = _on_cpu_host()

    def set_precision(precision: str) -> None:
        orig(precision)
        if not emulate:
            return
        if precision == "medium" and not mode:
            mode.append(Bf16Matmul())
            mode[0].__enter__()
        elif precision != "medium" and mode:
            mode.pop().__exit__(None, None, None)

    torch.set_float32_matmul_precision = set_precision

    def undo() -> None:
        torch.set_float32_matmul_precision = orig
        if mode:
            try:
                mode.pop().__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - not at the top of the mode stack any more
                pass

    return undo
