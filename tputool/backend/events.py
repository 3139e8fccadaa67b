"""Runtime events the backend records for `tputool diagnose`.

Kinds: "fallback" (op ran on CPU), "host_sync" (.item()/.cpu()/printing a tpu tensor), "flush"
(fused eager flushed, detail = reason), "transfer_h2d"/"transfer_d2h" (bytes), "compile" (an XLA
compile, detail = op or graph name), "graph_break", "recompile", and "launch": a device program run
(a Strict kernel, a Fused flush, a compiled graph's call, a view's read/write kernel, a conversion...).

Counting is always on and costs one dict update; launches, the most frequent, are one integer
(`launches`, incremented in place by each launch site, never logged), read like the others with
`total("launch")`. With recording on (`TPUTOOL_DIAGNOSE=1`, set by
`tputool diagnose`), each event also keeps the user's file:line (first frame outside torch, jax
and tputool), so reports point at the user's code.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

counts: Counter[tuple[str, str]] = Counter()
"""(kind, detail) -> number of events since start (or since `reset()`)."""

recording: bool = os.environ.get("TPUTOOL_DIAGNOSE") == "1"
launches: int = 0
"""Device programs launched since start (or since `reset()`): see the "launch" kind above."""

log: list[dict] = []
"""With `recording`, one dict per event: kind, detail, file, line, amount, plus extra fields."""

_SKIP = ("/torch/", "/jax/", "/jaxlib/", "/tputool/backend/", "/tputool/diagnose/", "/tputool/parity/",
         "<frozen", "/contextlib.py", "/typing.py", "/functools.py")


def user_location() -> tuple[str, int]:
    """The innermost stack frame outside torch, jax and tputool's runtime, as (file, line)."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not any(s in name for s in _SKIP):
            return name, f.f_lineno
        f = f.f_back
    return "<unknown>", 0


def record(kind: str, detail: str = "", amount: int = 1, **extra) -> None:
    """Count one event; with recording on, also log it with the user's location."""
    counts[(kind, detail)] += amount
    if recording:
        file, line = user_location()
        log.append({"kind": kind, "detail": detail, "amount": amount, "file": file, "line": line, **extra})


def total(kind: str) -> int:
    """Sum of the counts of every event of `kind` ("launch": the `launches` counter)."""
    if kind == "launch":
        return launches
    return sum(n for (k, _), n in counts.items() if k == kind)


def reset() -> None:
    """Forget every count and logged event."""
    global launches
    launches = 0
    counts.clear()
    log.clear()
