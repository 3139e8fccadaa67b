"""Scaled dot-product attention kept whole in compiled graphs: one op, `tputool::sdpa`, lowered to JAX.

PyTorch's math attention reaches a backend as ~15 ATen ops: a mask built from `ones().tril()`, the scaled
matmul, and a "safe" softmax (a compare, a reduce and a select per row, so fully masked rows give zeros).
`fuse_attention` rewrites Dynamo's `F.scaled_dot_product_attention` calls into `tputool::sdpa`, whose
backward is `tputool::sdpa_backward`. Their JAX lowerings:
- causal attention runs block by block over the query rows and skips the key blocks the mask hides
  entirely (4 row blocks: 37% fewer attention FLOPs, no mask tensor, no safe-softmax select: no causal
  row is ever fully masked);
- the backward is the VJP of that forward, recomputed from q, k, v: the [L, S] probabilities are not
  saved between forward and backward.
With a tuned config active (`runtime.STATE.sdpa_kernel`, e.g. the Pallas splash or flash kernel) the calls
the kernel can compute use it instead. Calls with dropout, a mask that needs a gradient, or inside autocast are left to PyTorch's decomposition.
The ops' own kernels (used wherever a graph is not lowered) compute the same math with torch ops (for
bf16/f16 inputs equal up to that dtype's rounding). Only calls whose q, k and v agree in batch and head
dims (or group heads by enable_gqa) are rewritten: broadcasting ones keep PyTorch's decomposition.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from tputool.backend.graph.attention_jax import attention_scale
from tputool.backend.graph.attention_kernels import sdpa_backward_lowering, sdpa_lowering
from tputool.backend.lowerings import lowering

# ---- the ops and their torch kernels --------------------------------------------------------------------


def _probs(query: Tensor, key: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None) -> Tensor:
    """softmax(q k^T * scale + mask) in float32, rows with every key masked set to zero (as PyTorch's math)."""
    s = torch.matmul(query.float(), key.float().transpose(-2, -1)) * attention_scale(query.shape[-1], scale)
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, -math.inf)
    elif attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.float()
    empty = torch.isneginf(s).all(-1, keepdim=True)
    return torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)


def _grouped(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> tuple[Tensor, Tensor]:
    """key/value repeated to the query's head count (grouped-query attention), as PyTorch's enable_gqa."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        return key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    return key, value


@torch.library.custom_op("tputool::sdpa", mutates_args=())
def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, is_causal: bool,
         scale: float | None, enable_gqa: bool) -> Tensor:
    """F.scaled_dot_product_attention without dropout, as one op."""
    k, v = _grouped(query, key, value, enable_gqa)
    p = _probs(query, k, attn_mask, is_causal, scale).to(v.dtype)  # as the JAX lowering: p in v's dtype
    return torch.matmul(p.float(), v.float()).to(query.dtype)


@sdpa.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


@torch.library.custom_op("tputool::sdpa_backward", mutates_args=())
def sdpa_backward(grad: Tensor, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
                  is_causal: bool, scale: float | None, enable_gqa: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of `sdpa` for query, key and value."""
    k, v = _grouped(query, key, value, enable_gqa)
    p = _probs(query, k, attn_mask, is_causal, scale)
    g = grad.float()
    dv = torch.matmul(p.transpose(-2, -1), g)
    dp = torch.matmul(g, v.float().transpose(-2, -1))
    ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * attention_scale(query.shape[-1], scale)
    dq = torch.matmul(ds, k.float())
    dk = torch.matmul(ds.transpose(-2, -1), query.float())
    if enable_gqa and k.shape != key.shape:  # sum the repeated heads back onto their key/value head
        rep = k.shape[-3] // key.shape[-3]
        dk = dk.unflatten(-3, (key.shape[-3], rep)).sum(-3)
        dv = dv.unflatten(-3, (key.shape[-3], rep)).sum(-3)
    return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)


@sdpa_backward.register_fake
def _sdpa_backward_fake(grad, query, key, value, attn_mask, is_causal, scale, enable_gqa):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup_context(ctx, inputs, output) -> None:
    query, key, value, attn_mask, is_causal, scale, enable_gqa = inputs
    ctx.save_for_backward(query, key, value, attn_mask)
    ctx.options = (is_causal, scale, enable_gqa)


def _backward(ctx, grad):
    query, key, value, attn_mask = ctx.saved_tensors
    dq, dk, dv = sdpa_backward(grad, query, key, value, attn_mask, *ctx.options)
    return dq, dk, dv, None, None, None, None


sdpa.register_autograd(_backward, setup_context=_setup_context)


# ---- JAX lowerings (graph/attention_jax.py; a tuned config's kernel from graph/attention_kernels.py) -----

lowering(torch.ops.tputool.sdpa.default)(sdpa_lowering)
lowering(torch.ops.tputool.sdpa_backward.default)(sdpa_backward_lowering)


# ---- the Dynamo-graph rewrite ---------------------------------------------------------------------------

SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
AUTOCAST_DEVICES = ("cpu", "cuda")
"""Device types (besides the PrivateUse1 one, `tpu` once registered) whose ambient autocast turns the rewrite off."""
SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


def _fusable(bound: dict) -> bool:
    """Whether a call's arguments are ones `tputool::sdpa` computes exactly like PyTorch."""
    if any(isinstance(bound[n], fx.Node) for n in ("dropout_p", "is_causal", "scale", "enable_gqa")):
        return False
    if bound["dropout_p"] != 0.0 or bound["enable_gqa"] not in (False, True):
        return False
    values = [bound[n].meta.get("example_value") for n in ("query", "key", "value") if isinstance(bound[n], fx.Node)]
    if len(values) != 3 or not all(isinstance(t, Tensor) and t.ndim >= 3 and not t.is_nested
                                   and not is_traceable_wrapper_subclass(t) for t in values):
        return False  # DTensor and other wrapper subclasses have no rule for the custom op
    q, k, v = values
    if not (q.ndim == k.ndim == v.ndim and q.shape[:-3] == k.shape[:-3] == v.shape[:-3]
            and k.shape[-3:-1] == v.shape[-3:-1] and q.shape[-1] == k.shape[-1]):
        return False  # broadcast batch dims: the op's output shape would be q's
    heads_q, heads_kv = q.shape[-3], k.shape[-3]
    if heads_q != heads_kv and not (bound["enable_gqa"] and heads_q % heads_kv == 0):
        return False
    mask = bound["attn_mask"]
    if mask is None:
        return True
    m = mask.meta.get("example_value") if isinstance(mask, fx.Node) else None
    return not bound["is_causal"] and isinstance(m, Tensor) and not m.requires_grad


def fuse_attention(gm: fx.GraphModule) -> int:
    """Rewrite the graph's supported F.scaled_dot_product_attention calls into `tputool::sdpa`; how many."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    devices = (*AUTOCAST_DEVICES, torch._C._get_privateuse1_backend_name())
    ambient = any(torch.is_autocast_enabled(d) for d in devices)
    if ambient or any("autocast" in getattr(n.target, "__name__", "") for n in nodes):
        return 0  # autocast casts attention's inputs; the custom op would not be cast
    done = 0
    for node in nodes:
        if node.target is not F.scaled_dot_product_attention or len(node.args) > len(SDPA_PARAMS):
            continue
        bound = {**SDPA_DEFAULTS, **dict(zip(SDPA_PARAMS, node.args, strict=False)), **node.kwargs}
        if set(bound) != set(SDPA_PARAMS) or not _fusable(bound):
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(torch.ops.tputool.sdpa.default, tuple(
                bound[n] for n in ("query", "key", "value", "attn_mask", "is_causal", "scale", "enable_gqa")))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.recompile()
    return done
