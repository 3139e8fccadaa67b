"""Heartbeats through the c10d store: which ranks of a group are still alive, once a collective has failed.

Every process runs one daemon thread that adds 1 to `hb/<rank>` in the store of each of its groups every
`INTERVAL` seconds. After a collective fails (a peer's connection reset, or no result within the timeout),
`silent_ranks` reads the counters twice, `window` seconds apart: a rank whose counter did not move has
stopped (died, or its process hangs with the interpreter held). A signature exchange that waits past its
first second reads them too (`handshake`); a collective that completes reads nothing.
The same thread is the watchdog of a call stuck in the runtime (`watching`). At exit the thread is stopped and
joined (`stop`, an atexit handler) before the interpreter finalizes: a daemon thread still inside a store call
then is ended by a forced unwind through the store's C++ frames, which aborts the whole process ("terminate called
without an active exception", status 134) after the script succeeded.
"""

from __future__ import annotations

import atexit
import threading
import time

import torch.distributed as dist

INTERVAL = 1.0
"""Seconds between two heartbeats of a process."""

WINDOW = 4.0
"""Seconds `silent_ranks` watches the counters for (several intervals: a loaded host delays a beat)."""

KEY = "hb/{}"
"""The store key of a rank's heartbeat counter."""

watching: tuple | None = None
"""(deadline, on_stuck, *args) of the collective call in progress (set by `faults.Guard.run`); the beating
thread calls on_stuck(*args) once time.monotonic() passes the deadline (the watchdog)."""
_groups: list[tuple[dist.Store, int]] = []
_lock = threading.Lock()
_thread: threading.Thread | None = None
_stopping = threading.Event()

STOP_WAIT_S = 10.0
"""How long `stop` waits at exit for a beat in progress (a store call whose host is gone fails at once; a live
host answers in milliseconds)."""


def _beat() -> None:
    while not _stopping.is_set():
        w = watching
        if w is not None and time.monotonic() > w[0]:
            w[1](*w[2:])
        with _lock:
            groups = list(_groups)
        for store, rank in groups:
            try:
                store.add(KEY.format(rank), 1)
            except Exception:  # noqa: BLE001 - the store's host is gone: stop beating into it
                with _lock:
                    if (store, rank) in _groups:
                        _groups.remove((store, rank))
        _stopping.wait(INTERVAL)


def start(store: dist.Store, rank: int) -> None:
    """Beat as `rank` into `store` (a group's store) from now on; the process's thread starts on first use."""
    global _thread
    store.add(KEY.format(rank), 1)
    with _lock:
        _groups.append((store, rank))
        if _thread is None:
            _thread = threading.Thread(target=_beat, name="tputool-heartbeat", daemon=True)
            _thread.start()
            atexit.register(stop)


def stop() -> None:
    """Stop the heartbeat thread and wait for it (at most STOP_WAIT_S); registered to run at exit."""
    _stopping.set()
    if _thread is not None:
        _thread.join(STOP_WAIT_S)


def silent_ranks(store: dist.Store, size: int, window: float = WINDOW) -> list[int] | None:
    """The ranks of a group (of `size` ranks, beating into `store`) whose heartbeat did not move in `window`
    seconds; None when the store itself is unreachable (its host, rank 0 or torchrun's agent, is gone)."""
    keys = [KEY.format(r) for r in range(size)]
    try:
        before = [store.add(k, 0) for k in keys]
        time.sleep(window)
        after = [store.add(k, 0) for k in keys]
    except Exception:  # noqa: BLE001 - DistNetworkError and the like
        return None
    return [r for r, (b, a) in enumerate(zip(before, after, strict=True)) if a == b]
