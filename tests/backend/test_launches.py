"""The backend's launch counter (`events.total("launch")`): device programs run, counted where they are run:
Strict's per-op kernels (and views' read kernels), Fused's flushes, compiled graphs' calls."""

from __future__ import annotations

import copy

import pytest
import torch

from tputool.backend import events

STRICT = "DEFER_NEVER"
FUSED = "DEFER_AND_FUSE"


@pytest.fixture
def dev(tpu_device: str) -> str:
    return tpu_device


def _launches(fn) -> int:
    n = events.total("launch")
    fn()
    return events.total("launch") - n


def test_strict_launches_one_kernel_per_op(dev: str) -> None:
    a, b = torch.randn(4, 4, device=dev), torch.randn(4, 4, device=dev)
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        for _ in range(3):  # the first call compiles and takes the general path, then the fast path
            assert _launches(lambda: ((a + b) * 2).relu()) == 3
        # a transposed operand is read through its view kernel first: two programs
        assert _launches(lambda: torch.add(a.t(), b)) == 2
        assert _launches(lambda: a.t()) == 0  # a view alone is metadata


def test_reset_zeroes_the_launch_counter(dev: str) -> None:
    torch.ones(3, device=dev).add_(1)
    torch.tpu.synchronize()
    assert events.total("launch") >= 1
    events.reset()
    assert events.total("launch") == 0


def test_compiled_graph_call_is_one_launch(dev: str) -> None:
    a = torch.randn(4, 4, device=dev)
    f = torch.compile(lambda x: (x * 2).sin() + 1, backend="tpu")
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_NEVER):  # (Fused mode defers the call into its trace)
        f(a)  # (compiles)
        assert _launches(lambda: f(a)) == 1


def _mlp_steps(dev: str, mode: str, steps: int = 4) -> tuple[list[int], list[float]]:
    """Launches and loss of each training step of a small MLP with AdamW in eager `mode`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    counts, losses = [], []
    with torch.tpu.eager_mode(getattr(torch.tpu.EagerMode, mode)):
        m = copy.deepcopy(model).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        xt, yt = x.to(dev), y.to(dev)
        for _ in range(steps):
            n = events.total("launch")
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(xt), yt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())  # the script's own sync point
            counts.append(events.total("launch") - n)
    return counts, losses


def test_fused_training_step_is_a_handful_of_launches_strict_one_per_op(dev: str) -> None:
    strict, strict_losses = _mlp_steps(dev, STRICT)
    fused, fused_losses = _mlp_steps(dev, FUSED)
    assert fused_losses == pytest.approx(strict_losses, rel=1e-5)
    assert all(n <= 10 for n in fused[1:]), fused  # a steady Fused step: a handful of programs
    assert all(n >= 40 for n in strict[1:]), strict  # Strict: forward, backward, clipping and AdamW op by op
    assert strict[-1] == strict[-2] and fused[-1] == fused[-2]  # the same count every steady step


def test_the_default_mode_runs_a_steady_llama_step_in_a_handful_of_launches(dev: str) -> None:
    """Issue 27's count: a steady training step of the built-in tiny Llama (AdamW, clipping, loss.item()) in
    the default eager mode, with no mode set by the script, launches at most 10 device programs."""
    from tputool.models.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig.tiny()
    model = Llama(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (2, 32)).to(dev)
    counts = []
    for _ in range(4):
        n = events.total("launch")
        opt.zero_grad(set_to_none=True)
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        counts.append(events.total("launch") - n)
    assert all(n <= 10 for n in counts[1:]), counts
