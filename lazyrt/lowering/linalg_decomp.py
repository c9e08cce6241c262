"""Matrix factorizations and the solvers built on them (LAPACK semantics of
PyTorch's CPU kernels: 1-based int32 pivots, ``info`` outputs, empty tensors for
outputs that were not asked for)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._registry import aten, lower
from ._util import matmul_precision

_EMPTY = (0,)


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _mm(a, b):
    return jnp.matmul(a, b, precision=matmul_precision())


def _bcast_batch(a, b):
    """Broadcast the batch dims of two matrices (stacks)."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return (jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:]))


def _empty(dtype):
    return jnp.zeros(_EMPTY, dtype)


def _lu(a):
    """LU with partial pivoting: (LU, 1-based int32 pivots, info, 0-based permutation)."""
    m, n = a.shape[-2:]
    k = min(m, n)
    if a.size == 0:
        batch = a.shape[:-2]
        return (a, jnp.ones(batch + (k,), jnp.int32) * jnp.arange(1, k + 1, dtype=jnp.int32),
                jnp.zeros(batch, jnp.int32), jnp.broadcast_to(jnp.arange(m), batch + (m,)))
    lu, piv, perm = lax.linalg.lu(a)
    d = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = d == 0
    info = jnp.where(jnp.any(zero, -1), jnp.argmax(zero, -1) + 1, 0).astype(jnp.int32)
    return lu, (piv + 1).astype(jnp.int32), info, perm


def _perm_from_pivots(piv, m):
    """1-based LAPACK pivots -> 0-based permutation p with A[p] = L @ U."""
    if piv.shape[-1] == 0:
        return jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), piv.shape[:-1] + (m,))
    return lax.linalg.lu_pivots_to_permutation(piv.astype(jnp.int32) - 1, m)


def _perm_matrix(perm, m, dtype):
    # P with A = P @ L @ U, i.e. P[perm[i], i] = 1
    return _mT(jax.nn.one_hot(perm, m, dtype=dtype))


# ---- Cholesky -------------------------------------------------------------------------------


def _chol(a):
    if a.size == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    L = lax.linalg.cholesky(a, symmetrize_input=False)
    d = jnp.diagonal(L, axis1=-2, axis2=-1)
    bad = ~(jnp.isfinite(d) & (jnp.real(d) > 0))
    info = jnp.where(jnp.any(bad, -1), jnp.argmax(bad, -1) + 1, 0).astype(jnp.int32)
    return jnp.tril(L), info


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    # LAPACK reads one triangle only: use the lower one (of A^H for upper=True).
    L, info = _chol(_mH(self) if upper else self)
    return (_mH(L) if upper else L), info


@lower(aten.cholesky.default)
def cholesky(self, upper=False):
    L, _ = linalg_cholesky_ex(self, upper=upper)
    return L


def _chol_solve(b, L, upper):
    if upper:
        L = _mH(L)
    L, b = _bcast_batch(L, b)
    y = lax.linalg.triangular_solve(L, b, left_side=True, lower=True)
    return lax.linalg.triangular_solve(L, y, left_side=True, lower=True, transpose_a=True,
                                       conjugate_a=True)


@lower(aten.cholesky_solve.default)
def cholesky_solve(self, input2, upper=False):
    return _chol_solve(self, input2, upper)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(self, upper=False):
    n = self.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=self.dtype), self.shape)
    return _chol_solve(eye, self, upper)


# ---- LU and solvers --------------------------------------------------------------------------


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    lu, piv, info, _ = _lu(A)
    return lu, piv, info


@lower(aten.linalg_lu.default)
def linalg_lu(A, *, pivot=True):
    m, n = A.shape[-2:]
    k = min(m, n)
    lu, piv, _, perm = _lu(A)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=A.dtype)
    U = jnp.triu(lu[..., :k, :])
    P = _perm_matrix(perm, m, A.dtype) if pivot else _empty(A.dtype)
    return P, L, U


@lower(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    if unpack_data:
        L = jnp.tril(LU_data[..., :, :k], -1) + jnp.eye(m, k, dtype=LU_data.dtype)
        U = jnp.triu(LU_data[..., :k, :])
    else:
        L = U = _empty(LU_data.dtype)
    if unpack_pivots:
        perm = _perm_from_pivots(LU_pivots, m)
        P = _perm_matrix(perm, m, LU_data.dtype)
        P = jnp.broadcast_to(P, LU_data.shape[:-2] + (m, m)) if LU_pivots.ndim < LU_data.ndim - 1 else P
    else:
        P = _empty(LU_data.dtype)
    return P, L, U


def _lu_solve(lu, perm, b, adjoint):
    """Solve A X = B (or A^H X = B) from A's LU factors, A[perm] = L U."""
    lu, b = _bcast_batch(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    if not adjoint:
        pb = jnp.take_along_axis(b, perm[..., None], axis=-2)
        y = lax.linalg.triangular_solve(lu, pb, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, y, left_side=True, lower=False)
    y = lax.linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True,
                                    conjugate_a=True)
    x = lax.linalg.triangular_solve(lu, y, left_side=True, lower=True, unit_diagonal=True,
                                    transpose_a=True, conjugate_a=True)
    inv = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(x, inv[..., None], axis=-2)


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    m = LU.shape[-1]
    perm = _perm_from_pivots(pivots, m)
    if left:
        return _lu_solve(LU, perm, B, adjoint)
    # X A = B  <=>  A^H X^H = B^H ;  X A^H = B  <=>  A X^H = B^H
    return _mH(_lu_solve(LU, perm, _mH(B), not adjoint))


def _vector_case(A, B):
    return B.ndim == 1 or (A.ndim - 1 == B.ndim and B.shape == A.shape[:-1])


@lower(aten._linalg_solve_ex.default)
def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
    vec = _vector_case(A, B)
    b = B[..., None] if vec else B
    if not left:
        b = _mT(b)
    # The LU of A itself, as PyTorch 2.13's CPU kernel returns it: linalg_solve's backward
    # solves with these factors (adjoint=True), so factors of A^T would give wrong gradients.
    lu, piv, info, perm = _lu(A)
    x = _lu_solve(lu, perm, b, not left)
    if not left:
        x = _mT(x)
    if vec:
        x = x[..., 0]
    return x, lu, piv, info


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(A, *, check_errors=False):
    lu, piv, info, perm = _lu(A)
    n = A.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=A.dtype), A.shape)
    return _lu_solve(lu, perm, eye, False), info


def _det_parts(A):
    lu, piv, info, perm = _lu(A)
    d = jnp.diagonal(lu, axis1=-2, axis2=-1)
    k = piv.shape[-1]
    swaps = jnp.sum(piv != jnp.arange(1, k + 1, dtype=jnp.int32), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(A.dtype)
    return lu, piv, d, parity


def _det_input(A):
    # NOTE: PyTorch's kernels factor A^T when A is contiguous and real (an F-contiguous
    # view, no copy), and det's/slogdet's backward relies on it (``use_A_T``: it solves
    # with the factors without ``adjoint``). A tpu tensor is contiguous here; a strided one
    # comes in transposed (``_special.det_of_strided``), so the factors are A's own.
    return A if jnp.iscomplexobj(A) else _mT(A)


@lower(aten._linalg_det.default)
def _linalg_det(A):
    lu, piv, d, parity = _det_parts(_det_input(A))
    return parity * jnp.prod(d, axis=-1), lu, piv


@lower(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
    lu, piv, d, parity = _det_parts(_det_input(A))
    absd = jnp.abs(d)
    sgn = parity * jnp.prod(d / jnp.where(absd == 0, 1, absd), axis=-1)
    logabs = jnp.sum(jnp.log(absd), axis=-1)
    return sgn, logabs, lu, piv


@lower(aten.triangular_solve.default)
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    a, b = _bcast_batch(A, self)
    x = lax.linalg.triangular_solve(a, b, left_side=True, lower=not upper, transpose_a=transpose,
                                    unit_diagonal=unitriangular)
    return x, a


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    a, b = _bcast_batch(self, B)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper,
                                       unit_diagonal=unitriangular)


# ---- QR, SVD, eigen -------------------------------------------------------------------------


@lower(aten.linalg_qr.default)
def linalg_qr(A, mode="reduced"):
    m, n = A.shape[-2:]
    if A.size == 0:
        batch = A.shape[:-2]
        k = m if mode == "complete" else min(m, n)
        Q = jnp.broadcast_to(jnp.eye(m, k, dtype=A.dtype), batch + (m, k))
        R = jnp.zeros(batch + (k if mode != "r" else min(m, n), n), A.dtype)
        return (_empty(A.dtype) if mode == "r" else Q), R
    if mode == "r":
        return _empty(A.dtype), jnp.linalg.qr(A, mode="r")
    q, r = jnp.linalg.qr(A, mode=mode)
    return q, r


@lower(aten.geqrf.default)
def geqrf(self):
    from jax._src.lax.linalg import geqrf as _geqrf

    if self.size == 0:
        return self, jnp.zeros(self.shape[:-2] + (min(self.shape[-2:]),), self.dtype)
    a, tau = _geqrf(self)
    return a, tau


@lower(aten.linalg_householder_product.default)
def linalg_householder_product(input, tau):
    if input.size == 0:
        return input
    return lax.linalg.householder_product(input, tau.astype(input.dtype))


@lower(aten.ormqr.default)
def ormqr(self, input2, input3, left=True, transpose=False):
    if input3.size == 0:
        return input3
    k = input2.shape[-1]
    return lax.linalg.ormqr(self[..., :, :k], input2.astype(self.dtype), input3, left=left,
                            transpose=transpose)


@lower(aten._linalg_svd.default)
def _linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = A.shape[:-2]
    if A.size == 0:
        S = jnp.zeros(batch + (k,), jnp.real(A).dtype)
        if not compute_uv:
            return _empty(A.dtype), S, _empty(A.dtype)
        ku, kv = (m, n) if full_matrices else (k, k)
        return (jnp.broadcast_to(jnp.eye(m, ku, dtype=A.dtype), batch + (m, ku)), S,
                jnp.broadcast_to(jnp.eye(kv, n, dtype=A.dtype), batch + (kv, n)))
    if not compute_uv:
        return _empty(A.dtype), jnp.linalg.svd(A, compute_uv=False), _empty(A.dtype)
    U, S, Vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return U, S, Vh


@lower(aten._linalg_eigh.default)
def _linalg_eigh(A, UPLO="L", compute_v=True):
    if A.size == 0:
        w = jnp.zeros(A.shape[:-1], jnp.real(A).dtype)
        return w, (A if compute_v else _empty(A.dtype))
    w, v = jnp.linalg.eigh(A, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else _empty(A.dtype))


@lower(aten.linalg_eig.default)
def linalg_eig(self):
    cdt = jnp.complex128 if self.dtype in (jnp.float64, jnp.complex128) else jnp.complex64
    if self.size == 0:
        return jnp.zeros(self.shape[:-1], cdt), jnp.zeros(self.shape, cdt)
    w, v = jnp.linalg.eig(self)
    return w, v


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(self):
    if self.size == 0:
        return self
    if self.dtype in (jnp.bfloat16, jnp.float16):  # jax's expm takes float32/64 only
        return jax.scipy.linalg.expm(self.astype(jnp.float32)).astype(self.dtype)
    return jax.scipy.linalg.expm(self)


def _pinv(self, atol, rtol, hermitian):
    m, n = self.shape[-2:]
    rdt = jnp.real(self).dtype
    batch = self.shape[:-2]
    if self.size == 0:
        return jnp.zeros(batch + (n, m), self.dtype)
    eps = jnp.finfo(rdt).eps
    default_rtol = eps * max(m, n)
    atol_t = jnp.zeros((), rdt) if atol is None else atol.astype(rdt)
    if rtol is not None:
        rtol_t = rtol.astype(rdt)
    elif atol is not None:
        rtol_t = jnp.where(atol_t > 0, 0, default_rtol).astype(rdt)
    else:
        rtol_t = jnp.asarray(default_rtol, rdt)
    if hermitian:
        w, U = jnp.linalg.eigh(self, symmetrize_input=False)
        aw = jnp.abs(w)
        smax = jnp.max(aw, axis=-1, keepdims=True)
        tol = jnp.maximum(atol_t[..., None], rtol_t[..., None] * smax)
        winv = jnp.where(aw > tol, 1 / jnp.where(aw > tol, w, 1), 0).astype(self.dtype)
        return _mm(U * winv[..., None, :], _mH(U))
    U, S, Vh = jnp.linalg.svd(self, full_matrices=False)
    smax = S[..., :1]
    tol = jnp.maximum(atol_t[..., None], rtol_t[..., None] * smax)
    sinv = jnp.where(S > tol, 1 / jnp.where(S > tol, S, 1), 0).astype(self.dtype)
    return _mm(_mH(Vh) * sinv[..., None, :], _mH(U))


@lower(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv_tensor(self, *, atol=None, rtol=None, hermitian=False):
    return _pinv(self, atol, rtol, hermitian)


@lower(aten.linalg_pinv.atol_rtol_float)
def linalg_pinv_float(self, *, atol=None, rtol=None, hermitian=False):
    rdt = jnp.real(self).dtype
    return _pinv(self, None if atol is None else jnp.asarray(atol, rdt),
                 None if rtol is None else jnp.asarray(rtol, rdt), hermitian)


@lower(aten.linalg_pinv.default, aten.linalg_pinv.rcond_tensor)
def linalg_pinv_rcond(self, rcond, hermitian=False):
    rdt = jnp.real(self).dtype
    return _pinv(self, jnp.zeros((), rdt), jnp.asarray(rcond, rdt), hermitian)


@lower(aten._linalg_check_errors.default, data_dependent=True)
def _linalg_check_errors(info, api_name, *, is_matrix):
    """Raise PyTorch's LinAlgError for a nonzero ``info`` (a sync, as on CUDA)."""
    import numpy as np
    import torch

    i = np.asarray(info)
    if i.size and np.any(i != 0):
        torch.ops.aten._linalg_check_errors(torch.from_numpy(i.astype(np.int32)), api_name,
                                            is_matrix=is_matrix)
    return None
