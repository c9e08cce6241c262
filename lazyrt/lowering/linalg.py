"""Matrix products and linear algebra. fp32 matmuls honour
``torch.set_float32_matmul_precision`` ("highest": full fp32, PyTorch's default;
"high"/"medium": XLA's faster bf16-pass precisions, TPU's default)."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .._base.platform import on_cpu
from ._registry import aten, lower
from ._util import canon_dim, jdt, matmul_precision, opmath


def _dot(a, b):
    return jnp.matmul(a, b, precision=matmul_precision(),
                      preferred_element_type=jnp.float32 if a.dtype in (jnp.bfloat16, jnp.float16) else None)


def _coef(c, like):
    """An addmm-family ``alpha``/``beta`` as ATen applies it: converted to the integer (or
    bool) dtype of an integer product first, so 0.6 scales an int64 product by 0."""
    if isinstance(c, (int, bool)) or jnp.issubdtype(like.dtype, jnp.inexact):
        return c
    return jnp.asarray(c).astype(like.dtype)


@lower(aten.mm.default)
def mm(self, mat2):
    from .pallas_router import matmul as pallas_matmul  # Pallas router (issue 5): None = XLA

    out = pallas_matmul(self, mat2)
    return _dot(self, mat2) if out is None else out


@lower(aten.bmm.default)
def bmm(self, mat2):
    from .pallas_router import matmul as pallas_matmul  # Pallas router (issue 5): None = XLA

    out = pallas_matmul(self, mat2)
    return _dot(self, mat2) if out is None else out


@lower(aten.matmul.default)
def matmul(self, other):
    return _dot(self, other)


@lower(aten.mv.default)
def mv(self, vec):
    return _dot(self, vec)


@lower(aten.dot.default)
def dot(self, tensor):
    return jnp.sum(self * tensor)


@lower(aten.vdot.default)
def vdot(self, other):
    """``torch.vdot`` conjugates its first argument (``dot`` conjugates nothing)."""
    return jnp.sum(jnp.conj(self) * other)


@lower(aten.addmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    if type(alpha) is int and alpha == 1 and type(beta) is int and beta == 1:
        from .pallas_router import matmul as pallas_matmul  # Pallas router (issue 5)

        out = pallas_matmul(mat1, mat2, bias=self)
        if out is not None:
            return out
    alpha, beta = _coef(alpha, mat1), _coef(beta, mat1)
    out = _dot(mat1, mat2)
    if not (isinstance(alpha, int) and alpha == 1):
        out = out * alpha
    if isinstance(beta, int) and beta == 0:
        return out
    if not (isinstance(beta, int) and beta == 1):
        return out + beta * self
    return out + self


@lower(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    alpha, beta = _coef(alpha, mat), _coef(beta, mat)
    return beta * self + alpha * _dot(mat, vec)


@lower(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    alpha, beta = _coef(alpha, batch1), _coef(beta, batch1)
    out = alpha * _dot(batch1, batch2)
    if isinstance(beta, int) and beta == 0:
        return out
    return out + beta * self


@lower(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    alpha, beta = _coef(alpha, batch1), _coef(beta, batch1)
    if batch1.dtype in (jnp.bfloat16, jnp.float16) and batch1.shape[0] > 0:
        # ATen's CPU addbmm is one addmm_ per batch into the output, each rounded to the
        # low-precision dtype; accumulate the same way (a float32 sum differs by 1 ulp there)
        def step(acc, ab):
            a, b = ab
            return (alpha * _dot(a, b) + opmath(acc)).astype(batch1.dtype), None

        first = alpha * _dot(batch1[0], batch2[0])
        if not (isinstance(beta, int) and beta == 0):
            first = first + beta * opmath(self)
        first = jnp.broadcast_to(first, (batch1.shape[1], batch2.shape[2])).astype(batch1.dtype)
        out, _ = lax.scan(step, first, (batch1[1:], batch2[1:]))
        return out
    out = alpha * jnp.sum(_dot(batch1, batch2), axis=0)
    if isinstance(beta, int) and beta == 0:
        return out
    return out + beta * self


@lower(aten.linalg_cross.default)
def linalg_cross(self, other, *, dim=-1):
    """a x b, each product rounded to the operands' dtype before the difference, as ATen's
    CPU kernel does (PyTorch's decomposition computes bfloat16 in float32)."""
    dt = jnp.result_type(self, other)
    a, b = jnp.broadcast_arrays(self.astype(dt), other.astype(dt))
    d = canon_dim(dim, a.ndim)
    c = [lax.index_in_dim(a, i, d) for i in range(3)]
    e = [lax.index_in_dim(b, i, d) for i in range(3)]
    return jnp.concatenate([c[1] * e[2] - c[2] * e[1], c[2] * e[0] - c[0] * e[2],
                            c[0] * e[1] - c[1] * e[0]], axis=d)


@lower(aten.outer.default, aten.ger.default)
def outer(self, vec2):
    return jnp.outer(self, vec2)


@lower(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    alpha, beta = _coef(alpha, vec1), _coef(beta, vec1)
    out = alpha * jnp.outer(vec1, vec2)
    if isinstance(beta, int) and beta == 0:
        return out
    # beta == 0 ignores self (NaN included), also as a runtime float
    return out + jnp.where(beta == 0, 0, beta * self)


@lower(aten._grouped_mm.default)
def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """Grouped GEMM (mixture-of-experts). ``offs``: int32 cumulative group ends along the
    ragged dim. 2-D x 3-D: row group g of ``self`` times ``mat2[g]``; 3-D x 2-D: ``self[g]``
    times column group g of ``mat2``; 2-D x 2-D: one product per group of the contraction
    dim (-> [G, M, N]); 3-D x 3-D: bmm. Rows/columns past ``offs[-1]`` are zero (PyTorch
    leaves them unwritten)."""
    a, b = self, mat2
    pref = jnp.float32 if a.dtype in (jnp.bfloat16, jnp.float16) else None
    prec = matmul_precision()
    if a.ndim == 3 and b.ndim == 3:
        out = jnp.matmul(a, b, precision=prec, preferred_element_type=pref)
    else:
        if pref is not None and on_cpu():  # XLA:CPU has no bf16 x bf16 -> f32 ragged dot
            a, b, pref = a.astype(pref), b.astype(pref), None
        ends = offs.astype(jnp.int32)
        sizes = jnp.diff(ends, prepend=jnp.zeros((1,), jnp.int32))
        if a.ndim == 2 and b.ndim == 3:
            out = lax.ragged_dot(a, b, sizes, precision=prec, preferred_element_type=pref)
        elif a.ndim == 3 and b.ndim == 2:
            out = lax.ragged_dot(b.T, jnp.swapaxes(a, 1, 2), sizes, precision=prec,
                                 preferred_element_type=pref).T
        else:
            k = jnp.arange(a.shape[1])
            start = ends - sizes
            member = (k[None, :] >= start[:, None]) & (k[None, :] < ends[:, None])  # G, K
            out = jnp.einsum("mk,gk,kn->gmn", a, member.astype(a.dtype), b, precision=prec,
                             preferred_element_type=pref)
    if bias is not None:
        out = out + bias
    return out.astype(jdt(out_dtype) if out_dtype is not None else self.dtype)
