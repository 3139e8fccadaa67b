"""The per-op compile cache shared by every eager mode.

One `jax.jit` function per op signature key (op, structure of the arguments, static argument values);
`jax.jit` itself then keeps one XLA executable per input shapes/dtypes. `call` runs a cached function and
records a "compile" event whenever that added an executable (and lets `executables.settle` bound the memory
maps the process's executables take). Fused mode (tputool.backend.fused) stores its fused computations here
too, under keys of its own, so all modes share one cache.

API: `get(key)`, `put(key, fn)`, `jitted(key, make, static_argnums=())`, `call(fn, name, *args)`,
`record_compile(name)`, `stats()`, `clear()`. Eager dispatch also keeps each op's functions in a
per-op dict (a faster lookup); `clear()` empties the shared table, not those.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import jax

from tputool.backend import events, executables

_kernels: dict[Hashable, Callable] = {}


def get(key: Hashable) -> Callable | None:
    """The cached jitted function for `key`, or None."""
    return _kernels.get(key)


def put(key: Hashable, fn: Callable) -> Callable:
    """Cache the jitted function `fn` under `key` and return it."""
    _kernels[key] = fn
    return fn


def jitted(key: Hashable, make: Callable[[], Callable], static_argnums: tuple[int, ...] = ()) -> Callable:
    """The cached `jax.jit(make())` for `key`, built on first use."""
    fn = _kernels.get(key)
    if fn is None:
        fn = _kernels[key] = jax.jit(make(), static_argnums=static_argnums)
    return fn


def call(fn: Callable, name: str, *args):
    """`fn(*args)`, counted as a launch, recording a "compile" event (detail `name`) if it compiled a new
    executable."""
    n = fn._cache_size()
    out = fn(*args)
    if fn._cache_size() != n:
        events.record("compile", name)
        executables.settle()
    events.launches += 1
    return out


def record_compile(name: str) -> None:
    """Record that a cached function compiled a new executable (for callers that inline `call`); a safe point
    to drop the process's executables when they fill too many memory maps (`executables.settle`)."""
    events.record("compile", name)
    executables.settle()


def stats() -> dict[str, int]:
    """Number of cached functions and of compiled executables behind them."""
    return {"functions": len(_kernels), "executables": sum(f._cache_size() for f in _kernels.values()
                                                          if hasattr(f, "_cache_size"))}


def clear() -> None:
    """Drop every cached function (their executables go with them)."""
    _kernels.clear()
