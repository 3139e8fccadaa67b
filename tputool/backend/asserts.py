"""CUDA's device-side asserts on tpu: an op's failed index check is raised at the next sync point.

A checked op (`lowerings.checks`) computes a check record on the device as part of the op. Strict mode folds it
into one running record on the device (`STATE.assert_acc`: the first failure since the last sync point and the
number of its op; the kernel takes and returns it, `launch`), remembering each op's name and user's file:line
on the host; Fused flushes and compiled graphs return their records and `note` keeps them with their sites.
Nothing is read back then. In Debug mode (launch blocking) the record is read at once and raised at the op's
call. Otherwise a sync point (`.item()`, `.cpu()`, printing, `torch.tpu.synchronize`, events) calls
`raise_pending`, which reads the records and raises `DeviceAssertError` for the first failure, naming the op
and the line that ran it. As with CUDA the error comes once: the pending records are cleared when it is raised
(CUDA's context stays broken; here the next ops run normally, on whatever values the failed op produced).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tputool.backend import events
from tputool.backend.lowerings.checks import RECORD, message
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


def launch(fn, dyn: list, op: str):
    """Run a Strict-mode checked kernel `fn(acc, seq, *dyn) -> (results, acc)` of `op`; its results."""
    sites = STATE.assert_sites
    acc = STATE.assert_acc
    if acc is None:
        acc = _no_failure()
    out, STATE.assert_acc = fn(acc, len(sites), *dyn)
    sites.append((op, site()))
    if STATE.blocking or len(sites) > MAX_PENDING:
        failure = _strict_failure(STATE.blocking)
        if failure is not None:
            if STATE.blocking:
                raise DeviceAssertError(failure)
            STATE.assert_failure = STATE.assert_failure or failure
    return out


def _no_failure() -> jax.Array:
    global _ZERO
    if _ZERO is None:
        _ZERO = jnp.zeros((RECORD + 1,), jnp.int64)
    return _ZERO


_ZERO = None


def _strict_failure(blocking: bool = False) -> str | None:
    """Read Strict mode's running record (a host sync) and forget it; the failure's message, or None."""
    acc, sites = STATE.assert_acc, STATE.assert_sites
    STATE.assert_acc = None
    try:
        if acc is None or not sites:
            return None
        code, value, dim, size, seq = np.asarray(acc).tolist()
        return _text(code, value, dim, size, *sites[seq], blocking) if code else None
    finally:
        sites.clear()


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
    failure = STATE.assert_failure
    strict = _strict_failure() if STATE.assert_sites else None
    failure = failure or strict or (_first_failure(entries) if entries else None)
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
