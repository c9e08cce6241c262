"""Matrix products and linear algebra. fp32 matmuls honour
``torch.set_float32_matmul_precision`` ("highest": full fp32, PyTorch's default;
"high"/"medium": XLA's faster bf16-pass precisions, TPU's default)."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ._registry import aten, lower, to_jax_dtype
from ._util import matmul_precision


def _dot(a, b):
    return jnp.matmul(a, b, precision=matmul_precision(),
                      preferred_element_type=jnp.float32 if a.dtype in (jnp.bfloat16, jnp.float16) else None)


@lower(aten.mm.default)
def mm(self, mat2):
    from .._pallas import matmul as pallas_matmul  # Pallas router (issue 5): None = XLA

    out = pallas_matmul(self, mat2)
    return _dot(self, mat2) if out is None else out


@lower(aten.bmm.default)
def bmm(self, mat2):
    from .._pallas import matmul as pallas_matmul  # Pallas router (issue 5): None = XLA

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
        from .._pallas import matmul as pallas_matmul  # Pallas router (issue 5)

        out = pallas_matmul(mat1, mat2, bias=self)
        if out is not None:
            return out
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
    return beta * self + alpha * _dot(mat, vec)


@lower(aten.baddbmm.default)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    out = alpha * _dot(batch1, batch2)
    if isinstance(beta, int) and beta == 0:
        return out
    return out + beta * self


@lower(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    out = alpha * jnp.sum(_dot(batch1, batch2), axis=0)
    if isinstance(beta, int) and beta == 0:
        return out
    return out + beta * self


@lower(aten.outer.default, aten.ger.default)
def outer(self, vec2):
    return jnp.outer(self, vec2)


@lower(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    out = alpha * jnp.outer(vec1, vec2)
    if isinstance(beta, int) and beta == 0:
        return out
    return out + beta * self


# ---- grouped matmul (mixture-of-experts) ------------------------------------------------------


def _ragged(lhs, rhs, sizes, lhs_ragged, contract, rhs_group):
    dn = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(contract, ([], [])), lhs_ragged_dimensions=[lhs_ragged],
        rhs_group_dimensions=rhs_group)
    return lax.ragged_dot_general(
        lhs, rhs, sizes, dn, precision=matmul_precision(),
        preferred_element_type=jnp.float32 if lhs.dtype in (jnp.bfloat16, jnp.float16) else None)


@lower(aten._grouped_mm.default)
def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    """``offs`` holds the (int32) end of every group along the ragged dimension:
    2-D x 3-D: rows of ``self`` (out[rows of g] = self[rows of g] @ mat2[g]);
    2-D x 2-D: the contracted dimension (out[g] = self[:, ks of g] @ mat2[ks of g]);
    3-D x 2-D: columns of ``mat2`` (out[:, cols of g] = self[g] @ mat2[:, cols of g]);
    3-D x 3-D: no offs, a batched matmul. Rows/columns past the last offset are zeros
    (PyTorch leaves them unwritten)."""
    if bias is not None:
        raise NotImplementedError("_grouped_mm: bias is not supported (nor on CPU)")
    dt = to_jax_dtype(out_dtype) if out_dtype is not None else self.dtype
    if self.ndim == 3 and mat2.ndim == 3:
        return _dot(self, mat2).astype(dt)
    sizes = jnp.diff(offs.astype(jnp.int32), prepend=jnp.zeros((1,), jnp.int32))
    if self.ndim == 2 and mat2.ndim == 3:
        out = _ragged(self, mat2, sizes, 0, ([1], [1]), [0])
    elif self.ndim == 2:
        out = _ragged(self, mat2, sizes, 1, ([1], [0]), [])
    else:  # (N, K) of mat2^T ragged over N, against self^T (G, K, M) grouped
        out = _ragged(mat2.T, jnp.swapaxes(self, 1, 2), sizes, 0, ([1], [1]), [0]).T
    return out.astype(dt)
