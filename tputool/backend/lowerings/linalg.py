"""Linear algebra lowerings: matrix products (mm, addmm, bmm, baddbmm, mv, dot, ...) under JAX's default matmul
precision, and factorizations and solvers (LU, determinants, Cholesky, triangular, QR reflectors)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tputool.backend.lowerings import Unsupported, lowering
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


@lowering(aten._grouped_mm.default)
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """A mixture of experts' grouped product: rows [offs[g-1], offs[g]) of `self` (M, K) times `mat2[g]` (K, N),
    as `jax.lax.ragged_dot` (rows past offs[-1], which torch leaves unwritten, are zeros). Other operand ranks
    (a backward's) and a bias run through the CPU fallback."""
    if self.ndim != 2 or mat2.ndim != 3 or offs is None or bias is not None:
        raise Unsupported("_grouped_mm is lowered for a (M, K) input, (G, K, N) weights and offsets only")
    from tputool.backend import dtypes

    res = self.dtype if out_dtype is None else dtypes.to_np(out_dtype)
    acc = jnp.float32 if self.dtype in (jnp.bfloat16, jnp.float16) else None
    sizes = jnp.diff(offs.astype(jnp.int32), prepend=0)
    return jax.lax.ragged_dot(self, mat2.astype(self.dtype), sizes, preferred_element_type=acc).astype(res)


@lowering(aten._scaled_mm.default)
def scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """A float8 matmul (torchao's and nanochat's Float8Linear): the float8 operands multiplied exactly with float32
    accumulation, then times the tensor-wise or row-wise scales (M, 1) and (1, N), plus `bias`, in `out_dtype`.
    A float8 result (`scale_result`) runs through the CPU fallback."""
    from tputool.backend import dtypes

    res = self.dtype if out_dtype is None else dtypes.to_np(out_dtype)
    if scale_result is not None or jnp.dtype(res).itemsize == 1:
        raise Unsupported("_scaled_mm is lowered for a result wider than float8 only")
    f32 = jnp.float32
    out = jnp.matmul(self, mat2, preferred_element_type=f32) * scale_a.astype(f32) * scale_b.astype(f32)
    if bias is not None:
        out = out + bias.astype(f32)
    return out.astype(res)


@lowering(aten.mv.default)
def mv(self, vec):
    res = _mm_dtype(self, vec)
    return _matmul(cast(self, res), cast(vec, res), res)


@lowering(aten.dot.default)
def dot(self, tensor):
    res = _mm_dtype(self, tensor)
    return _matmul(cast(self, res), cast(tensor, res), res)


@lowering(aten.vdot.default)
def vdot(self, other):
    return dot(jnp.conj(self), other)


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


# ---- decompositions and solvers with a unique answer (SVD/eigh vectors are left to the CPU: sign conventions) ----

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


# ---- LU, determinants, solvers, Cholesky helpers, QR reflectors, matrix exponential -------------------------
# LU factors and pivots are LAPACK's (partial pivoting; pivots 1-based int32). Ops whose errors PyTorch raises
# from the data (check_errors=True, LU without pivoting) go to the CPU (`Unsupported`). SVD with U/V and eigh
# with eigenvectors stay there too (sign conventions); their values-only forms are lowered.

def _lu(A):
    lu, piv, perm = jax.lax.linalg.lu(A)
    return lu, (piv + 1).astype(jnp.int32), perm


def _lu_info(lu):
    d = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = d == 0
    return jnp.where(jnp.any(zero, -1), jnp.argmax(zero, -1) + 1, 0).astype(jnp.int32)


def _perm(pivots, m: int):
    return jax.lax.linalg.lu_pivots_to_permutation(pivots - 1, m)


def _bcast_batch(*xs):
    batch = jnp.broadcast_shapes(*(x.shape[:-2] for x in xs))
    return [jnp.broadcast_to(x, batch + x.shape[-2:]) for x in xs]


def _lu_solve(LU, pivots, B, left=True, adjoint=False):
    res = _mm_dtype(LU, B)
    LU, B = cast(LU, res), cast(B, res)
    if not left:  # X A = B  <=>  A^H X^H = B^H
        return _mh(_lu_solve(LU, pivots, _mh(B), True, not adjoint))
    n = LU.shape[-1]
    batch = jnp.broadcast_shapes(LU.shape[:-2], pivots.shape[:-1], B.shape[:-2])
    LU = jnp.broadcast_to(LU, batch + LU.shape[-2:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:])
    perm = jnp.broadcast_to(_perm(pivots, n), batch + (n,))
    solve = jax.lax.linalg.triangular_solve
    if not adjoint:  # A = P L U: X = U^-1 L^-1 P^T B
        y = jnp.take_along_axis(B, perm[..., None], axis=-2)
        y = solve(LU, y, left_side=True, lower=True, unit_diagonal=True)
        return solve(LU, y, left_side=True, lower=False)
    y = solve(LU, B, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    y = solve(LU, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True)
    return jnp.take_along_axis(y, jnp.argsort(perm, axis=-1)[..., None], axis=-2)


def _mh(x):
    return jnp.swapaxes(x, -1, -2).conj()


@lowering(aten.linalg_lu_factor_ex.default)
def lu_factor_ex(A, *, pivot=True, check_errors=False):
    if not pivot or check_errors:
        raise Unsupported("linalg_lu_factor_ex: pivot=False / check_errors=True")
    lu, piv, _ = _lu(A)
    return lu, piv, _lu_info(lu)


@lowering(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    empty = jnp.zeros((0,), LU_data.dtype)
    if unpack_data:
        L = jnp.tril(LU_data[..., :, :k], -1) + jnp.eye(m, k, dtype=LU_data.dtype)
        U = jnp.triu(LU_data[..., :k, :])
    else:
        L = U = empty
    if unpack_pivots:
        perm = _perm(LU_pivots, m)  # A[perm] = L U, so A = P L U with P[perm[i], i] = 1
        P = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=LU_data.dtype), -1, -2)
    else:
        P = empty
    return P, L, U


@lowering(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
    if not pivot:
        raise Unsupported("linalg_lu: pivot=False")
    lu, piv, _ = _lu(A)
    return lu_unpack(lu, piv)


@lowering(aten.linalg_lu_solve.default)
def lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    return _lu_solve(LU, pivots, B, left, adjoint)


def _perm_sign(pivots, dtype):
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), -1)
    return jnp.where(swaps % 2 == 0, 1, -1).astype(dtype)


def _det_lu(A):
    """LU of A^T for a real A, of A for a complex one: what PyTorch's det/slogdet return for a contiguous A,
    and what their backward formulas then expect (for a non-contiguous A they expect A's)."""
    return _lu(A if jnp.iscomplexobj(A) else jnp.swapaxes(A, -1, -2))


# _linalg_det / _linalg_slogdet: not in the table, as the LU they return depends on A's layout, which only
# eager dispatch sees (storage_kernels runs these with a non-contiguous real A transposed); traced executors
# would hand a graph's backward the wrong factors for a view.

def det(A):
    """aten._linalg_det on a JAX value: (det, LU, pivots), the LU of `_det_lu`."""
    lu, piv, _ = _det_lu(A)
    d = jnp.prod(jnp.diagonal(lu, axis1=-2, axis2=-1), -1)
    return d * _perm_sign(piv, d.dtype), lu, piv


def slogdet(A):
    """aten._linalg_slogdet on a JAX value: (sign, logabsdet, LU, pivots), the LU of `_det_lu`."""
    lu, piv, _ = _det_lu(A)
    d = jnp.diagonal(lu, axis1=-2, axis2=-1)
    a = jnp.abs(d)
    unit = jnp.where(a == 0, 0, d / jnp.where(a == 0, 1, a))
    sign = jnp.prod(unit, -1) * _perm_sign(piv, d.dtype)
    return sign, jnp.sum(jnp.log(a), -1), lu, piv


@lowering(aten._linalg_solve_ex.default)
def solve_ex(A, B, *, left=True, check_errors=False):
    if check_errors:
        raise Unsupported("_linalg_solve_ex: check_errors=True")
    lu, piv, _ = _lu(A)
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    b = (B[..., :, None] if left else B[..., None, :]) if vector else B
    x = _lu_solve(lu, piv, b, left)
    if vector:
        x = x[..., 0] if left else x[..., 0, :]
    return x, lu, piv, _lu_info(lu)


@lowering(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    res = _mm_dtype(self, A)
    B, A = _bcast_batch(cast(self, res), cast(A, res))
    x = jax.lax.linalg.triangular_solve(A, B, left_side=True, lower=not upper, transpose_a=transpose,
                                        unit_diagonal=unitriangular)
    return x, A


@lowering(aten.cholesky.default)
def cholesky(self, upper=False):
    L = jnp.linalg.cholesky(self)
    return _mh(L) if upper else L


def _cholesky_solve(B, L, upper):
    solve = jax.lax.linalg.triangular_solve
    if upper:  # A = U^H U
        y = solve(L, B, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
        return solve(L, y, left_side=True, lower=False)
    y = solve(L, B, left_side=True, lower=True)
    return solve(L, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lowering(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(self, A, upper):
    B, L = _bcast_batch(self, A)
    return _cholesky_solve(B, L, upper)


@lowering(aten.cholesky_inverse.default)
def cholesky_inverse(self, upper=False):
    n = self.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=self.dtype), self.shape)
    return _cholesky_solve(eye, self, upper)


@lowering(aten.linalg_householder_product.default)
def householder_product(input, tau):  # noqa: A002 - ATen's argument name
    return jax.lax.linalg.householder_product(input, tau)


@lowering(aten.geqrf.default)
def geqrf(self):
    h, tau = jnp.linalg.qr(self, mode="raw")
    return jnp.swapaxes(h, -1, -2), tau


@lowering(aten.ormqr.default)
def ormqr(self, input2, input3, left=True, transpose=False):
    return jax.lax.linalg.ormqr(self, input2, input3, left=left, transpose=transpose)


@lowering(aten._linalg_svd.default)
def svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if compute_uv:
        raise Unsupported("_linalg_svd: U and V (sign conventions differ from LAPACK's)")
    empty = jnp.zeros((0,), A.dtype)
    return empty, jnp.linalg.svd(A, compute_uv=False), empty


@lowering(aten._linalg_eigh.default)
def eigh(A, UPLO="L", compute_v=True):
    if compute_v:
        raise Unsupported("_linalg_eigh: eigenvectors (sign conventions differ from LAPACK's)")
    return jnp.linalg.eigvalsh(A, UPLO=UPLO), jnp.zeros((0,), A.dtype)
