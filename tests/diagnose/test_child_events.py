"""The child's aggregation of backend events: per location, with the step each event happened in."""

from __future__ import annotations

import torch  # noqa: F401 - first: importing tputool.backend before torch breaks the device's autoload

from tputool.backend import events
from tputool.diagnose._child import _events_record


def test_events_aggregate_by_location_and_count_late_steps(monkeypatch):
    monkeypatch.setattr(events, "recording", True)
    events.reset()
    try:
        for _step in range(4):  # 4 steps, 2 events each; step boundaries after every 2 events
            events.record("compile", "k")
            events.record("transfer_h2d", "", 100)
        rec = _events_record([2, 4, 6, 8], 4)
    finally:
        events.reset()
    by = {e["kind"]: e for e in rec["events"]}
    assert by["compile"]["count"] == 4 and by["compile"]["late"] == 2 and by["compile"]["first_step"] == 0
    assert by["transfer_h2d"]["amount"] == 400
    assert by["compile"]["file"] == __file__
    assert rec["event_totals"] == {"compile": 4, "transfer_h2d": 400}


def test_events_after_the_last_step_and_warm_up_compiles_are_not_late(monkeypatch):
    """A final evaluation after the loop (the tail) compiles and syncs once: not late, not a step it was seen in;
    compiles in the first two steps are warm-up however short the run."""
    monkeypatch.setattr(events, "recording", True)
    events.reset()
    try:
        def log() -> None:  # (one line for every event: they aggregate by location)
            events.record("compile", "k"), events.record("host_sync", "read")

        for _step in range(5):  # 4 steps, then the tail
            log()
        rec = _events_record([2, 4, 6, 8], 4)
        short = _events_record([2, 4], 2)  # (the same log read as a two-step run: steps 0-1, then a tail)
    finally:
        events.reset()
    by = {e["kind"]: e for e in rec["events"]}
    assert by["compile"]["count"] == 5 and by["compile"]["late"] == 2  # steps 2 and 3 (second half), not the tail
    assert by["host_sync"]["late"] == 2 and by["host_sync"]["steps_seen"] == 4 and by["host_sync"]["last_step"] == 4
    assert {e["kind"]: e["late"] for e in short["events"]} == {"compile": 0, "host_sync": 1}
