"""A loop that never syncs is cut where its step repeats (`fused_cut`): one program per step, reused.

Before: such a loop (gpt-fast's decoding keeps its tokens on the device) grew one trace to `MAX_NODES` and was
flushed wherever the limit fell ("size"), so every call of the loop compiled new programs of thousands of ops.
"""

from __future__ import annotations

import pytest
import torch

from tputool.backend import events
from tputool.backend.fused_cut import MIN_CUT, REASON, Cutter, find_period


def test_the_period_found_is_the_loops_step_not_a_repetition_inside_it() -> None:
    layer = ["mm", "add", "relu"]
    step = ["embed", *layer, *layer, "norm", "argmax"]  # (two identical layers inside each step)
    keys = ["load", "prefill", *(step * 12)]
    p, start = find_period(keys, 3 * len(keys) // 4)
    assert p == len(step)
    assert keys[start:start + p] == step  # (the repetition begins after the part that does not repeat)


def test_no_period_where_the_repetition_covers_too_little() -> None:
    keys = [f"op{i}" for i in range(100)] + ["a", "b"] * 5
    assert find_period(keys, 3 * len(keys) // 4) is None
    assert find_period(["a", "b", "c"], 0) is None


def _drive(cutter: Cutter, ops: list, limit_reached) -> list[tuple[int, str]]:
    """Record `ops` one node per op through `cutter` as the trace does; returns (length, reason) per flush."""
    flushes, cur = [], []
    limit = cutter.limit()
    for op in ops:
        cur.append(op)
        if len(cur) >= limit:
            reason = limit_reached(cutter, cur)
            if reason:
                flushes.append((len(cur), reason))
                cutter.flushed(cur, reason)
                cur = []
                limit = cutter.limit()
            else:
                limit = cutter.limit(len(cur))
    return flushes


def _at_limit(cutter: Cutter, cur: list) -> str | None:
    if len(cur) > cutter.max_nodes:
        return "size"
    return REASON if cutter.due(cur) else None


def test_after_one_size_flush_every_step_is_its_own_trace_and_a_changed_loop_is_found_again() -> None:
    step = [f"s{i}" for i in range(150)]
    cutter = Cutter(max_nodes=1000)
    flushes = _drive(cutter, ["prefill"] * 3 + step * 20, _at_limit)
    assert flushes[0] == (1001, "size")
    assert all(reason == REASON for _, reason in flushes[1:]) and len(flushes) >= 10
    assert {n for n, _ in flushes[2:]} == {150}  # (after the first cut, one whole step per trace)
    # a second call of the loop: something else first, then the same step again
    later = _drive(cutter, ["other"] * 40 + step * 10, _at_limit)
    assert all(reason == REASON for _, reason in later)
    assert {n for n, _ in later[1:]} == {150}  # (no second size flush: the step was found again)


def test_a_short_step_is_cut_every_few_repetitions() -> None:
    cutter = Cutter(max_nodes=1000)
    flushes = _drive(cutter, ["a", "b", "c"] * 800, _at_limit)
    sizes = {n for n, r in flushes[2:] if r == REASON}
    assert sizes and all(n >= MIN_CUT and n % 3 == 0 for n in sizes)


@pytest.fixture
def fused_small(tpu_device: str, monkeypatch):
    from tputool.backend import fused

    fused.flush()
    monkeypatch.setattr(fused.TRACE, "cutter", Cutter(max_nodes=300))
    fused.TRACE.limit = fused.TRACE.cutter.limit()
    events.reset()
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    yield fused
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)


def _decode(x: torch.Tensor, w: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """A loop that keeps everything on the device: no sync point until the caller reads the tokens."""
    out = []
    for _ in range(steps):
        h = torch.tanh(x @ w) * 0.5 + x
        x = h / h.norm(dim=-1, keepdim=True)
        out.append(x.argmax(dim=-1))
    return out


def test_a_loop_without_sync_points_reuses_one_program_per_step(fused_small) -> None:
    torch.manual_seed(0)
    x, w = torch.randn(2, 16), torch.randn(16, 16)
    want = torch.stack(_decode(x, w, 240))
    got = torch.stack(_decode(x.to("tpu"), w.to("tpu"), 240)).cpu()
    assert torch.equal(got, want)
    flushes = {d: n for (k, d), n in events.counts.items() if k == "flush"}
    assert flushes.get(REASON, 0) >= 10
    compiled = events.counts[("compile", "fused graph")]
    # the same loop again: every trace ends where one did before, so no program is new
    again = torch.stack(_decode(x.to("tpu"), w.to("tpu"), 240)).cpu()
    assert torch.equal(again, want)
    assert events.counts[("compile", "fused graph")] - compiled <= 2  # (its first and last traces only)


def test_an_inference_loop_is_cut_before_the_node_limit_a_training_trace_is_not(fused_small, monkeypatch) -> None:
    """Under torch.no_grad() the repetition is looked for at PROBES lengths: no trace of the loop reaches the limit.
    With autograd recording (a forward whose layers repeat), only the limit's flush looks for one."""
    from tputool.backend import fused_cut

    monkeypatch.setattr(fused_cut, "PROBES", (100, 200))
    monkeypatch.setattr(fused_cut, "MIN_CUT", 16)  # (two units of the loop's step fit before the first probe)
    fused_small.TRACE.limit = fused_small.TRACE.cutter.limit()
    torch.manual_seed(0)
    x, w = torch.randn(2, 16), torch.randn(16, 16)
    with torch.no_grad():
        got = torch.stack(_decode(x.to("tpu"), w.to("tpu"), 120)).cpu()
    assert torch.equal(got, torch.stack(_decode(x, w, 120)))
    flushes = {d: n for (k, d), n in events.counts.items() if k == "flush"}
    assert "size" not in flushes and flushes.get(REASON, 0) >= 3
    events.reset()
    fused_small.TRACE.cutter.forget()
    fused_small.TRACE.limit = fused_small.TRACE.cutter.limit()
    _decode(x.to("tpu"), w.to("tpu").requires_grad_(), 120)[-1].cpu()
    assert {d: n for (k, d), n in events.counts.items() if k == "flush"}.get("size", 0) >= 1
