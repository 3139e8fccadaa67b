"""tpu tensors <-> JAX arrays for the torch.tpu submodules: no copies; Fused-mode values are made concrete."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import jax
import torch

from tputool.backend import runtime
from tputool.backend import tensor as tt

_FUSED = runtime.EagerMode.DEFER_AND_FUSE


def require_tpu(tensors: Iterable[torch.Tensor], what: str) -> None:
    """Raise ValueError unless every item is a tpu tensor with data (not a CPU, meta or fake tensor)."""
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "tpu" or not tt.has_data(t):
            desc = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{what} takes tpu tensors, got {desc} (move it with .to('tpu'))")


def arrays(tensors: Sequence[torch.Tensor], reason: str) -> list[jax.Array]:
    """The JAX values of tpu tensors (their buffers themselves where the tensor covers its whole storage).

    In the Fused eager mode, pending values are computed first (a flush with detail `reason`)."""
    if runtime.STATE.mode is _FUSED:
        from tputool.backend import fused

        for t in tensors:
            fused.materialize(t, reason)
    return [tt.to_jax(t) for t in tensors]


def settle(reason: str) -> None:
    """In the Fused eager mode, run the deferred ops now (before buffers they may read are donated)."""
    if runtime.STATE.mode is _FUSED:
        from tputool.backend import fused

        fused.flush(reason)


def tensor(a: jax.Array) -> torch.Tensor:
    """A tpu tensor holding `a` (tracked for synchronize; waited for at once in the Debug eager mode)."""
    tt.track(a)
    if runtime.STATE.blocking:
        a.block_until_ready()
    return tt.from_jax(a)


def store(t: torch.Tensor, a: jax.Array) -> None:
    """Make `a` the value of tpu tensor `t` (through its view), as an in-place op would."""
    tt.track(a)
    if runtime.STATE.blocking:
        a.block_until_ready()
    tt.write(t, a)
