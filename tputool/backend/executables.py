"""A bound on the XLA executables one process keeps loaded on XLA:CPU.

XLA:CPU maps each executable it loads into the process (about five memory maps each), and Linux refuses a
process more than `vm.max_map_count` maps (65530 by default): past roughly 12,000 live executables the next one
cannot be mapped and the process dies with a segmentation fault inside XLA, with no Python error (our own test
session did, at 40% of the suite). The backend keeps a jitted function per op signature and JAX keeps an
executable per input shapes under each, so any long eager run with many shapes gets there.

So every executable the process builds or loads is counted (JAX's backend-compile event, which a persistent
cache hit fires too; `count` for executables loaded by other means), and once the count passes `budget()`,
`settle()` drops them all: `jax.clear_caches()`, and what the backend holds itself (the `holders`, e.g. Fused
mode's kept executables). `settle` is called at safe points only (after a compile, outside any JAX trace); what
was dropped is built again when used again, from the persistent cache when it is on. On other platforms than
CPU nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

MAPS_PER_EXECUTABLE = 16
"""Memory maps reserved per counted executable (about 5 measured on XLA:CPU for small programs; the rest is
headroom for large programs and for the maps of everything else in the process)."""

DEFAULT_MAX_MAP_COUNT = 65530
"""Linux's default `vm.max_map_count`, used when /proc/sys/vm/max_map_count cannot be read."""

holders: list[Callable[[], None]] = []
"""Callables that drop the executables a module of the backend holds outside JAX's caches (run by `purge`)."""

purges = 0
"""How many times this process dropped its executables."""

_live = 0
_budget: int | None = None
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def budget() -> int:
    """How many executables may be counted before `settle` drops them (computed once; 0: never on this platform)."""
    global _budget
    if _budget is None:
        try:
            with open("/proc/sys/vm/max_map_count") as f:
                maps = int(f.read())
        except (OSError, ValueError):
            maps = DEFAULT_MAX_MAP_COUNT
        _budget = maps // MAPS_PER_EXECUTABLE if jax.default_backend() == "cpu" else 0
    return _budget


def live() -> int:
    """Executables counted since the process started or since the last purge."""
    return _live


def count(n: int = 1) -> None:
    """Count `n` executables loaded without JAX's compile event (e.g. deserialized from a disk cache)."""
    global _live
    _live += n


def _on_duration(event: str, duration: float, **_: object) -> None:
    global _live
    if event == _COMPILE_EVENT:
        _live += 1


def settle() -> None:
    """Drop every executable when the count has passed the budget (call only outside JAX traces)."""
    b = _budget if _budget is not None else budget()
    if 0 < b < _live:
        purge()


def purge() -> None:
    """Drop the executables of JAX's caches and of the `holders`; they are built again on their next use."""
    global _live, purges
    for drop in holders:
        drop()
    jax.clear_caches()
    _live = 0
    purges += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
