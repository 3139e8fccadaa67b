"""Running a group's collective program with a bounded wait, a runtime failure named by the ranks that stopped.

`Guard.run(prog, *blocks)` dispatches the program and waits for its results at most the group's timeout (it
polls, so that a peer that never joins cannot hold the process forever). A failure inside the runtime (gloo's
"connection reset by peer" when a rank dies mid-collective) or the timeout becomes a DistBackendError that
names the ranks whose heartbeat stopped (`liveness`), and marks the process failed, so that it exits (status 1)
instead of waiting in JAX's shutdown barrier for the dead rank.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import torch.distributed as dist

from tputool.backend.distributed import jax_runtime, liveness
from tputool.backend.distributed.handshake import Handshake
from tputool.backend.distributed.programs import Collective

_FIRST_SLEEP = 20e-6
_LONGEST_SLEEP = 2e-3


class _TimedOut(Exception):
    pass


def _wait(outs: Sequence[jax.Array], timeout_s: float) -> None:
    """Wait for `outs`, at most `timeout_s` seconds (then _TimedOut); the runtime's error, if it failed."""
    last = outs[-1]
    if not last.is_ready():
        deadline = time.monotonic() + timeout_s
        pause = _FIRST_SLEEP
        while not last.is_ready():
            if time.monotonic() > deadline:
                raise _TimedOut
            time.sleep(pause)
            pause = min(2 * pause, _LONGEST_SLEEP)
    jax.block_until_ready(outs)


class Guard:
    """Runs one group's programs (see the module docstring)."""

    __slots__ = ("_hs", "_timeout_s")

    def __init__(self, hs: Handshake) -> None:
        self._hs = hs
        self._timeout_s = hs.timeout.total_seconds()

    def run(self, prog: Collective, *blocks: jax.Array, what: str | None = None,
            ranks: Sequence[int] | None = None) -> list[jax.Array]:
        """This process's results of `prog` over `blocks`; DistBackendError naming the stopped ranks (of
        `ranks`, default all) when the runtime fails or no result comes within the timeout. `what`: the call
        named in the error (default: the group's last signature exchanged, `Handshake.current`)."""
        try:
            outs = prog.launch(*blocks)
            _wait(outs, self._timeout_s)
        except _TimedOut:
            raise self._fault(what, f"no result within the timeout ({self._timeout_s:g}s)", ranks) from None
        except jax.errors.JaxRuntimeError as e:
            raise self._fault(what, f"failed in the runtime: {str(e).strip()}", ranks) from e
        return prog.local(outs)

    def _fault(self, what: str | None, how: str, ranks: Sequence[int] | None) -> dist.DistBackendError:
        hs = self._hs
        what = what or hs.current
        silent = liveness.silent_ranks(hs.store, hs.size, min(liveness.WINDOW, max(1.0, self._timeout_s)))
        others = [r for r in (range(hs.size) if ranks is None else ranks) if r != hs.rank]
        if silent is None:
            who = "the c10d store is unreachable (its host, rank 0 or torchrun's agent, may have died)"
        elif stopped := [r for r in silent if r in others]:
            who = f"rank(s) {', '.join(map(str, stopped))} of {hs.size} stopped (no heartbeat)"
        else:
            who = (f"rank(s) {', '.join(map(str, others))} of {hs.size} alive: skipped this call, or hang in "
                   "another")
        msg = f"{hs.name}: {what}: {how}: {who}"
        jax_runtime.mark_failed(msg)
        return dist.DistBackendError(msg)
