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
