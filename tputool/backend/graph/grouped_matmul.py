"""Grouped matmul implementations over JAX arrays: the one place `torch.tpu.ops.grouped_matmul`, the MoE layer
and the tuner get them from.

The contract (jax.lax.ragged_dot's): `lhs` (m, k) holds consecutive row groups of `group_sizes` (g,) rows
(their total at most m); group i is multiplied by `rhs[i]` (g, k, n); the result is (m, n) in lhs's dtype
and rows past the groups' total are zero. Implementations by name:

- `ragged`: `jax.lax.ragged_dot` (plain XLA; its VJP is XLA's);
- `gmm`: JAX's Pallas TPU megablox kernels: forward `gmm`, lhs gradient `gmm` against the transposed rhs,
  rhs gradient `tgmm`. Natively on a TPU (or inside `attention_kernels.for_tpu_target()`), in Pallas'
  interpret mode elsewhere (slow: for checking). Megablox leaves rows past the groups' total unwritten, so
  they are zeroed here (forward and lhs gradient).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import jax
import jax.numpy as jnp

from tputool.backend.graph.attention_kernels import interpret, kernel_scope

IMPLS = ("ragged", "gmm")
"""Grouped matmul implementations by name (`torch.tpu.ops.grouped_matmul`'s `impl`, the MoE `dispatch`)."""

KERNELS = ("gmm",)
"""The implementations that are Pallas kernels."""

_ROW_TILES = (128, 64, 32, 16, 8)
_LANES = 128


def default_tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
    """Megablox (tm, tk, tn) for an (m, k) x (k, n) problem: the largest row tile of 128..8 dividing m (else m);
    128-wide k and n tiles, or the whole dimension where it is smaller."""
    tm = next((t for t in _ROW_TILES if m % t == 0), m)
    return tm, min(k, _LANES), min(n, _LANES)


def ragged(lhs, rhs, group_sizes):
    """The grouped matmul through `jax.lax.ragged_dot`."""
    dtype = jnp.result_type(lhs.dtype, rhs.dtype)
    return jax.lax.ragged_dot(lhs.astype(dtype), rhs.astype(dtype), group_sizes.astype(jnp.int32))


def _valid_rows(out, group_sizes):
    """`out` with the rows past the groups' total set to zero."""
    rows = jnp.arange(out.shape[0], dtype=jnp.int32)
    keep = rows < jnp.sum(group_sizes)
    return jnp.where(keep[:, None], out, jnp.zeros((), out.dtype))


@functools.lru_cache(maxsize=8)
def _megablox(interpret_mode: bool) -> Callable:
    """The megablox grouped matmul with its gmm/tgmm VJP, for one interpret setting."""
    # the kernels' module (the package's `gmm` attribute is the function with megablox's own VJP)
    mb = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

    def forward(lhs, rhs, sizes):
        with kernel_scope(False):
            out = mb.gmm(lhs, rhs, sizes, lhs.dtype, default_tiling, interpret=interpret_mode)
        return _valid_rows(out, sizes)

    @jax.custom_vjp
    def run(lhs, rhs, sizes):
        return forward(lhs, rhs, sizes)

    def fwd(lhs, rhs, sizes):
        return forward(lhs, rhs, sizes), (lhs, rhs, sizes)

    def bwd(res, grad):
        lhs, rhs, sizes = res
        grad = grad.astype(lhs.dtype)
        with kernel_scope(False):
            d_lhs = mb.gmm(grad, rhs, sizes, lhs.dtype, default_tiling, transpose_rhs=True,
                           interpret=interpret_mode)
            d_rhs = mb.tgmm(lhs.swapaxes(0, 1), grad, sizes, rhs.dtype, default_tiling,
                            num_actual_groups=rhs.shape[0], interpret=interpret_mode)
        return _valid_rows(d_lhs, sizes), d_rhs, None

    run.defvjp(fwd, bwd)
    return run


def megablox(lhs, rhs, group_sizes):
    """The grouped matmul through JAX's Pallas megablox kernels (gmm; tgmm for the rhs gradient)."""
    dtype = jnp.result_type(lhs.dtype, rhs.dtype)
    return _megablox(interpret())(lhs.astype(dtype), rhs.astype(dtype), group_sizes.astype(jnp.int32))


_BY_NAME: dict[str, Callable] = {"ragged": ragged, "gmm": megablox}


def grouped_matmul(impl: str) -> Callable:
    """The implementation named `impl`: `fn(lhs, rhs, group_sizes) -> (m, n)`."""
    try:
        return _BY_NAME[impl]
    except KeyError:
        raise ValueError(f"unknown grouped matmul implementation {impl!r} (one of {', '.join(IMPLS)})") from None


def run(lhs, rhs, group_sizes, *, impl: str):
    """`grouped_matmul(impl)(lhs, rhs, group_sizes)`: the function `torch.tpu.ops.grouped_matmul` hands jax_op
    (one module-level function, so its compiled forms are cached per `impl`)."""
    return _BY_NAME[impl](lhs, rhs, group_sizes)
