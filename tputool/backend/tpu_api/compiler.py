"""`torch.tpu.compiler`: XLA compiler options for tputool's compiled computations.

`custom_compiler_options(options, **more)` sets XLA options (`xla_*` flags, as `jax.jit(compiler_options=)`
takes them) for computations compiled from then on: graphs of `torch.compile(backend="tpu")` (when Dynamo
first compiles them), `torch.tpu.pallas.jax_op` functions and `torch.tpu.optimizers` steps. Eager ops
(Strict/Debug/Fused) keep their shared cache and are not affected. Called plainly it stays set; used as a
context manager, the previous options come back at the end of the block. A value of None removes an option.
An unknown option name fails when XLA compiles ("No such compile option").
"""

from __future__ import annotations

from typing import Any

from tputool.backend import runtime

__all__ = ["custom_compiler_options"]


class custom_compiler_options:  # noqa: N801 - TorchTPU's name
    """Set XLA compiler options for computations compiled from now on (a context manager restores them)."""

    def __init__(self, options: dict[str, Any] | None = None, **more: Any) -> None:
        self._old = runtime.STATE.compiler_options
        new = {**self._old, **(options or {}), **more}
        runtime.STATE.compiler_options = {k: v for k, v in new.items() if v is not None}

    def __enter__(self) -> dict[str, Any]:
        return dict(runtime.STATE.compiler_options)

    def __exit__(self, *exc: object) -> None:
        runtime.STATE.compiler_options = self._old


def current_options() -> dict[str, Any]:
    """The XLA options in effect (a copy)."""
    return dict(runtime.STATE.compiler_options)
