"""Matrix-product lowerings (mm, addmm, bmm, baddbmm, mv, dot, ...), under JAX's default matmul precision."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tputool.backend.lowerings import lowering
from tputool.backend.lowerings._util import KIND, cast, promote

aten = torch.ops.aten


def _mm_dtype(*xs):
    comp, res = promote(KIND.DEFAULT, *xs)
    return res


def _matmul(a, b, res):
    acc = jnp.float32 if res in (jnp.bfloat16, jnp.float16) else None
    return jnp.matmul(a, b, preferred_element_type=acc).astype(res)


def _scale(x, s):
    if isinstance(s, int | float) and s == 1:
        return x
    return x * s


@lowering(aten.mm.default, aten.bmm.default, aten.matmul.default)
def mm(self, mat2):
    res = _mm_dtype(self, mat2)
    return _matmul(cast(self, res), cast(mat2, res), res)


@lowering(aten.mv.default)
def mv(self, vec):
    res = _mm_dtype(self, vec)
    return _matmul(cast(self, res), cast(vec, res), res)


@lowering(aten.dot.default, aten.vdot.default)
def dot(self, tensor):
    res = _mm_dtype(self, tensor)
    return _matmul(cast(self, res), cast(tensor, res), res)


def _addmm_like(self, m1, m2, beta, alpha):
    res = _mm_dtype(self, m1, m2)
    prod = _matmul(cast(m1, res), cast(m2, res), res)
    if isinstance(beta, int | float) and beta == 0:
        return _scale(prod, alpha).astype(res)
    return (_scale(cast(self, res), beta) + _scale(prod, alpha)).astype(res)


@lowering(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _addmm_like(self, mat1, mat2, beta, alpha)


@lowering(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    res = _mm_dtype(self, batch1, batch2)
    prod = jnp.sum(_matmul(cast(batch1, res), cast(batch2, res), res), axis=0)
    if isinstance(beta, int | float) and beta == 0:
        return _scale(prod, alpha).astype(res)
    return (_scale(cast(self, res), beta) + _scale(prod, alpha)).astype(res)


@lowering(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    res = _mm_dtype(self, vec1, vec2)
    prod = jnp.outer(cast(vec1, res), cast(vec2, res))
    if isinstance(beta, int | float) and beta == 0:
        return _scale(prod, alpha).astype(res)
    return (_scale(cast(self, res), beta) + _scale(prod, alpha)).astype(res)


# ---- decompositions and solvers with a unique answer (SVD/eigh are left to the CPU: sign conventions) ----

@lowering(aten.linalg_solve_triangular.default)
def solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    import jax.scipy.linalg as jsl

    if left:
        return jsl.solve_triangular(self, B, lower=not upper, unit_diagonal=unitriangular)
    # X A = B  <=>  A^T X^T = B^T
    xt = jsl.solve_triangular(jnp.swapaxes(self, -1, -2), jnp.swapaxes(B, -1, -2), lower=upper,
                              unit_diagonal=unitriangular)
    return jnp.swapaxes(xt, -1, -2)


@lowering(aten.linalg_inv_ex.default)
def inv_ex(A, *, check_errors=False):
    inv = jnp.linalg.inv(A)
    info = jnp.where(jnp.all(jnp.isfinite(inv), axis=(-2, -1)), 0, 1).astype(jnp.int32)
    return inv, info


@lowering(aten.linalg_cholesky_ex.default)
def cholesky_ex(self, *, upper=False, check_errors=False):
    L = jnp.linalg.cholesky(self)
    info = jnp.where(jnp.all(jnp.isfinite(L), axis=(-2, -1)), 0, 1).astype(jnp.int32)
    L = jnp.where(jnp.isfinite(L), L, 0)
    return (jnp.swapaxes(L, -1, -2).conj() if upper else L), info


@lowering(aten.linalg_qr.default)
def qr(A, mode="reduced"):
    q, r = jnp.linalg.qr(A, mode="complete" if mode == "complete" else "reduced")
    if mode == "r":
        return jnp.zeros((0,), A.dtype), r
    return q, r


@lowering(aten._cdist_forward.default)
def cdist(x1, x2, p, compute_mode):
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, -1))
    if p == 0:
        return jnp.sum((diff != 0).astype(x1.dtype), -1)
    if p == float("inf"):
        return jnp.max(jnp.abs(diff), -1)
    return jnp.sum(jnp.abs(diff) ** p, -1) ** (1.0 / p)
