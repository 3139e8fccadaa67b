"""Out-of-range indices fail as on CUDA (issue 17, part D): Debug mode raises at the op's line; Strict, Fused and
compiled graphs check on the device and raise at the next sync point, naming the op and the user's line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import tputool.backend  # noqa: F401 - registers the device
from tputool.backend import asserts, events, fused, runtime
from tputool.backend.asserts import DeviceAssertError

STRICT, DEBUG, FUSED = (runtime.EagerMode.DEFER_NEVER, runtime.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
                        runtime.EagerMode.DEFER_AND_FUSE)

# name -> (inputs on CPU, the op on one line, the message, the op named)
EXAMPLES = {
    "embedding": (lambda: (torch.randn(10, 2), torch.tensor([1, 12])),
                  lambda w, i: F.embedding(i, w),
                  r"index out of range in self", "aten.embedding.default"),
    "cross_entropy": (lambda: (torch.randn(2, 5), torch.tensor([9, 1])),
                      lambda x, t: F.cross_entropy(x, t),
                      r"Target 9 is out of bounds\.", "aten.nll_loss_forward.default"),
    "index": (lambda: (torch.arange(3), torch.tensor([5])),
              lambda x, i: x[i],
              r"index 5 is out of bounds for dimension 0 with size 3", "aten.index.Tensor"),
    "gather": (lambda: (torch.arange(12.0).reshape(3, 4), torch.tensor([[7]])),
               lambda x, i: torch.gather(x, 1, i),
               r"index 7 is out of bounds for dimension 1 with size 4", "aten.gather.default"),
}

SYNCS = {
    "item": lambda y: y.sum().item(),
    "cpu": lambda y: y.cpu(),
    "synchronize": lambda y: torch.tpu.synchronize(),
    "print": lambda y: str(y),
}


@pytest.fixture(autouse=True)
def _strict_after(tpu_device):
    yield
    runtime.set_mode(STRICT)
    runtime.reset()


def _example(name: str):
    make, fn, msg, op = EXAMPLES[name]
    args = [a.to("tpu") for a in make()]
    where = f"{__file__}:{fn.__code__.co_firstlineno}"
    return fn, args, msg, op, where


def _check_message(err: pytest.ExceptionInfo, msg: str, op: str, where: str) -> None:
    text = str(err.value)
    assert text.startswith("device-side assert triggered: ")
    assert op in text and where in text, text


@pytest.mark.parametrize("name", EXAMPLES)
def test_debug_mode_raises_at_the_op(name):
    fn, args, msg, op, where = _example(name)
    runtime.set_mode(DEBUG)
    with pytest.raises(DeviceAssertError, match=msg) as err:
        fn(*args)
    _check_message(err, msg, op, where)


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("mode", [STRICT, FUSED], ids=["strict", "fused"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_strict_and_fused_raise_at_the_next_sync_point(name, mode, sync):
    fn, args, msg, op, where = _example(name)
    runtime.set_mode(mode)
    y = fn(*args)  # (no error yet: the check is computed on the device)
    with pytest.raises(DeviceAssertError, match=msg) as err:
        SYNCS[sync](y)
    _check_message(err, msg, op, where)
    torch.tpu.synchronize()  # raised once, then cleared: the device keeps working
    assert (torch.ones(2, device="tpu") + 1).sum().item() == 4


@pytest.mark.parametrize("name", EXAMPLES)
def test_compiled_graphs_raise_at_the_next_sync_point_naming_the_line(name):
    fn, args, msg, op, where = _example(name)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu")
    y = compiled(*args)
    with pytest.raises(DeviceAssertError, match=msg) as err:
        y.cpu()
    _check_message(err, msg, op, where)


def _in_range_cases():
    x = torch.arange(12.0).reshape(3, 4)
    w = torch.randn(10, 2)
    logits = torch.randn(3, 5)
    t = torch.tensor
    return [
        (lambda x, i: x[i], x, t([-3, -1, 2])),
        (lambda x, i: x[:, i], x, t([-4, 3])),
        (lambda x, i: torch.gather(x, 1, i), x, t([[0, 3], [1, 2], [3, 3]])),
        (lambda x, i: x.index_select(0, i), x, t([2, 0])),
        (lambda x, i: x.index_put((i,), torch.ones((), device=x.device)), x, t([-1])),
        (lambda x, i: x.index_fill(0, i, 5.0), x, t([-1])),
        (lambda x, i: x.scatter_add(0, i, torch.ones(1, 4, device=x.device)), x, t([[2, 0, 1, 1]])),
        (lambda w, i: F.embedding(i, w), w, t([[0, 9], [3, 3]])),
        (lambda x, i: F.cross_entropy(x, i), logits, t([4, -100, 0])),
        (lambda x, i: F.cross_entropy(x, i, ignore_index=7), logits, t([4, 7, 0])),
    ]


@pytest.mark.parametrize("mode", [STRICT, DEBUG, FUSED, "compiled"])
def test_negative_indices_in_range_and_ignored_targets_are_fine(mode):
    torch._dynamo.reset()
    for fn, *args in _in_range_cases():
        want = fn(*args)
        if mode == "compiled":
            fn = torch.compile(fn, backend="tpu")
        else:
            runtime.set_mode(mode)
        got = fn(*[a.to("tpu") for a in args]).cpu()
        torch.testing.assert_close(got, want)
        runtime.set_mode(STRICT)


def test_checks_read_nothing_back_until_a_sync_point(monkeypatch):
    runtime.set_mode(STRICT)  # (Strict mode's own check accumulator)
    reads = []
    real = asserts._strict_failure
    monkeypatch.setattr(asserts, "_strict_failure", lambda *a, **k: reads.append(1) or real(*a, **k))
    w = torch.randn(10, 2, device="tpu")
    i = torch.tensor([1, 2], device="tpu")
    syncs = events.total("host_sync")
    for _ in range(5):
        y = F.embedding(i, w)
        y = torch.gather(y, 1, torch.zeros(2, 1, dtype=torch.long, device="tpu"))
    assert reads == [] and events.total("host_sync") == syncs
    assert len(runtime.STATE.assert_sites) == 10
    y.cpu()
    assert reads == [1] and runtime.STATE.assert_sites == [] and runtime.STATE.assert_acc is None


def test_fused_flushes_and_compiled_graphs_read_nothing_back_until_a_sync_point(monkeypatch):
    reads = []
    real = asserts._first_failure
    monkeypatch.setattr(asserts, "_first_failure", lambda *a, **k: reads.append(1) or real(*a, **k))
    w = torch.randn(10, 2, device="tpu")
    i = torch.tensor([1, 2], device="tpu")
    torch._dynamo.reset()
    compiled = torch.compile(lambda w, i: F.embedding(i, w) * 2, backend="tpu")
    for _ in range(3):  # (Strict mode: one entry per graph call)
        y = compiled(w, i)
    runtime.set_mode(FUSED)
    for _ in range(3):  # (one entry per flush, one site per checked op recorded)
        y = F.embedding(i, w) + F.embedding(i, w)
        fused.flush()
    assert reads == [] and [len(sites) for _, sites in runtime.STATE.asserts] == [1, 1, 1, 2, 2, 2]
    y.cpu()
    assert reads == [1] and runtime.STATE.asserts == []


def test_pending_checks_are_bounded_and_keep_the_first_failure(monkeypatch):
    monkeypatch.setattr(asserts, "MAX_PENDING", 4)
    w = torch.randn(10, 2, device="tpu")
    F.embedding(torch.tensor([11], device="tpu"), w)  # fails first
    for _ in range(9):
        F.embedding(torch.tensor([1], device="tpu"), w)
    assert len(runtime.STATE.assert_sites) <= 4
    with pytest.raises(DeviceAssertError, match="index out of range in self"):
        torch.tpu.synchronize()
    torch.tpu.synchronize()
