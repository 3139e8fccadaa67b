"""Running a group's collective program with a bounded wait, a runtime failure named by the ranks that stopped.

`Guard.run(prog, *blocks)` (and `Guard.settle`, which a compiled graph's one program over the group runs
through) dispatches the program and waits for its results at most the group's timeout (it
polls, so that a peer that never joins cannot hold the process forever). Where the dispatch itself blocks
(XLA:CPU may run a program in the calling thread), the heartbeat thread is the watchdog: past the timeout it
prints the error and ends the process. A failure inside the runtime (gloo's
"connection reset by peer" when a rank dies mid-collective) or the timeout becomes a DistBackendError that
names the ranks whose heartbeat stopped (`liveness`), and marks the process failed, so that it exits (status 1)
instead of waiting in JAX's shutdown barrier for the dead rank.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch.distributed as dist

from tputool.backend.distributed import jax_runtime, liveness
from tputool.backend.distributed.handshake import Handshake
from tputool.backend.distributed.programs import Collective

_FIRST_SLEEP = 20e-6
_LONGEST_SLEEP = 2e-3
_GRACE_S = liveness.WINDOW + 2 * liveness.INTERVAL
"""How long past the timeout the watchdog lets a call run before ending the process (the call's own bounded
wait, when it is not stuck in the dispatch, raises first and names the ranks in WINDOW seconds)."""


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
        return prog.local(self.settle(prog.launch, blocks, what, ranks))

    def settle(self, launch: Callable[..., Sequence[Any]], args: Sequence[Any], what: str | None = None,
               ranks: Sequence[int] | None = None) -> Sequence[Any]:
        """`launch(*args)`'s outputs once its arrays are ready, bounded and named as `run` says (a compiled
        graph's program over the group runs through here too)."""
        liveness.watching = (time.monotonic() + self._timeout_s + _GRACE_S, self._stuck, what, ranks)
        try:
            outs = launch(*args)
            arrays = [o for o in outs if isinstance(o, jax.Array)]
            if arrays:
                _wait(arrays, self._timeout_s)
        except _TimedOut:
            raise self._fault(what, f"no result within the timeout ({self._timeout_s:g}s)", ranks) from None
        except jax.errors.JaxRuntimeError as e:
            raise self._fault(what, f"failed in the runtime: {str(e).strip()}", ranks) from e
        finally:
            liveness.watching = None
        return outs

    def _fault(self, what: str | None, how: str, ranks: Sequence[int] | None) -> dist.DistBackendError:
        msg = self._describe(what, how, ranks)
        jax_runtime.mark_failed(msg)
        return dist.DistBackendError(msg)

    def _stuck(self, what: str | None, ranks: Sequence[int] | None) -> None:
        """The watchdog's end for a call stuck inside the runtime past the timeout (a dispatch that blocks
        cannot be interrupted: as torch's NCCL watchdog does, the error is printed and the process ends)."""
        msg = self._describe(what, f"stuck in the runtime past the timeout ({self._timeout_s:g}s)", ranks)
        print(f"[tputool] {msg}: ending this process (status 1)", file=sys.stderr, flush=True)
        jax_runtime.mark_failed(msg)
        os._exit(1)

    def _describe(self, what: str | None, how: str, ranks: Sequence[int] | None) -> str:
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
        return f"{hs.name}: {what}: {how}: {who}"
