"""Attention kept whole in compiled graphs (tputool::sdpa): which calls are rewritten, compiled == CPU eager
(forward and grads) for causal / masked / grouped-query attention, and the ops' own torch kernels."""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from tputool.backend.graph import attention, attention_jax, install

SDPA = torch.ops.tputool.sdpa.default


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    install()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _rewritten_targets(fn, *args, ambient_autocast: bool = False) -> tuple[int, list]:
    """(calls fuse_attention rewrote, call_function targets after it) for the Dynamo graph of fn(*args)."""
    seen = {}

    def backend(gm, example_inputs):
        seen["n"] = attention.fuse_attention(gm)
        seen["targets"] = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        return gm.forward

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ambient_autocast):
        torch.compile(fn, backend=backend)(*args)
    return seen["n"], seen["targets"]


def _qkv(q_len: int, k_len: int, kv_heads: int = 4, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, q_len, 16, generator=g, dtype=dtype)
    k = torch.randn(2, kv_heads, k_len, 16, generator=g, dtype=dtype)
    v = torch.randn(2, kv_heads, k_len, 8, generator=g, dtype=dtype)
    return q, k, v


def test_causal_call_becomes_one_op() -> None:
    n, targets = _rewritten_targets(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                    *_qkv(8, 8))
    assert n == 1 and SDPA in targets and F.scaled_dot_product_attention not in targets


@pytest.mark.parametrize("case", ["dropout", "autocast", "ambient_autocast", "mask_needs_grad", "broadcast_batch",
                                  "broadcast_heads"])
def test_calls_the_op_cannot_match_are_left_to_pytorch(case: str) -> None:
    q, k, v = _qkv(8, 8)
    if case == "broadcast_batch":  # PyTorch broadcasts q's batch dim against k/v's
        q = q[:1]
    if case == "broadcast_heads":  # one k/v head broadcast to every query head, without enable_gqa
        k, v = k[:, :1], v[:, :1]
    mask = torch.randn(8, 8, requires_grad=True)

    def fn(q, k, v):
        if case == "dropout":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        if case in ("ambient_autocast", "broadcast_batch", "broadcast_heads"):
            return F.scaled_dot_product_attention(q, k, v)
        if case == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.scaled_dot_product_attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    n, targets = _rewritten_targets(fn, q, k, v, ambient_autocast=case == "ambient_autocast")
    assert n == 0 and SDPA not in targets


def _masks(q_len: int, k_len: int) -> dict:
    bool_mask = torch.rand(q_len, k_len, generator=torch.Generator().manual_seed(1)) > 0.5
    bool_mask[3] = False  # a row with every key masked: PyTorch gives zeros there
    float_mask = torch.randn(2, 1, q_len, k_len, generator=torch.Generator().manual_seed(2))
    float_mask[:, :, 5] = -math.inf
    return {"bool": bool_mask, "float": float_mask}


CASES = {
    "causal": (128, 128, 4, {"is_causal": True}),
    "causal_more_keys": (100, 130, 4, {"is_causal": True}),
    "causal_more_queries": (130, 70, 4, {"is_causal": True}),
    "causal_gqa_scale": (64, 64, 2, {"is_causal": True, "enable_gqa": True, "scale": 0.3}),
    "bool_mask": (64, 48, 4, {"mask": "bool"}),
    "float_mask": (64, 48, 4, {"mask": "float"}),
    "plain": (64, 48, 4, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_attention_matches_cpu_eager(case: str, dev: str, monkeypatch) -> None:
    q_len, k_len, kv_heads, kw = CASES[case]
    kw = dict(kw)
    mask = _masks(q_len, k_len)[kw.pop("mask")] if "mask" in kw else None
    q, k, v = _qkv(q_len, k_len, kv_heads)

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)

    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = fn(*ref_in, mask)
    ref.backward(torch.cos(ref.detach()))
    rewritten = []
    real = attention.fuse_attention
    monkeypatch.setattr(attention, "fuse_attention", lambda gm: rewritten.append(real(gm)) or rewritten[-1])
    got_in = [t.to(dev).requires_grad_() for t in (q, k, v)]
    got = torch.compile(fn, backend="tpu")(*got_in, None if mask is None else mask.to(dev))
    got.backward(torch.cos(got.detach()))
    assert rewritten == [1]  # the result below is tputool::sdpa's, not PyTorch's decomposition

    torch.testing.assert_close(got.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-5)
    for a, b in zip(got_in, ref_in, strict=True):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5)


def test_low_precision_inputs_keep_their_dtype(dev: str) -> None:
    q, k, v = _qkv(64, 64, dtype=torch.bfloat16)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    got = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                        backend="tpu")(q.to(dev), k.to(dev), v.to(dev))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu().float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", ["causal", "causal_more_keys", "causal_more_queries", "causal_gqa_scale",
                                  "bool_mask", "float_mask"])
def test_the_ops_torch_kernels_match_pytorch(case: str) -> None:
    q_len, k_len, kv_heads, kw = CASES[case]
    mask = _masks(q_len, k_len)[kw["mask"]] if "mask" in kw else None
    causal, scale, gqa = kw.get("is_causal", False), kw.get("scale"), kw.get("enable_gqa", False)
    q, k, v = _qkv(q_len, k_len, kv_heads)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_in, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
    got_in = [t.clone().requires_grad_() for t in (q, k, v)]
    got = attention.sdpa(*got_in, mask, causal, scale, gqa)  # the custom op run eagerly
    grad = torch.cos(ref.detach())
    ref.backward(grad)
    got.backward(grad)
    torch.testing.assert_close(got.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(got_in, ref_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 7, 32, 100, 128, 256, 1000])
def test_causal_row_blocks_cover_every_row_once(rows: int) -> None:
    blocks = attention_jax.causal_row_blocks(rows)
    assert blocks[0][0] == 0 and blocks[-1][1] == rows
    assert all(a < b for a, b in blocks)
    assert all(b == c for (_, b), (c, _) in zip(blocks, blocks[1:], strict=False))
    assert len(blocks) <= attention_jax.CAUSAL_ROW_BLOCKS
    if rows >= attention_jax.CAUSAL_ROW_BLOCKS * attention_jax.CAUSAL_MIN_BLOCK_ROWS:
        assert len(blocks) == attention_jax.CAUSAL_ROW_BLOCKS


@pytest.mark.parametrize("case", ["causal_gqa_scale", "bool_mask", "plain"])
def test_the_ops_pass_torch_library_opcheck(case: str) -> None:
    """Schema, fake kernels (shapes and strides of transposed inputs), autograd registration."""
    q_len, k_len, kv_heads, kw = CASES[case]
    mask = _masks(q_len, k_len)[kw["mask"]] if "mask" in kw else None
    causal, scale, gqa = kw.get("is_causal", False), kw.get("scale"), kw.get("enable_gqa", False)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in _qkv(q_len, k_len, kv_heads))
    torch.library.opcheck(SDPA, (q, k, v, mask, causal, scale, gqa))
    grad = torch.randn(*q.shape[:-1], v.shape[-1])
    torch.library.opcheck(torch.ops.tputool.sdpa_backward.default,
                          (grad, q.detach(), k.detach(), v.detach(), mask, causal, scale, gqa))
