"""The tuner's lowering of `aten.scaled_dot_product_attention`: the attention implementation a candidate names
(plain, chunked, or the Pallas flash/splash kernels), all from `tputool/backend/graph/attention_kernels.py`,
the implementations compiled graphs use too.
"""

from __future__ import annotations

from collections.abc import Callable

from tputool.backend.graph.attention_kernels import attention, chunked_attention, plain_attention

__all__ = ["chunked_attention", "plain_attention", "sdpa"]


def sdpa(impl: str, block: int = 128) -> Callable:
    """A lowering of aten.scaled_dot_product_attention using implementation `impl` with `block`."""
    fn = attention(impl)

    def lowering(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if dropout_p:
            raise NotImplementedError("attention dropout is not supported by the tuner's attention lowering")
        return fn(q, k, v, attn_mask, is_causal, scale, block)

    return lowering
