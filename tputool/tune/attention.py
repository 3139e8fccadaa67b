"""The tuner's lowering of `aten.scaled_dot_product_attention`: the attention implementation a candidate names
(plain, chunked, or the Pallas flash/splash kernels), all from `tputool/backend/graph/attention_kernels.py`,
the implementations compiled graphs use too.

On a mesh, a Pallas kernel runs per device under `jax.shard_map` (XLA cannot partition a Mosaic kernel):
the batch split over the data x fsdp axes, the heads over `tensor` where it divides them.
"""

from __future__ import annotations

from collections.abc import Callable

from tputool.backend.graph.attention_kernels import (
    KERNELS,
    attention,
    chunked_attention,
    per_device,
    plain_attention,
)
from tputool.partition import BATCH_AXES

__all__ = ["chunked_attention", "plain_attention", "sdpa"]

def sdpa(impl: str, block: int = 128, mesh=None) -> Callable:
    """A lowering of aten.scaled_dot_product_attention using implementation `impl` with `block` (a Pallas
    kernel per device of `mesh`, when given)."""
    fn = attention(impl)
    if mesh is not None and impl in KERNELS:
        fn = per_device(fn, mesh, BATCH_AXES, "tensor")

    def lowering(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if dropout_p:
            raise NotImplementedError("attention dropout is not supported by the tuner's attention lowering")
        return fn(q, k, v, attn_mask, is_causal, scale, block)

    return lowering
