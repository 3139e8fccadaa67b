"""The function-mode observer, in process: what it records and where (this file's lines)."""

from __future__ import annotations

import io
import os
import sys

import numpy as np
import torch

from tputool.diagnose.observe import Observer, StepCounter, StepLimitReached, wrap_from_numpy
from tputool.diagnose.userframes import UserFrames


def _line() -> int:
    return sys._getframe(1).f_lineno


def _observer():
    frames = UserFrames(os.path.dirname(__file__))
    return Observer(frames, StepCounter(None)), frames


def test_host_syncs_recorded_at_the_calling_line():
    obs, _ = _observer()
    x = torch.randn(4)
    lines = {}
    with obs:
        lines[".item()"] = _line() + 1
        x.sum().item()
        lines["bool(tensor) / if tensor:"] = _line() + 1
        if x.any():
            pass
        lines["float(tensor)"] = _line() + 1
        float(x.sum())
        lines["print(tensor)"] = _line() + 1
        print(x, file=io.StringIO())
        lines["f-string of a tensor"] = _line() + 1
        f"{x.sum():.2f}"
        lines[".tolist()"] = _line() + 1
        x.tolist()
        x.cpu()  # a CPU tensor's .cpu() is no sync
        x.to("cpu")
    got = {s["kind"]: s["line"] for s in obs.to_record()["host_syncs"]}
    assert got == lines
    assert all(s["direct"] and s["device"] == "cpu" for s in obs.to_record()["host_syncs"])


def test_library_syncs_are_marked_indirect():
    obs, _ = _observer()
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p])
    p.sum().backward()
    with obs:
        opt.step()  # AdamW reads its CPU step counter with .item() inside torch.optim
    syncs = obs.to_record()["host_syncs"]
    assert syncs and not any(s["direct"] for s in syncs)


def test_dtypes_dynamic_shapes_and_mxu_shapes():
    obs, frames = _observer()
    undo = wrap_from_numpy(frames, obs)
    x = torch.randn(8, 100)
    w = torch.randn(64, 100)
    xd = x.double()
    try:
        with obs:
            l_double = _line() + 1
            x.double()
            l_numpy = _line() + 1
            torch.from_numpy(np.zeros(3))
            l_half = _line() + 1
            torch.zeros(2, dtype=torch.float16)
            xd.sum()  # float64 in, float64 out: only conversions and creations are reported
            l_nonzero = _line() + 1
            torch.nonzero(x > 0)
            l_mask = _line() + 1
            x[x > 0]
            l_linear = _line() + 1
            torch.nn.functional.linear(x, w)
            torch.nn.functional.linear(torch.randn(8, 128), torch.randn(256, 128))  # all aligned: nothing
            q = torch.randn(1, 2, 16, 64)
            l_sdpa = _line() + 1
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
    finally:
        undo()
    rec = obs.to_record()
    assert {(d["dtype"], d["op"], d["line"], d["device"]) for d in rec["dtypes"]} == {
        ("float64", "double", l_double, "cpu"), ("float64", "from_numpy", l_numpy, "cpu"),
        ("float16", "zeros", l_half, "cpu")}
    assert {(d["op"], d["line"]) for d in rec["dynamic_shapes"]} == {
        ("nonzero", l_nonzero), ("boolean-mask indexing", l_mask)}
    shapes = {(s["op"], s["line"]): s["dims"] for s in rec["shapes"]}
    assert shapes == {("linear", l_linear): {"M": 8, "K": 100, "N": 64},
                      ("attention", l_sdpa): {"M": 16, "head_dim": 64}}


def test_step_counter_stops_after_max_steps():
    steps = StepCounter(2)
    steps.install()
    try:
        p = torch.nn.Parameter(torch.ones(1))
        opt = torch.optim.SGD([p], lr=0.1)
        opt.step()
        try:
            opt.step()
        except StepLimitReached:
            pass
        else:
            raise AssertionError("the second step should stop the script")
    finally:
        steps.remove()
    assert steps.steps == 2


def test_syncs_under_set_default_device_stay_direct():
    obs, _ = _observer()
    x = torch.randn(3)
    with obs, torch.device("cpu"):
        line = _line() + 1
        x.sum().item()
    (s,) = obs.to_record()["host_syncs"]
    assert (s["line"], s["direct"]) == (line, True)
