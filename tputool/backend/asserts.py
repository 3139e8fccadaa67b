"""CUDA's device-side asserts on tpu: an op's failed index check is raised at the next sync point.

A checked op (`lowerings.checks`) returns a check record next to its results. Strict mode, Fused flushes and
compiled graphs hand those records to `launched` with the op's name and the user's file:line; nothing is
read back then. In Debug mode (launch blocking) `launched` reads the record at once and raises at the op's
call. Otherwise the records wait in `runtime.STATE.asserts` until a sync point (`.item()`, `.cpu()`,
printing, `torch.tpu.synchronize`, events) calls `raise_pending`, which reads them all in one transfer and
raises `DeviceAssertError` for the first failure, naming the op and the line that ran it. As with CUDA the
error comes once: the pending records are cleared when it is raised (CUDA's context stays broken; here the
next ops run normally, on whatever values the failed op produced).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from tputool.backend import events
from tputool.backend.lowerings.checks import message
from tputool.backend.runtime import STATE

MAX_PENDING = 4096
"""Past this many pending entries the older half is read (a host sync); a failure found is kept to raise at
the next sync point (bounds memory in a loop that never syncs)."""


class DeviceAssertError(RuntimeError):
    """A device-side assert (an out-of-range index) of a tpu op, raised as CUDA raises its asynchronous error."""


def site() -> str:
    """The user's file:line running the current op (the first frame outside torch, jax and tputool)."""
    file, line = events.user_location()
    return f"{file}:{line}"


def launched(record: jax.Array, op: str) -> None:
    """Note the check record of one eager run of `op` (called from the user's line)."""
    note(record, ((op, site()),))


def note(records: jax.Array, sites: Sequence[tuple[str, str]]) -> None:
    """Note check records (one per (op, file:line) site): raise now in Debug mode, else keep them until a sync
    point."""
    if STATE.blocking:
        failure = _first_failure([(records, sites)], blocking=True)
        if failure is not None:
            raise DeviceAssertError(failure)
        return
    pend((records, sites))


def pend(entry: tuple[jax.Array, Sequence[tuple[str, str]]]) -> None:
    """Keep (records, sites) until the next sync point: one record (shape (4,)) or a stack (k, 4), one site each."""
    pending = STATE.asserts
    pending.append(entry)
    if len(pending) > MAX_PENDING:
        old = pending[: MAX_PENDING // 2]
        del pending[: MAX_PENDING // 2]
        if STATE.assert_failure is None:
            STATE.assert_failure = _first_failure(old)


def raise_pending() -> None:
    """Raise the first failed check since the last sync point, if any (called by every sync point)."""
    entries = STATE.asserts
    failure = STATE.assert_failure or (_first_failure(entries) if entries else None)
    entries.clear()
    STATE.assert_failure = None
    if failure is not None:
        raise DeviceAssertError(failure)


def _first_failure(entries: list, blocking: bool = False) -> str | None:
    values = jax.device_get([r for r, _ in entries])
    for (_, sites), v in zip(entries, values, strict=True):
        rows = np.asarray(v).reshape(-1, 4)
        for (op, where), (code, value, dim, size) in zip(sites, rows.tolist(), strict=True):
            if code:
                return _text(code, value, dim, size, op, where, blocking)
    return None


def _text(code: int, value: int, dim: int, size: int, op: str, where: str, blocking: bool = False) -> str:
    head = f"device-side assert triggered: {message(code, value, dim, size)}\n  in {op}, called at {where}"
    if blocking:
        return head
    return (f"{head}\n"
            "tpu kernel errors are reported asynchronously, at the next sync point after the op (as CUDA's are); "
            "use torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING (Debug mode) to raise at the op itself.")
