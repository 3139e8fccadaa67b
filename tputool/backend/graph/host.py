"""Host-side conversions between CPU torch tensors and JAX arrays (through numpy), and the dtype table.

Used for graph constants held on the CPU and by tests that run lowered graphs without the `tpu` device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

TORCH_TO_JAX_DTYPE: dict[torch.dtype, jnp.dtype] = {
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int64: jnp.dtype(jnp.int64),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.bool: jnp.dtype(jnp.bool_),
    torch.complex64: jnp.dtype(jnp.complex64),
}
"""torch dtype -> the JAX dtype holding the same values."""

JAX_TO_TORCH_DTYPE: dict[jnp.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX_DTYPE.items()}


def cpu_to_jax(t: torch.Tensor) -> jax.Array:
    """A JAX array with the values of CPU tensor `t` (bfloat16 goes through its bit pattern)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return jnp.asarray(t.numpy())


def jax_to_cpu(a: jax.Array) -> torch.Tensor:
    """A CPU tensor with the values of JAX array `a`."""
    arr = np.asarray(a)
    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())
