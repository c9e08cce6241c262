"""Linear-algebra solvers JAX has no direct counterpart of, with PyTorch's CPU (LAPACK)
output conventions: ``linalg_lstsq`` (driver-dependent outputs) and the
Bunch-Kaufman LDL^T factorization ``linalg_ldl_factor_ex`` / ``linalg_ldl_solve``
(LAPACK ``sytf2``/``sytrs`` with ``uplo='L'``, real or complex symmetric, and
``hetf2``/``hetrs`` for complex Hermitian: the same pivot choices, the same compact
``LD`` and 1-based int32 ``pivots``, negative for 2x2 blocks)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._registry import aten, lower
from ._util import matmul_precision

_ALPHA = (1 + np.sqrt(17.0)) / 8  # Bunch-Kaufman pivot threshold


def _mH(x):
    x = jnp.swapaxes(x, -1, -2)
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def _mm(a, b):
    return jnp.matmul(a, b, precision=matmul_precision())


# ---- least squares ------------------------------------------------------------------------


@lower(aten.linalg_lstsq.default, data_dependent=True)
def linalg_lstsq(self, b, rcond=None, *, driver=None):
    """Minimum-norm least-squares solution through the SVD (equal, up to rounding, to
    LAPACK's gels/gelsy/gelsd/gelss for the ranks they handle). Outputs follow
    PyTorch's CPU kernel: ``rank`` for every driver but gels, ``singular_values`` for
    gelsd/gelss, ``residuals`` when m > n and the driver is not gelsy (gelsd/gelss:
    only when every matrix has full rank, hence data-dependent)."""
    driver = driver or "gelsy"
    A = self
    vector = b.ndim == A.ndim - 1
    B = b[..., None] if vector else b
    m, n = A.shape[-2:]
    k = B.shape[-1]
    batch = jnp.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A = jnp.broadcast_to(A, batch + (m, n))
    B = jnp.broadcast_to(B, batch + (m, k))
    rdt = jnp.real(A).dtype
    eps = float(jnp.finfo(rdt).eps)
    rc = eps * max(m, n) if rcond is None else float(rcond)
    if A.size == 0 or B.size == 0:
        X = jnp.zeros(batch + (n, k), A.dtype)
        S = jnp.zeros(batch + (min(m, n),), rdt)
        rank = jnp.zeros(batch, jnp.int64)
    else:
        U, S, Vh = jnp.linalg.svd(A, full_matrices=False)
        cut = S[..., :1] * (0.0 if driver == "gels" else rc)
        keep = S > cut
        sinv = jnp.where(keep, 1 / jnp.where(keep, S, 1), 0).astype(A.dtype)
        X = _mm(_mH(Vh), sinv[..., :, None] * _mm(_mH(U), B))
        rank = jnp.sum(keep, axis=-1).astype(jnp.int64)
    empty_r = jnp.zeros((0,), rdt)
    residuals = empty_r
    if m > n and driver != "gelsy":
        full = driver == "gels" or bool(np.all(np.asarray(rank) == n))
        if full:
            residuals = jnp.sum(jnp.abs(_mm(A, X) - B) ** 2, axis=-2).astype(rdt)
    singular_values = S if driver in ("gelsd", "gelss") else empty_r
    if driver == "gels":
        rank = jnp.zeros((0,), jnp.int64)
    if vector:
        X = X[..., 0]
    return X, residuals, rank, singular_values


# ---- LDL^T (Bunch-Kaufman) --------------------------------------------------------------------


def _conj_if(hermitian: bool):
    """The conjugation hetf2/hetrs apply where sytf2/sytrs transpose (identity for those)."""
    return jnp.conj if hermitian else (lambda v: v)


def _sytf2_lower(a, hermitian=False):
    """LAPACK dsytf2/csytf2 (uplo='L') on one n x n matrix, or zhetf2 with ``hermitian``:
    (LD with the input's upper triangle, 1-based pivots, info). The pivot choice of each
    step decides the next step's size, so the loop is a while_loop over the column k;
    each step works on whole-matrix masks."""
    n = a.shape[-1]
    idx = jnp.arange(n)
    row, col = idx[:, None], idx[None, :]
    neg = jnp.asarray(-1, jnp.real(a).dtype)
    if jnp.iscomplexobj(a):  # ?sytf2/?hetf2 rank off-diagonal pivots by CABS1 = |re| + |im|
        def cabs(v):
            return jnp.abs(jnp.real(v)) + jnp.abs(jnp.imag(v))
    else:
        cabs = jnp.abs
    cj = _conj_if(hermitian)
    if hermitian:
        # hetf2 reads only the real part of the diagonal (and keeps it real)
        a = jnp.where(row == col, jnp.real(a).astype(a.dtype), a)

        def dabs(v):
            return jnp.abs(jnp.real(v))
    else:
        dabs = cabs

    def first_argmax(v):
        return jnp.argmax(v)  # LAPACK i*amax: the first index of the largest |value|

    def step(state):
        A, piv, info, k = state
        absakk = dabs(A[k, k])
        colabs = jnp.where(idx > k, cabs(A[:, k]), neg)
        imax = first_argmax(colabs)
        colmax = jnp.where(k < n - 1, colabs[imax], 0)
        rowabs = jnp.where((idx >= k) & (idx < imax), cabs(A[imax, :]), neg)
        rowmax = rowabs[first_argmax(rowabs)]
        below = jnp.where(idx > imax, cabs(A[:, imax]), neg)
        rowmax = jnp.where(imax < n - 1, jnp.maximum(rowmax, below[first_argmax(below)]), rowmax)
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        one_k = absakk >= _ALPHA * colmax
        one_k2 = absakk >= _ALPHA * colmax * (colmax / jnp.where(rowmax == 0, 1, rowmax))
        one_imax = dabs(A[imax, imax]) >= _ALPHA * rowmax
        stay = zero | one_k | one_k2
        kp = jnp.where(stay, k, imax)
        kstep = jnp.where(stay | one_imax, 1, 2)
        kk = k + kstep - 1
        # interchange rows/columns kk and kp of the trailing matrix A[k:, k:] (lower part)
        perm = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        S = jnp.where(row >= col, A, cj(A.T))
        Sp = S[perm][:, perm]
        trail = (row >= k) & (col >= k) & (row >= col)
        A = jnp.where(trail & ~zero, Sp, A)
        # 1x1 pivot: rank-1 update of A[k+1:, k+1:], then scale the column
        akk = jnp.real(A[k, k]) if hermitian else A[k, k]
        d11 = 1 / jnp.where(akk == 0, 1, akk)
        x = jnp.where(idx > k, A[:, k], 0)
        A1 = A + jnp.where((row > k) & (col > k) & (row >= col), x[:, None] * cj(-d11 * x)[None, :], 0)
        A1 = jnp.where((col == k) & (row > k), A1 * d11, A1)
        # 2x2 pivot: rank-2 update of A[k+2:, k+2:] with the columns k, k+1
        k1 = jnp.minimum(k + 1, n - 1)
        ck, ck1 = A[:, k], A[:, k1]
        if hermitian:  # zhetf2
            d = jnp.abs(A[k1, k])
            d = jnp.where(d == 0, 1, d)
            e11, e22 = jnp.real(A[k1, k1]) / d, jnp.real(A[k, k]) / d
            d21 = A[k1, k] / d
            dd = (1 / (e11 * e22 - 1)) / d
            wk = dd * (e11 * ck - d21 * ck1)
            wkp1 = dd * (e22 * ck1 - jnp.conj(d21) * ck)
        else:  # dsytf2/csytf2
            d21 = A[k1, k]
            d21s = jnp.where(d21 == 0, 1, d21)
            e11 = A[k1, k1] / d21s
            e22 = A[k, k] / d21s
            t = 1 / (e11 * e22 - 1)
            d21 = t / d21s
            wk = d21 * (e11 * ck - ck1)
            wkp1 = d21 * (e22 * ck1 - ck)
        rest = idx > k + 1
        A2 = A - jnp.where(rest[:, None] & rest[None, :] & (row >= col),
                           ck[:, None] * cj(wk)[None, :] + ck1[:, None] * cj(wkp1)[None, :], 0)
        A2 = jnp.where((col == k) & rest[:, None], wk[:, None], A2)
        A2 = jnp.where((col == k1) & rest[:, None], wkp1[:, None], A2)
        if hermitian:
            A2 = jnp.where((row == col) & rest[:, None], jnp.real(A2).astype(A2.dtype), A2)
        A = jnp.where(zero, A, jnp.where(kstep == 1, A1, A2))
        p1 = (kp + 1).astype(piv.dtype)
        piv = jnp.where(kstep == 1, jnp.where(idx == k, p1, piv),
                        jnp.where((idx == k) | (idx == k + 1), -p1, piv))
        info = jnp.where(zero & (info == 0), k + 1, info)
        return A, piv, info, k + kstep

    state = (a, jnp.zeros((n,), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    A, piv, info, _ = lax.while_loop(lambda s: s[3] < n, step, state)
    return A, piv, info


def _batched(fn, x, n_core):
    batch = x.shape[:-n_core] if n_core else x.shape
    flat = x.reshape((-1,) + x.shape[x.ndim - n_core:])
    outs = jax.vmap(fn)(flat)
    return tuple(o.reshape(batch + o.shape[1:]) for o in outs)


@lower(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(self, *, hermitian=False, check_errors=False):
    hermitian = bool(hermitian) and jnp.iscomplexobj(self)
    n = self.shape[-1]
    batch = self.shape[:-2]
    if self.size == 0:
        return (jnp.zeros(self.shape, self.dtype), jnp.zeros(batch + (n,), jnp.int32),
                jnp.zeros(batch, jnp.int32))
    A, piv, info = _batched(lambda a: _sytf2_lower(a, hermitian), self, 2)
    return jnp.tril(A), piv, info


def _sytrs_lower(ld, piv, b, hermitian=False):
    """LAPACK dsytrs (uplo='L'): solve A X = B from sytf2's LD and pivots; zhetrs with
    ``hermitian`` (A = P L D L^H P^T)."""
    n = ld.shape[-1]
    idx = jnp.arange(n)
    cj = _conj_if(hermitian)

    def swap(B, i, j):
        perm = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
        return B[perm]

    def fwd(state):  # L D X = B, k ascending
        B, k = state
        p = piv[k]
        two = p < 0
        kp = jnp.where(two, -p, p) - 1
        B = jnp.where(two, swap(B, jnp.minimum(k + 1, n - 1), kp), swap(B, k, kp))
        col = ld[:, k]
        # 1x1
        B1 = B - jnp.where((idx > k)[:, None], col[:, None] * B[k][None, :], 0)
        B1 = B1.at[k].set(B1[k] / ld[k, k])
        # 2x2
        k1 = jnp.minimum(k + 1, n - 1)
        col1 = ld[:, k1]
        rest = (idx > k + 1)[:, None]
        B2 = B - jnp.where(rest, col[:, None] * B[k][None, :], 0)
        B2 = B2 - jnp.where(rest, col1[:, None] * B[k1][None, :], 0)
        akm1k = ld[k1, k]
        akm1 = ld[k, k] / cj(akm1k)
        ak = ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1 = B2[k] / cj(akm1k)
        bk = B2[k1] / akm1k
        B2 = B2.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(two, B2, B1), k + jnp.where(two, 2, 1)

    def bwd(state):  # L^T X = B (L^H for hermitian), k descending
        B, k = state
        p = piv[k]
        two = p < 0
        below = (idx > k)[:, None]
        B1 = B.at[k].add(-jnp.sum(jnp.where(below, cj(ld[:, k])[:, None] * B, 0), axis=0))
        km1 = jnp.maximum(k - 1, 0)
        B2 = B1.at[km1].add(-jnp.sum(jnp.where(below, cj(ld[:, km1])[:, None] * B, 0),
                                     axis=0))
        B = jnp.where(two, B2, B1)
        kp = jnp.where(two, -p, p) - 1
        return swap(B, k, kp), k - jnp.where(two, 2, 1)

    B, _ = lax.while_loop(lambda s: s[1] < n, fwd, (b, jnp.zeros((), jnp.int32)))
    B, _ = lax.while_loop(lambda s: s[1] >= 0, bwd, (B, jnp.asarray(n - 1, jnp.int32)))
    return B


@lower(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    hermitian = bool(hermitian) and jnp.iscomplexobj(LD)
    n = LD.shape[-1]
    batch = jnp.broadcast_shapes(LD.shape[:-2], B.shape[:-2])
    k = B.shape[-1]
    dt = jnp.result_type(LD, B)
    if n == 0 or k == 0 or int(np.prod(batch)) == 0:
        return jnp.zeros(batch + (n, k), dt)
    ld = jnp.broadcast_to(LD, batch + (n, n)).reshape((-1, n, n)).astype(dt)
    pv = jnp.broadcast_to(pivots, batch + (n,)).reshape((-1, n)).astype(jnp.int32)
    b = jnp.broadcast_to(B, batch + (n, k)).reshape((-1, n, k)).astype(dt)
    return jax.vmap(lambda *a: _sytrs_lower(*a, hermitian))(ld, pv, b).reshape(batch + (n, k))
