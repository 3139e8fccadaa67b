"""Built-in models on CPU: shapes, loss goes down on a fixed batch, determinism, config overrides."""

from __future__ import annotations

import pytest
import torch

from tputool.errors import UserError
from tputool.models import MODELS, build_model
from tputool.models.llama import Llama, LlamaConfig
from tputool.models.moe import MoEConfig, MoEFeedForward

EXPECTED_OUT = {"mlp": (4, 10), "cnn": (4, 10), "vit": (4, 10), "llama": (4, 32, 256), "moe": (4, 32, 256)}


def _build(name: str, seed: int = 0):
    spec = MODELS[name]
    cfg = spec.config()
    torch.manual_seed(seed)
    model = spec.build(cfg)
    batch = spec.example_batch(cfg, 4, "cpu", torch.Generator().manual_seed(seed))
    return spec, model, batch


def test_registry_names() -> None:
    assert set(MODELS) == {"mlp", "cnn", "llama", "moe", "vit"}
    assert all(spec.name == name for name, spec in MODELS.items())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_shape_and_finite_loss(name: str) -> None:
    spec, model, (x, y) = _build(name)
    out = model(x)
    assert tuple(out.shape) == EXPECTED_OUT[name]
    loss = spec.loss_fn(out, y)
    assert loss.ndim == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_loss_decreases_on_fixed_batch(name: str) -> None:
    spec, model, (x, y) = _build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = spec.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("name", sorted(MODELS))
def test_deterministic_under_manual_seed(name: str) -> None:
    _, m1, (x1, y1) = _build(name, seed=3)
    _, m2, (x2, y2) = _build(name, seed=3)
    _, m3, _ = _build(name, seed=4)
    s1, s2, s3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert not all(torch.equal(s1[k], s3[k]) for k in s1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_build_model_overrides_and_errors() -> None:
    model = build_model("mlp", in_dim=5, hidden=(7,), num_classes=3)
    assert tuple(model(torch.randn(2, 5)).shape) == (2, 3)
    with pytest.raises(UserError, match="no config field widht"):
        build_model("mlp", widht=3)
    with pytest.raises(UserError, match="unknown model 'gpt9'"):
        build_model("gpt9")


def test_llama_is_causal() -> None:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    tokens = torch.randint(0, 256, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 256
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_llama_tied_and_untied_head() -> None:
    tied = Llama(LlamaConfig(tie_embeddings=True))
    untied = Llama(LlamaConfig(tie_embeddings=False))
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.head.weight is not untied.tok_emb.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_untied = sum(p.numel() for p in untied.parameters())
    assert n_untied - n_tied == 256 * 64


def test_llama_gqa_and_mha_and_length_check() -> None:
    for kv in (1, 2, 4):
        model = Llama(LlamaConfig(n_kv_heads=kv))
        assert model.layers[0].attn.wk.out_features == kv * 16
        assert tuple(model(torch.zeros(2, 8, dtype=torch.long)).shape) == (2, 8, 256)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="n_kv_heads"):
        Llama(LlamaConfig(n_kv_heads=3))


def test_moe_gates_are_top_k_and_normalised() -> None:
    torch.manual_seed(0)
    layer = MoEFeedForward(dim=16, ffn_dim=8, n_experts=5, top_k=2)
    g = layer.gates(torch.randn(3, 7, 16))
    assert tuple(g.shape) == (3, 7, 5)
    assert torch.all((g > 0).sum(-1) == 2)
    torch.testing.assert_close(g.sum(-1), torch.ones(3, 7))
    assert tuple(layer(torch.randn(3, 7, 16)).shape) == (3, 7, 16)


def test_moe_experts_get_gradients() -> None:
    spec, model, (x, y) = _build("moe")
    spec.loss_fn(model(x), y).backward()
    moe_layer = model.layers[0].ffn
    assert isinstance(moe_layer, MoEFeedForward) and isinstance(spec.config(), MoEConfig)
    assert moe_layer.w1.grad is not None and moe_layer.router.weight.grad.abs().sum() > 0


def test_llama_head_stays_tied_across_device_moves() -> None:
    # meta, like PrivateUse1 devices, cannot shallow-copy CPU tensors, so nn.Module._apply replaces parameters
    model = Llama(LlamaConfig(tie_embeddings=True)).to("meta")
    assert model.head.weight is model.tok_emb.weight
    assert model.head.weight.device.type == "meta"
