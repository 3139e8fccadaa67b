"""The tuner's lowering of `aten.scaled_dot_product_attention`: the attention implementation a candidate names
(plain, chunked, or the Pallas flash/splash kernels), all from `tputool/backend/graph/attention_kernels.py`,
the implementations compiled graphs use too.

On a mesh, a Pallas kernel runs per device under `jax.shard_map` (XLA cannot partition a Mosaic kernel):
the batch split over the data x fsdp axes, the heads over `tensor` when it divides them.
"""

from __future__ import annotations

from collections.abc import Callable

from tputool.backend.graph.attention_kernels import KERNELS, attention, chunked_attention, plain_attention
from tputool.partition import BATCH_AXES

__all__ = ["chunked_attention", "per_device", "plain_attention", "sdpa"]

HEAD_AXIS = "tensor"


def per_device(fn: Callable, mesh) -> Callable:
    """`fn(q, k, v, mask, causal, scale, block)` (no mask) run per device of `mesh` under `jax.shard_map`."""
    import jax
    from jax.sharding import PartitionSpec as P

    def run(q, k, v, mask, causal, scale, block):
        t = mesh.shape.get(HEAD_AXIS, 1)
        heads = HEAD_AXIS if t > 1 and q.shape[1] % t == 0 and k.shape[1] % t == 0 else None
        spec = P(BATCH_AXES, heads, None, None)
        return jax.shard_map(lambda q, k, v: fn(q, k, v, mask, causal, scale, block), mesh=mesh,
                             in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(q, k, v)

    return run


def sdpa(impl: str, block: int = 128, mesh=None) -> Callable:
    """A lowering of aten.scaled_dot_product_attention using implementation `impl` with `block` (a Pallas
    kernel per device of `mesh`, when given)."""
    fn = attention(impl)
    if mesh is not None and impl in KERNELS:
        fn = per_device(fn, mesh)

    def lowering(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if dropout_p:
            raise NotImplementedError("attention dropout is not supported by the tuner's attention lowering")
        return fn(q, k, v, attn_mask, is_causal, scale, block)

    return lowering
