"""Hugging Face Accelerate on tpu: `Accelerator()` places on the tpu device, and `mixed_precision="bf16"` autocasts
the prepared model's forward and `accelerator.autocast()` there, as it does on CUDA (held against the same
Accelerator on CPU: the same dtypes inside the forward, outputs converted back to float32 by Accelerate)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
accelerate = pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")


def _reset() -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # (one Accelerator state per process otherwise)


@pytest.fixture(autouse=True)
def _fresh_state():
    _reset()
    yield
    _reset()


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.inner: list[torch.dtype] = []

    def forward(self, x):
        h = torch.relu(self.a(x))
        self.inner.append(h.dtype)
        return self.b(h)


def _run(cpu: bool) -> dict:
    from accelerate import Accelerator

    _reset()
    acc = Accelerator(mixed_precision="bf16", cpu=cpu)
    torch.manual_seed(0)
    net = _Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net, opt = acc.prepare(net, opt)
    x = torch.randn(3, 8, device=acc.device)
    y = net(x)
    acc.backward(y.float().pow(2).mean())
    opt.step()
    with acc.autocast():
        inside = torch.nn.Linear(8, 2).to(acc.device)(x).dtype
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    model = acc.prepare(transformers.GPT2LMHeadModel(cfg))
    logits = []
    model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, i, o: logits.append(o.dtype))
    model(torch.randint(0, 64, (1, 8), device=acc.device))
    return {"device": acc.device.type, "native_amp": acc.native_amp, "inner": net.inner[0], "out": y.dtype,
            "autocast": inside, "hf_inner": logits[0], "param": next(net.parameters()).device.type}


def test_bf16_mixed_precision_autocasts_on_tpu_as_elsewhere():
    tpu = _run(cpu=False)
    assert tpu["device"] == tpu["param"] == "tpu"
    assert tpu["inner"] == tpu["autocast"] == tpu["hf_inner"] == torch.bfloat16
    cpu = _run(cpu=True)
    assert {k: v for k, v in tpu.items() if k not in ("device", "param")} == \
        {k: v for k, v in cpu.items() if k not in ("device", "param")}


def test_an_accelerate_that_does_not_know_tpu_is_refused_when_it_would_pick_the_cpu(monkeypatch):
    import types

    from tputool.backend import hf_accelerate

    class PartialState:  # what accelerate < 1.16 has: CUDA, else the CPU
        @property
        def default_device(self):
            return torch.device("cpu")

    mod = types.SimpleNamespace(PartialState=PartialState)
    monkeypatch.setattr(accelerate, "__version__", "1.15.0")
    hf_accelerate._patch(mod)
    with pytest.raises(RuntimeError, match=r"accelerate 1.15.0 does not know the tpu device.*accelerate>=1.16"):
        PartialState().default_device  # noqa: B018
    monkeypatch.setattr(accelerate, "__version__", "1.16.0")

    class Newer:
        default_device = property(lambda self: torch.device("cpu"))

    hf_accelerate._patch(types.SimpleNamespace(PartialState=Newer))
    assert Newer().default_device == torch.device("cpu")  # (not this module's to judge: left as it is)
