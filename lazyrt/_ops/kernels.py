"""lazyrt's own Pallas kernels as torch ops, registered through ``jax_op`` (the same path as
a user's kernel): ``torch.ops.lazyrt.flash_attention``, ``torch.ops.lazyrt.matmul`` and
``torch.ops.lazyrt.paged_attention`` (ragged paged attention over transformers' paged KV
cache layout: ``kernels_pallas.paged_attention``).

Each runs the ``kernels_pallas`` kernel when the Pallas router allows it
(``lazyrt.set_pallas``: ``auto`` = where ``_base.backend_choices``' "Pallas routing" table
measured the kernel faster than XLA's path for the platform and shape class, ``on`` =
wherever it fits, in interpret mode on CPU) and the shapes fit, else the kernel's pure-JAX
reference (same semantics); the choice is made
when the op is traced, as for the ATen lowerings that use the router (SDPA, mm/bmm/addmm).
Backward: the flash kernel's own Pallas backward (its custom VJP); for matmul, the
reference's derivative (matmuls XLA fuses).
"""
from __future__ import annotations

import jax

from .._base.metrics import COUNTERS
from ..lowering import pallas_router as _router
from .jax_op import jax_op


def _flash_attention(q, k, v, mask=None, causal: bool = False, scale: float | None = None):
    if _router.use_attention(q, k, v, mask):
        return _router.flash_attention(q, k, v, mask, causal, scale)
    return _router._kp().flash_attention_reference(q, k, v, mask, causal=causal, scale=scale)


def _flash_attention_bwd(g, q, k, v, mask=None, causal: bool = False,
                         scale: float | None = None):
    if _router.use_attention(q, k, v, mask, count=False):
        dq, dk, dv = _router.flash_attention_vjp(g, q, k, v, mask, causal, scale)
    else:
        ref = _router._kp().flash_attention_reference
        _, vjp = jax.vjp(lambda q_, k_, v_: ref(q_, k_, v_, mask, causal=causal, scale=scale),
                         q, k, v)
        dq, dk, dv = vjp(g)
    return dq, dk, dv, None


def _matmul(a, b, bias=None, activation: str | None = None):
    kp = _router._kp()
    if not _router.active():
        return kp.matmul_reference(a, b, bias=bias, activation=activation)
    if (a.ndim in (2, 3) and a.ndim == b.ndim and a.dtype == b.dtype
            and kp.supports_matmul(a.shape, b.shape, a.dtype)):
        COUNTERS["pallas_matmul_calls"] += 1
        fn = kp.matmul if a.ndim == 2 else kp.batched_matmul
        with _router.no_x64():
            return fn(a, b, bias=bias, activation=activation)
    COUNTERS["pallas_fallbacks"] += 1
    return kp.matmul_reference(a, b, bias=bias, activation=activation)


def _matmul_bwd(g, a, b, bias=None, activation: str | None = None):
    ref = _router._kp().matmul_reference
    if bias is None:
        _, vjp = jax.vjp(lambda a_, b_: ref(a_, b_, activation=activation), a, b)
        return (*vjp(g), None)
    _, vjp = jax.vjp(lambda a_, b_, c_: ref(a_, b_, bias=c_, activation=activation), a, b, bias)
    return vjp(g)


def _paged_attention(q, k_pages, v_pages, block_table, cu_seq_lens_q, kv_lens,
                     scale: float | None = None):
    kp = _router._kp()
    if _router.active():
        with _router.no_x64():
            return kp.paged_attention(q, k_pages, v_pages, block_table, cu_seq_lens_q,
                                      kv_lens, scale=scale)
    return kp.paged_attention_reference(q, k_pages, v_pages, block_table, cu_seq_lens_q,
                                        kv_lens, scale=scale)


flash_attention = jax_op("lazyrt::flash_attention", _flash_attention,
                         static=("causal", "scale"), backward=_flash_attention_bwd)
matmul = jax_op("lazyrt::matmul", _matmul, static=("activation",), backward=_matmul_bwd)
# inference (serving): no backward of its own
paged_attention = jax_op("lazyrt::paged_attention", _paged_attention, static=("scale",))
