"""A bound on the memory maps that loaded XLA executables take in one process on XLA:CPU.

XLA:CPU maps the code of each executable it loads into the process (a few maps for a small program, hundreds
for a large one: a kernel per fusion), and Linux refuses a process more than `vm.max_map_count` maps (65530 by
default): the next executable then cannot be mapped and the process dies with a segmentation fault inside XLA,
with no Python error (`make test` did, at 40%). The backend keeps a jitted function per op signature and JAX an
executable per input shapes under each, so a long eager run with many shapes or steps gets there.

So the process's maps are counted (/proc/self/maps) after compiles, no more often than the room left allows
(`MAPS_PER_EXECUTABLE` per executable built or loaded since: JAX's backend-compile event, which a persistent
cache hit fires too, and `count` for other loads), and past half of `vm.max_map_count` `settle()` drops every
executable: `jax.clear_caches()`, and what the backend holds itself (the `holders`, e.g. Fused mode's kept
executables). `settle` is called at safe points only (after a compile, outside any JAX trace); what was dropped
is built again when used again, from the persistent cache when it is on. On other platforms nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

MAPS_PER_EXECUTABLE = 1000
"""The most maps one executable is assumed to add between two counts (a large fused step's kernels)."""

DEFAULT_MAX_MAP_COUNT = 65530
"""Linux's default `vm.max_map_count`, used when /proc/sys/vm/max_map_count cannot be read."""

holders: list[Callable[[], None]] = []
"""Callables that drop the executables a module of the backend holds outside JAX's caches (run by `purge`)."""

purges = 0
"""How many times this process dropped its executables."""

_built = 0
_next_check = 0
_limit: int | None = None
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def limit() -> int:
    """Maps past which `settle` drops the executables: half of vm.max_map_count on XLA:CPU, else 0 (never)."""
    global _limit
    if _limit is None:
        try:
            with open("/proc/sys/vm/max_map_count") as f:
                most = int(f.read())
        except (OSError, ValueError):
            most = DEFAULT_MAX_MAP_COUNT
        _limit = most // 2 if jax.default_backend() == "cpu" and maps() else 0
    return _limit


def maps() -> int:
    """The memory maps of this process now (0 where /proc/self/maps cannot be read)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def built() -> int:
    """Executables built or loaded by this process so far."""
    return _built


def count(n: int = 1) -> None:
    """Count `n` executables loaded without JAX's compile event (e.g. deserialized from a disk cache)."""
    global _built
    _built += n


def _on_duration(event: str, duration: float, **_: object) -> None:
    global _built
    if event == _COMPILE_EVENT:
        _built += 1


def settle() -> None:
    """After a compile (never inside a JAX trace): count the maps when enough executables came since the last
    count, and drop every executable past `limit()`."""
    if _built >= _next_check:
        check()


def check(share: float = 1.0) -> bool:
    """Count the maps now and drop every executable past `share` of `limit()`; True if it dropped them."""
    global _next_check
    most = limit()
    if not most:
        _next_check = float("inf")
        return False
    n = maps()
    dropped = n > most * share
    if dropped:
        purge()
        n = maps()
    # room for (most - n) maps: count again before that many executables could have filled it (unless dropping
    # them left no room: the maps are something else's, and counting after each compile would not help)
    room = most - n
    _next_check = _built + (1024 if dropped and room <= 0 else max(1, room // MAPS_PER_EXECUTABLE))
    return dropped


def purge() -> None:
    """Drop the executables of JAX's caches and of the `holders`; they are built again on their next use."""
    global purges
    for drop in holders:
        drop()
    jax.clear_caches()
    purges += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
