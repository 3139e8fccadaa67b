"""In the tpu child: compare each module output with the reference as it is recorded, and replay the first
module that departs op by op (`replay.replay`).

When a module's own ops agree on the same inputs (the departure came in with them), its parent is replayed
when its call ends, since the code between two child modules runs in the parent's forward; up to
`MAX_REPLAYS` modules are replayed. The replays go into the tpu record under "replays".

A random op recorded outside modules whose draw departs while its input agrees is drawn again
(`replay.redraw`) on the tpu input and on the reference's from one random state; its record gets "redraw":
"same" (only the random stream differs), "differs" (the input's rounding alone changes the draw) or
"failed: ..." (why it could not be drawn again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tputool.parity.compare import diff
from tputool.parity.record import Recorder, capture, first_tensor
from tputool.parity.replay import compare_ops, redraw, replay

MAX_REPLAYS = 3


class Online:
    """Watches the tpu recorder's entries against the reference's (see the module doc)."""

    def __init__(self, recorder: Recorder, ref_entries: list[dict], slack: float, target: str,
                 ref_fp32: bool) -> None:
        self.recorder, self.slack, self.target, self.ref_fp32 = recorder, slack, target, ref_fp32
        self.ref = {e["key"]: e for e in ref_entries}
        self.replays: list[dict] = []
        self.pending: int | None = None  # id() of the module to replay when its call ends
        self.done = False
        self.error: str | None = None

    def on_entry(self, entry: dict, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """The recorder's per-call callback."""
        if self.done:
            return
        if self.pending is not None:
            if id(module) == self.pending:
                self._replay(entry, module, args, kwargs)
            return
        ref = self.ref.get(entry["key"])
        if ref is None or not diff(entry, ref, entry["step"], self.slack)["beyond"]:
            return
        self._replay(entry, module, args, kwargs)

    def on_random(self, entry: dict, func: Callable, args: tuple, kwargs: dict,
                  src: torch.Tensor | None) -> None:
        """The recorder's callback for a random op recorded outside modules (see the module doc)."""
        ref = self.ref.get(entry["key"])
        if self.done or ref is None or src is None or (entry.get("input") or {}).get("value") is None \
                or (ref.get("input") or {}).get("value") is None:
            return
        step = entry["step"]
        if not diff(entry, ref, step, self.slack)["beyond"] or diff(entry["input"], ref["input"], step,
                                                                    self.slack)["beyond"]:
            return
        try:
            mine, theirs = (first_tensor(x) for x in redraw(func, args, kwargs, src, ref["input"]["value"]))
            if mine is None or theirs is None:
                raise TypeError("the op returned no tensor")
            big = self.recorder.max_bytes
            differs = diff(capture(mine, big), capture(theirs, big), step, self.slack)["beyond"]
            entry["redraw"] = "differs" if differs else "same"
        except Exception as e:  # noqa: BLE001 - a draw that cannot be repeated on CPU only loses the test
            entry["redraw"] = f"failed: {type(e).__name__}: {e}"

    def _replay(self, entry: dict, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        rec = self.recorder
        rec.paused = True
        try:
            tpu_ops, ref_ops = replay(module, args, kwargs, rec.frames, rec.max_bytes, self.target, self.ref_fp32)
            result = compare_ops(tpu_ops, ref_ops, self.slack)
        except Exception as e:  # noqa: BLE001 - a module that cannot be replayed still gets its module finding
            self.error = f"{type(e).__name__}: {e}"
            self.done = True
            return
        finally:
            rec.paused = False
        self.replays.append({"key": entry["key"], "name": entry["name"], "cls": entry["cls"], **result})
        own = any(result[k] is not None for k in ("divergence", "first", "random_at"))
        if own or not rec.stack or len(self.replays) >= MAX_REPLAYS:
            self.done = True
            self.pending = None
        else:
            self.pending = id(rec.stack[-1][0])
