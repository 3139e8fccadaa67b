"""Exchanges between a group's ranks through the c10d store: each rank sets its key and waits for the others'.

Before every collective the ranks exchange its signature (sequence number, collective, shapes, dtypes, op):
a rank that does not arrive within the group's timeout is named in a RuntimeError (never a hang), and
different calls on two ranks are named side by side. TPUTOOL_DIST_CHECKS=0 skips the exchange (collectives
still run; a missing rank then surfaces only as the runtime's own error or timeout).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

from tputool.backend.distributed import jax_runtime

CHECKS_ENV = "TPUTOOL_DIST_CHECKS"


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
        try:
            self.store.wait(keys, self.timeout)
        except Exception as e:  # noqa: BLE001 - DistStoreError, or the store itself gone with its host
            err = self._missing(keys, what, e)
            jax_runtime.mark_failed(str(err))
            raise err from None
        return [v.decode() for v in self.store.multi_get(keys)]

    def _missing(self, keys: list[str], what: str, cause: Exception) -> RuntimeError:
        try:
            gone = [r for r, k in enumerate(keys) if not self.store.check([k])]
        except Exception:  # noqa: BLE001 - the store's host (rank 0 of the job) is gone
            return RuntimeError(f"{self.name}: {what}: the c10d store is unreachable (its host, rank 0, may have "
                                f"died): {cause}")
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
