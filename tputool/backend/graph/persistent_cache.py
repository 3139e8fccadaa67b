"""JAX's persistent compilation cache in a per-user directory, so a second run of a script does not recompile.

Directory: `$TPUTOOL_CACHE_DIR/xla` if set, else `~/.cache/tputool/xla`. Every computation is cached,
whatever its compile time or size. Cache hits and misses are counted from JAX's monitoring events
(`/jax/compilation_cache/cache_hits`, `.../cache_misses`) into `stats`.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

stats: Counter[str] = Counter()
"""'hits' / 'misses' of the persistent cache in this process."""

_enabled_dir: Path | None = None

_EVENTS = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}


def cache_dir() -> Path:
    """Where compiled XLA executables are kept: $TPUTOOL_CACHE_DIR/xla or ~/.cache/tputool/xla."""
    root = os.environ.get("TPUTOOL_CACHE_DIR")
    return Path(root) / "xla" if root else Path.home() / ".cache" / "tputool" / "xla"


def _on_event(name: str, **_: object) -> None:
    if name in _EVENTS:
        stats[_EVENTS[name]] += 1


def enable() -> Path | None:
    """Turn on JAX's persistent cache in `cache_dir()` (idempotent); None if TPUTOOL_CACHE_DIR is 'off'."""
    global _enabled_dir
    if _enabled_dir is not None:
        return _enabled_dir
    if os.environ.get("TPUTOOL_CACHE_DIR", "").lower() == "off":
        return None
    import jax

    path = cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    if jax.config.jax_compilation_cache_dir is None:  # a user's own setting wins
        jax.config.update("jax_compilation_cache_dir", str(path))
    else:
        path = Path(jax.config.jax_compilation_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()  # JAX decides once per process; re-decide if it already looked
    jax.monitoring.register_event_listener(_on_event)
    _enabled_dir = path
    return path
