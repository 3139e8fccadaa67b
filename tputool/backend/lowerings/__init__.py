"""The ATen-to-JAX lowering table, shared by eager dispatch and `torch.compile(backend="tpu")`.

A lowering is a pure function on JAX arrays: it takes the op's arguments in ATen schema order
(tensors as `jax.Array`, everything else as the Python values ATen passes: ints, floats, lists,
`torch.dtype`, None) and returns a `jax.Array` or a tuple of them, with no side effects, so it can be
traced by `jax.jit`. Views, in-place ops and `out=` are handled by the callers around the lowering,
never inside it. Random ops are registered with `needs_rng=True` and receive the key as the keyword
argument `rng_key` (a `jax.random` key), so the caller owns the RNG stream.

Lowerings live in the family modules of this package (one table each, kept as data); this module only
holds the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Lowering:
    """One entry of the table."""

    fn: Callable
    needs_rng: bool = False


LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}
"""OpOverload (e.g. torch.ops.aten.add.Tensor) -> Lowering."""


def lowering(*ops, needs_rng: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as the lowering of each OpOverload (or every overload of an OpOverloadPacket)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            overloads = [getattr(op, n) for n in op.overloads()] if isinstance(op, torch._ops.OpOverloadPacket) else [op]
            for ov in overloads:
                LOWERINGS[ov] = Lowering(fn, needs_rng)
        return fn

    return register


def get(op: torch._ops.OpOverload) -> Lowering | None:
    """The lowering registered for `op`, or None."""
    return LOWERINGS.get(op)
