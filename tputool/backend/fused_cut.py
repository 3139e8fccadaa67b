"""Where Fused eager cuts a trace that grows without a sync point: at the boundaries of the step it repeats.

A loop that never reads a value back (a generation loop that keeps its tokens on the device, as gpt-fast's does;
micro-batches of gradient accumulation) gives Fused eager one trace that grows until `fused.MAX_NODES`, flushed
there (reason "size") at whatever op the limit falls on: a program of thousands of ops (seconds of compile), and
the next traces end at other ops, so a second call of the same loop compiles new programs again. At such a flush
`Cutter` looks in the ops recorded lately for the step they repeat (the shortest sequence of lowerings, compared
by identity, that repeats over three quarters of the lowerings it keeps, so the layers of one long training step
are not taken for a loop), and from then on a trace is flushed when it has recorded one more repetition of it (at
least `MIN_CUT` nodes: several short steps make one cut), reason `REASON`: every repetition runs the same program,
compiled once. A cut is made only where the last repetition recorded equals the one before it, lowering for
lowering; where the loop changes, the repetition is looked for again in the traces that follow (`SEARCH_TRACES`
of them), so a second call of the loop cuts at the same places.

Where a trace is cut changes which programs run, never what they compute: a flush may happen after any op.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

REASON = "repeated step"
"""The flush reason of a cut (`tputool diagnose`: a designed boundary, like an optimizer step)."""
MIN_CUT = 128
"""The fewest nodes a cut trace holds: a step shorter than this is cut every few repetitions (a loop of one op
is not one launch per op)."""
PROBES = (1024, 2048)
"""Trace lengths at which a trace recorded for inference (no autograd: `torch.no_grad()`, outside a backward) is
searched for a repeated step before it reaches the node limit, so a decoding loop's first program is not one of
thousands of ops. Training traces wait for the limit: the layers of a long forward would read as a loop."""
SEARCH_TRACES = 2
"""Traces flushed for another reason, in a row, in which a repetition that stopped matching is looked for
before it is forgotten."""


def find_period(keys: Sequence, min_cover: int) -> tuple[int, int] | None:
    """(p, start): the shortest period p with which `keys` repeat from index `start` to their end, covering at least
    `min_cover` keys and two periods; None where no period covers that much."""
    n = len(keys)
    if n < 4:
        return None
    ids: dict = {}
    a = np.fromiter((ids.setdefault(id(k), len(ids)) for k in keys), dtype=np.int64, count=n)
    # candidates: p with keys[n-1-p] == keys[n-1], shortest first
    cands = np.flatnonzero(a[n - 2::-1] == a[n - 1]) + 1
    for p in cands[cands <= n // 2].tolist():
        bad = np.flatnonzero(a[p:] != a[:-p])  # bad[i]: keys[i] differs from keys[i + p]
        run = (n - p) - (int(bad[-1]) + 1 if len(bad) else 0)  # trailing keys that equal the ones p earlier
        cover = run + p
        if cover >= max(2 * p, min_cover):
            return p, n - cover
    return None


class Cutter:
    """The recent lowerings of one process's traces and the cut they suggest (see the module docstring).

    Positions count nodes flushed since the process began (`end`: where the current trace starts)."""

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = max_nodes
        self.hist: list = []
        self.base = 0  # position of hist[0]
        self.unit = 0  # nodes per cut (a multiple of the period), 0: no cut known
        self.cut: int | None = None  # position of the next cut; None while the repetition is looked for
        self.template: list = []  # one unit's lowerings, from a cut boundary on
        self.search_left = 0  # traces that may still end without the repetition being found again

    @property
    def keep(self) -> int:
        """Lowerings searched for a repetition: a step of up to `max_nodes` repeats twice within them."""
        return 2 * self.max_nodes + 2

    @property
    def end(self) -> int:
        """Position where the current trace starts."""
        return self.base + len(self.hist)

    def limit(self, recorded: int = 0) -> int:
        """The trace length at which `due` is asked next (`recorded`: nodes the trace holds now)."""
        if self.unit and self.cut is not None:
            rel = self.cut - self.end
            while rel <= recorded:
                rel += self.unit
            return min(rel, self.max_nodes + 1)
        if self.unit:
            return min(recorded + self.unit, self.max_nodes + 1)
        return min([p for p in PROBES if p > recorded] + [self.max_nodes + 1])

    def due(self, cur: list, probe: bool = False) -> bool:
        """Whether the current trace (its lowerings `cur`, at an op boundary) ends a repetition now; with no
        repetition known and `probe` (an inference trace at a `PROBES` length), it is looked for first."""
        n = len(cur)
        if not self.unit and probe and n <= self.max_nodes:
            self._learn(cur)
        q = self.unit
        if not q or n > self.max_nodes:
            return False
        if self.cut is not None:
            if self._repeats(cur, n):
                return True
            self.cut = None  # (the loop changed: look for its step again)
        j = self._find(cur)
        if j is None:
            return False
        self.cut = self.end + j + q  # (boundaries from there on every unit; the trace is cut at the next one)
        return (n - j) % q == 0

    def _repeats(self, cur: list, n: int) -> bool:
        """The last unit recorded (ending with the trace's node n - 1) equals the unit before it."""
        q = self.unit
        need = 2 * q - n  # (lowerings of earlier traces the two units reach back to)
        if need > len(self.hist):
            return False
        last2 = (self.hist[len(self.hist) - need:] + cur) if need > 0 else cur[n - 2 * q:]
        return len(last2) == 2 * q and last2[:q] == last2[q:]

    def _find(self, cur: list) -> int | None:
        """The first index at which the current trace holds a whole unit equal to the template."""
        q, t = self.unit, self.template
        start = 0
        first = t[0]
        while True:
            try:
                j = cur.index(first, start)
            except ValueError:
                return None
            if j + q > len(cur):
                return None
            if cur[j: j + q] == t:
                return j
            start = j + 1

    def flushed(self, cur: list, reason: str) -> None:
        """The current trace (lowerings `cur`) was flushed for `reason`: keep its lowerings, learn or forget."""
        self.hist.extend(cur)
        if len(self.hist) > 2 * self.keep:
            drop = len(self.hist) - self.keep
            del self.hist[:drop]
            self.base += drop
        if reason == "size":
            self._learn()
        elif self.unit and self.cut is None and reason != REASON:
            self.search_left -= 1
            if self.search_left <= 0:
                self.forget()
        elif reason == REASON:
            self.search_left = SEARCH_TRACES

    def _learn(self, cur: Sequence = ()) -> None:
        """Look for the repeated step in the lowerings kept and `cur` (the current trace's, not yet kept)."""
        window = (self.hist[-self.keep:] + list(cur))[-self.keep:]
        found = find_period(window, 3 * len(window) // 4)
        if found is None:
            self.forget()
            return
        p, start = found
        q = p * -(-MIN_CUT // p)
        cover = len(window) - start
        if cover < 2 * q or q > self.max_nodes:
            self.forget()
            return
        now = self.end + len(cur)  # (the position after the last lowering of the window)
        first = now - cover  # position of the repetition's first node (phase 0)
        self.unit = q
        self.template = window[start: start + q]
        self.cut = first + ((now - first) // q + 1) * q
        self.search_left = SEARCH_TRACES

    def forget(self) -> None:
        """No cut: traces grow to the node limit again."""
        self.unit, self.cut, self.template = 0, None, []

    def broken(self) -> None:
        """The current trace was dropped unflushed: the lowerings kept no longer run on into the next trace."""
        self.hist.clear()
        self.base = 0
        self.forget()
