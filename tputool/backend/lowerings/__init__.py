"""The ATen-to-JAX lowering table, the one table of every executor (read through `tputool.backend.op_plan`).

A lowering is a pure function on JAX arrays: it takes the op's arguments in ATen schema order
(tensors as `jax.Array`, everything else as the Python values ATen passes: ints, floats, lists,
`torch.dtype`, None) and returns a `jax.Array` or a tuple of them, with no side effects, so it can be
traced by `jax.jit`. Views, in-place ops and `out=` are handled by the callers around the lowering,
never inside it. Random ops are registered with `needs_rng=True` and receive the key as the keyword
argument `rng_key` (a `jax.random` key), so the caller owns the RNG stream. Scalar (`number`) arguments
may arrive as Python numbers or as weakly-typed 0-d traced values, unless the lowering is registered
with `static_scalars=True`. A lowering registered with `dynamic_floats=True` also takes its `float` (not
Scalar) arguments as traced values, so a changing value (an optimizer's learning rate) compiles nothing new.

Lowerings live in the family modules of this package (one table each, kept as data); this module only
holds the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


class Unsupported(NotImplementedError):
    """Raised by a lowering (at trace time) for arguments it cannot lower, e.g. a data-dependent output
    shape; eager dispatch then runs that call through the CPU fallback instead."""


@dataclass(frozen=True)
class Lowering:
    """One entry of the table."""

    fn: Callable
    needs_rng: bool = False
    static_scalars: bool = False
    """True when the lowering needs its Scalar arguments as concrete Python numbers (e.g. arange's
    bounds decide the output shape); eager dispatch then compiles one kernel per distinct value."""
    traced_only: bool = False
    """True for lowerings only the functional executors (Fused recording, compiled graphs, tune) may use: view
    ops as values and copies, which eager mode runs as storage kernels (a tpu view shares its storage)."""
    dynamic_floats: bool = False
    """True when the op's `float` arguments (e.g. a fused optimizer's lr) are traced values like its Scalars
    rather than static ones, so that a new value reuses the compiled kernel."""
    checked: bool = False
    """True when the lowering checks its indices on the device (`checks.require_in_range`): executors trace it
    inside `checks.collecting()` and carry its check record to the next sync point (`tputool.backend.asserts`)."""

    @property
    def may_refuse(self) -> bool:
        """True when the lowering's module raises `Unsupported` for some arguments: only tracing it tells whether
        it takes these (Fused recording then evaluates it abstractly rather than trusting PyTorch's meta kernel)."""
        found = getattr(self.fn, "__globals__", None)
        return found is None or found.get("Unsupported") is Unsupported


LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}
"""OpOverload (e.g. torch.ops.aten.add.Tensor) -> Lowering."""

_listeners: list[Callable[[], None]] = []


def on_change(fn: Callable[[], None]) -> None:
    """Call `fn()` after every registration (for caches derived from the table)."""
    _listeners.append(fn)


def lowering(*ops, needs_rng: bool = False, static_scalars: bool = False, traced_only: bool = False,
             dynamic_floats: bool = False, checked: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as the lowering of each OpOverload (or every overload of an OpOverloadPacket)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            overloads = [getattr(op, n) for n in op.overloads()] if isinstance(op, torch._ops.OpOverloadPacket) else [op]
            for ov in overloads:
                LOWERINGS[ov] = Lowering(fn, needs_rng, static_scalars, traced_only, dynamic_floats, checked)
        for listener in _listeners:
            listener()
        return fn

    return register


def get(op: torch._ops.OpOverload) -> Lowering | None:
    """The lowering registered for `op`, or None."""
    return LOWERINGS.get(op)


def _load_families() -> None:
    from tputool.backend.lowerings import (  # noqa: F401 - registering is the import's effect
        creation,
        elementwise,
        fft,
        functional_views,
        indexing,
        linalg,
        nn,
        optim,
        random,
        reduction,
    )

    if torch.distributed.is_available():
        from tputool.backend.lowerings import collectives  # noqa: F401


_load_families()
