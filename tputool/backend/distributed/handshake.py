"""Exchanges between a group's ranks through the c10d store: each rank sets its key and waits for the others'.

Before every collective the ranks exchange its signature (sequence number, collective, shapes, dtypes, op):
a rank that does not arrive within the group's timeout is named in a RuntimeError (never a hang), and
different calls on two ranks are named side by side. A rank whose process stopped is named sooner: past the first
second of waiting, the missing ranks' heartbeats (`liveness`) are read every `liveness.WINDOW` seconds, and one
that did not move fails the exchange at once (a rank that is alive but late, compiling say, is waited for).
The store is polled (`check`), never waited on with a timeout: a timed-out `Store.wait` makes torch's TCPStore
print `waitForInput ... timed out` warnings, which a clean run must not show. TPUTOOL_DIST_CHECKS=0 skips the
exchange (collectives still run; a missing rank then surfaces only as the runtime's own error or timeout).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch.distributed as dist

from tputool.backend.distributed import jax_runtime, liveness

CHECKS_ENV = "TPUTOOL_DIST_CHECKS"

_FIRST_WAIT_S = 1.0
"""How long an exchange waits before it starts reading the missing ranks' heartbeats (the common case, every
rank arriving within a second, reads nothing more)."""

_POLL_S = 0.05
"""Longest time between two looks at the store while a rank is late."""

_MIN_POLL_S = 0.0002
"""Shortest time between two looks: the pause grows with the time waited (a quarter of it), so a peer a few
milliseconds late is seen within about a quarter of its lateness, and a long wait costs few round trips."""


class Handshake:
    """Keyed exchanges of short strings among the `size` ranks of one group (a prefix store of its own)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta, name: str) -> None:
        self.store = store
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.name = name
        self.seq = 0
        self.current = "collective"
        """The last call `check` was given (named in a runtime failure's error)."""
        self.checks = os.environ.get(CHECKS_ENV, "1") != "0"

    def exchange(self, tag: str, value: str, what: str) -> list[str]:
        """Every rank's `value` for `tag`, in rank order; RuntimeError naming the ranks missing at the timeout."""
        keys = [f"{tag}/{r}" for r in range(self.size)]
        self.store.set(keys[self.rank], value)
        start = time.monotonic()
        deadline = start + self.timeout.total_seconds()
        cause = None
        try:
            arrived = self._poll(keys, start, min(deadline, start + _FIRST_WAIT_S))
        except Exception as e:  # noqa: BLE001 - DistStoreError: the store itself gone with its host
            arrived, cause = False, e
        if not arrived:
            self._wait_watching(keys, what, deadline, cause)
        return [v.decode() for v in self.store.multi_get(keys)]

    def _poll(self, keys: list[str], start: float, end: float) -> bool:
        """True once every key of `keys` is in the store, False at `end` (seconds on the monotonic clock; the
        wait began at `start`). Looks at once, then after pauses of a quarter of the time waited so far."""
        while True:
            if self.store.check(keys):
                return True
            now = time.monotonic()
            if now >= end:
                return False
            time.sleep(min(_POLL_S, max(_MIN_POLL_S, (now - start) / 4), end - now))

    def _wait_watching(self, keys: list[str], what: str, deadline: float, cause: Exception | None) -> None:
        """Poll for `keys` until `deadline`, reading the missing ranks' heartbeats every `liveness.WINDOW`
        seconds; RuntimeError (the process marked failed) at the deadline or once a missing rank stopped."""
        beats = None
        while True:
            stopped, beats = self._stopped(keys, beats)
            if stopped or beats is None or time.monotonic() >= deadline:
                err = self._missing(keys, what, cause, stopped)
                jax_runtime.mark_failed(str(err))
                raise err from None
            end = min(deadline, time.monotonic() + liveness.WINDOW)
            while time.monotonic() < end:
                try:
                    if self.store.check(keys):
                        return
                except Exception as e:  # noqa: BLE001 - the store's host is gone
                    cause = e
                    break
                time.sleep(_POLL_S)

    def _stopped(self, keys: list[str], beats: dict[int, int] | None) -> tuple[list[int], dict[int, int] | None]:
        """The missing ranks whose heartbeat did not move since `beats` (the last reading), and this reading
        (None when the store cannot be read: the error then says so)."""
        try:
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            now = {r: self.store.add(liveness.KEY.format(r), 0) for r in missing}
        except Exception:  # noqa: BLE001 - the store's host is gone
            return [], None
        if beats is None:
            return [], now
        return [r for r, n in now.items() if n and n == beats.get(r)], now

    def _missing(self, keys: list[str], what: str, cause: Exception | None, stopped: list[int]) -> RuntimeError:
        if stopped:
            return RuntimeError(f"{self.name}: {what}: rank(s) {', '.join(map(str, stopped))} of {self.size} "
                                f"stopped (no heartbeat for {liveness.WINDOW:g}s) before joining (rank "
                                f"{self.rank} waited)")
        try:
            gone = [r for r, k in enumerate(keys) if not self.store.check([k])]
        except Exception as e:  # noqa: BLE001 - the store's host (rank 0 of the job) is gone
            return RuntimeError(f"{self.name}: {what}: the c10d store is unreachable (its host, rank 0, may have "
                                f"died): {cause or e}")
        secs = self.timeout.total_seconds()
        return RuntimeError(f"{self.name}: {what}: rank(s) {', '.join(map(str, gone))} of {self.size} did not "
                            f"join within the timeout ({secs:g}s): the process died, hangs, or skipped this "
                            f"collective (rank {self.rank} waited)")

    def check(self, call: str, extra: str = "", need: bool = False) -> list[str]:
        """Exchange `call` (a collective's signature, equal on every rank) and `extra` (what may differ, e.g.
        split sizes) for the next sequence number; RuntimeError on a missing rank or a different call.
        Returns every rank's `extra` (empty when the checks are off, unless `need`)."""
        if not (self.checks or need):
            self.current = call
            return []
        self.seq += 1
        seq = self.seq
        self.current = f"collective #{seq} {call}"
        sigs = [v.split("\x00", 1) for v in self.exchange(f"c{seq}", f"{call}\x00{extra}", f"collective #{seq} {call}")]
        if seq > 1:  # every rank has read the previous keys once all have set these
            self.store.delete_key(f"c{seq - 1}/{self.rank}")
        for r, (other, _) in enumerate(sigs):
            if other != call:
                jax_runtime.mark_failed("mismatch")
                raise RuntimeError(f"{self.name}: collective #{seq} differs across ranks: rank {self.rank} called "
                                   f"{call} but rank {r} called {other}")
        return [e for _, e in sigs]
