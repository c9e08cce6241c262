"""The Pallas router: whether a lowering runs a ``kernels_pallas`` kernel or XLA's path.

Policy (``lazyrt.config.pallas``, env ``LAZYRT_PALLAS``):
  ``auto``  what the measured table says for this platform and shape class
            (``lazyrt._base.backend_choices``, "Pallas routing": a kernel only where
            the device check timed it at least as fast as XLA's path; today no row
            does, so XLA everywhere), and the shapes/dtypes fit
            (``kernels_pallas.supports_*``). The default.
  ``on``    the kernels whenever the shapes fit (interpret mode on CPU).
  ``off``   never.

Attention has a third route on NVIDIA GPUs whatever the policy (``attention_route``):
XLA's fused cuDNN attention (``jax.nn.dot_product_attention(implementation="cudnn")``)
for float16/bfloat16 calls within its constraints (``cudnn_attention_applies``), tried
after the kernel under ``on`` and first under ``auto`` (the table's order); the jnp
path runs the rest.

The router never raises for inputs a kernel cannot take: it returns None (the
caller runs its plain ``jnp``/XLA path) and counts ``pallas_fallbacks``.

Counters (``lazyrt._base.metrics``): ``pallas_attention_calls``, ``pallas_matmul_calls``
and ``pallas_fallbacks`` count *routing decisions made while tracing a lowering*
("calls traced"), not executions: a lowering is traced when its plan is created
(lazyrt's abstract check) and when it is compiled (once per plan in strict mode, once
per compiled flush in defer mode); a cached executable that runs again adds nothing.
So "> 0" means "a kernel is in the compiled code", "== 0" means "no kernel was
traced". The one exception is the ``scaled_dot_product_attention`` redirect
(``lowering/attention.py``), which runs per call and counts a fallback per call
that cannot use the fused op at all (3-D inputs, dropout, a mask needing a grad).

Routing is decided when a lowering is traced, and lazyrt caches plans and
executables per op signature; change the policy with ``lazyrt.set_pallas``, which
flushes pending work and drops the cached plans of the routed ops. Assigning
``config.pallas`` directly only affects signatures not yet planned.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch

from .._base import backend_choices as _choices
from .._base.config import config
from .._base.metrics import COUNTERS

POLICIES = ("auto", "on", "off")


@functools.cache
def _kp():
    import kernels_pallas

    return kernels_pallas


def _backend() -> str:
    return jax.default_backend()


def active() -> bool:
    """Whether the policy allows a kernel on this platform at all (shapes aside): ``on``;
    ``auto`` where some row of the table runs one."""
    p = config.pallas
    if p == "on":
        return True
    if p == "auto":
        return _choices.uses_pallas(_backend())
    return False


def _allows(kernel: str, dtype, work: int) -> bool:
    """Whether the policy runs ``kernel`` for this shape class (shapes' fit aside)."""
    p = config.pallas
    if p == "on":
        return True
    if p == "auto":
        return _choices.pallas_route(_backend(), kernel, dtype, work).order[0] == "pallas"
    return False


def routed_ops():
    """The ATen overloads whose lowerings consult this router (a policy change drops
    their compiled plans: ``lazyrt.set_pallas``)."""
    import torch

    aten = torch.ops.aten
    own = set()
    for name in ("flash_attention", "flash_attention_bwd", "matmul", "matmul_bwd",
                 "paged_attention"):
        try:  # lazyrt's kernels as ops (``lazyrt._ops.kernels``, through jax_op)
            own.add(getattr(torch.ops.lazyrt, name).default)
        except AttributeError:
            pass
    return own | {
        aten.mm.default, aten.bmm.default, aten.addmm.default,
        aten._scaled_dot_product_fused_attention_overrideable.default,
        aten._scaled_dot_product_fused_attention_overrideable_backward.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_backward.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_efficient_attention_backward.default,
    }


def no_x64():
    """lazyrt traces lowerings with x64 on; the kernels are traced with it off.

    NOTE: kernels_pallas's causal flash attention fails to trace under x64
    (``_causal_kv_blocks``: ``lax.div`` of the int32 program id by a Python int that
    x64 makes int64). Their inputs are 32/16-bit, so x64 changes nothing else. The
    custom VJP's backward is traced when the VJP is applied, so that must be inside
    this context too (``flash_attention_vjp``).
    """
    return jax.enable_x64(False)


# ---------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------

def matmul(a, b, bias=None):
    """``a @ b (+ bias)`` with the Pallas kernel, or None when not routed.

    ``a``/``b``: [M, K] @ [K, N] or [B, M, K] @ [B, K, N] of one dtype; ``bias``:
    None, [N] or [1, N] (``addmm``'s ``self`` broadcast over rows). Anything else
    (other ranks or broadcasting, other dtypes, empty dims) returns None and counts
    a fallback.
    """
    # (multiply-adds, for the table's size class: M*K (times the batch) * N)
    if not _allows("matmul", a.dtype, math.prod(a.shape) * (b.shape[-1] if b.ndim else 1)):
        return None
    kp = _kp()
    ok = (a.ndim in (2, 3) and a.ndim == b.ndim and a.dtype == b.dtype
          and kp.supports_matmul(a.shape, b.shape, a.dtype))
    if ok and bias is not None:
        n = b.shape[-1]
        if bias.shape == (1, n):
            bias = bias.reshape(n)
        ok = bias.shape == (n,) and jnp.issubdtype(bias.dtype, jnp.floating)
    if not ok:
        COUNTERS["pallas_fallbacks"] += 1
        return None
    COUNTERS["pallas_matmul_calls"] += 1
    fn = kp.matmul if a.ndim == 2 else kp.batched_matmul
    with no_x64():
        return fn(a, b, bias=bias)


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------

def attention_fits(q, k, v, mask) -> bool:
    """Whether ``kernels_pallas.flash_attention`` takes these (shapes/dtypes only)."""
    kp = _kp()
    if not (q.dtype == k.dtype == v.dtype):
        return False
    return kp.supports_attention(
        tuple(q.shape), tuple(k.shape), q.dtype, v_shape=tuple(v.shape),
        mask_shape=None if mask is None else tuple(mask.shape),
        mask_dtype=None if mask is None else mask.dtype)


def _attention_work(q, k) -> int:
    """An attention's multiply-adds, for the table's size class: B*Hq*L*E*S."""
    return math.prod(q.shape) * (k.shape[-2] if k.ndim >= 2 else 1)


def attention_route(q, k, v, mask, causal: bool, count: bool = True,
                    cudnn: bool = True) -> str:
    """"pallas", "cudnn" or "xla" for this attention (trace time). ``auto``: the table's
    order for the platform and shape class; ``on``: the kernel, else cuDNN, else XLA;
    ``off``: cuDNN, else XLA. ``count``: count the kernel's use, or a fallback when the
    kernel was wanted and cannot take the shapes. ``cudnn=False``: never cuDNN (callers
    without a cuDNN path)."""
    p = config.pallas
    if p == "auto":
        order = _choices.pallas_route(_backend(), "attention", q.dtype,
                                      _attention_work(q, k)).order
    elif p == "on":
        order = ("pallas", "cudnn", "xla")
    else:
        order = ("cudnn", "xla")
    for r in order:
        if r == "pallas":
            if attention_fits(q, k, v, mask):
                if count:
                    COUNTERS["pallas_attention_calls"] += 1
                return "pallas"
            if count:
                COUNTERS["pallas_fallbacks"] += 1
        elif r == "cudnn":
            if cudnn and cudnn_attention_applies(q, k, v, mask, causal):
                return "cudnn"
        else:
            return "xla"
    return "xla"


def use_attention(q, k, v, mask, count: bool = True) -> bool:
    """Route this attention to the kernel? Counts the call or the fallback."""
    return attention_route(q, k, v, mask, False, count=count, cudnn=False) == "pallas"


def flash_attention(q, k, v, mask, causal: bool, scale):
    """The kernel's forward (no routing, no counting): ``[B, Hq, L, E]``."""
    with no_x64():
        return _kp().flash_attention(q, k, v, mask, causal=bool(causal),
                                     scale=None if scale is None else float(scale))


def flash_attention_vjp(g, q, k, v, mask, causal: bool, scale):
    """(dq, dk, dv) of the kernel (its custom VJP: the Pallas backward kernels)."""
    with no_x64():
        _, vjp = jax.vjp(lambda q_, k_, v_: flash_attention(q_, k_, v_, mask, causal, scale),
                         q, k, v)
        return vjp(g)


# ---------------------------------------------------------------------------
# XLA's fused cuDNN attention (NVIDIA GPUs, float16/bfloat16)
# ---------------------------------------------------------------------------

# ``jax.nn.dot_product_attention``'s implementation on the cuDNN route (tests on the CPU
# set "xla" to run the same code path there).
CUDNN_IMPLEMENTATION = "cudnn"
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@functools.cache
def _cudnn_max_head_dim() -> int:
    """cuDNN flash attention's head-dim limit: 256 from Hopper (compute capability 9.0)
    on, else 128 (``jax._src.cudnn.fused_attention_stablehlo.check_is_flash_attention``)."""
    try:
        return 256 if float(jax.devices()[0].compute_capability) >= 9.0 else 128
    except (AttributeError, TypeError, ValueError):
        return 128


# The probe's failure, for diagnostics (``None``: not run or passed).
cudnn_probe_error: str | None = None


@functools.cache
def cudnn_ok() -> bool:
    """Whether cuDNN attention compiles and runs here: a one-time probe, forward and
    backward of a tiny causal bfloat16 call (JAX reports cuDNN attention failures on some
    CUDA 13 stacks; a failure sends every call to the jnp path instead of failing the
    user's program). Only ever called on a GPU."""
    global cudnn_probe_error

    def probe():
        q = jnp.ones((1, 128, 2, 64), jnp.bfloat16)
        f = lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation=CUDNN_IMPLEMENTATION).astype(jnp.float32).sum()
        return jax.grad(f, argnums=(0, 1, 2))(q, q, q)

    try:
        with no_x64():
            jax.block_until_ready(jax.jit(probe)())
        return True
    except Exception as e:  # any failure: the jnp path instead
        cudnn_probe_error = f"{type(e).__name__}: {e}"[:500]
        return False


def cudnn_attention_applies(q, k, v, mask, causal: bool) -> bool:
    """Whether XLA's cuDNN attention takes this call: an NVIDIA GPU, 4-D q/k/v of one
    dtype, float16/bfloat16, no mask (a fully masked row must give zeros, as PyTorch's
    does), causal only with as many queries as keys (PyTorch's causal mask is top-left
    aligned), one head dim for q/k/v, a multiple of 8 and at most 256 (128 before Hopper),
    query heads a multiple of the kv heads, and the probe passing."""
    if _choices.platform_class(_backend()) != "gpu":
        return False
    if mask is not None or not (q.ndim == k.ndim == v.ndim == 4):
        return False
    if not (q.dtype == k.dtype == v.dtype and jnp.dtype(q.dtype) in _HALF):
        return False
    b, hq, L, e = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[-1] != e:
        return False
    if causal and L != k.shape[2]:
        return False
    if e % 8 or e > _cudnn_max_head_dim() or hq % k.shape[1]:
        return False
    return cudnn_ok()


def _bthe(x):
    """PyTorch's [B, H, L, E] as JAX's [B, L, H, E] (and back)."""
    return jnp.swapaxes(x, 1, 2)


def cudnn_attention(q, k, v, causal: bool, scale, with_lse: bool = True):
    """(output [B, Hq, L, E], logsumexp [B, Hq, L] float32 or None) by
    ``jax.nn.dot_product_attention(implementation="cudnn")``. The logsumexp comes from
    cuDNN's residual, which JAX returns in the input dtype (bfloat16/float16 precision);
    this route's backward does not read it."""
    kw = {"scale": None if scale is None else float(scale), "is_causal": bool(causal),
          "implementation": CUDNN_IMPLEMENTATION}
    with no_x64():
        if not with_lse:
            return _bthe(jax.nn.dot_product_attention(_bthe(q), _bthe(k), _bthe(v), **kw)), None
        out, res = jax.nn.dot_product_attention(_bthe(q), _bthe(k), _bthe(v),
                                                return_residual=True, **kw)
        return _bthe(out), jnp.swapaxes(res, 1, 2).astype(jnp.float32)


def cudnn_attention_vjp(g, q, k, v, causal: bool, scale):
    """(dq, dk, dv) by cuDNN's backward (JAX's VJP of the cuDNN forward)."""
    with no_x64():
        _, pull = jax.vjp(lambda q_, k_, v_: cudnn_attention(q_, k_, v_, causal, scale,
                                                             with_lse=False)[0], q, k, v)
        return pull(g.astype(q.dtype))


# ---------------------------------------------------------------------------
# the SDPA redirect (an AutogradPrivateUse1 kernel, registered by ``_registration``)
# ---------------------------------------------------------------------------


def _sdpa_fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Can this SDPA call be expressed with the overrideable fused op (dtypes and the
    kernel's shape limits aside: the lowering decides those)?"""
    ts = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "tpu" and t.dim() == 4
               for t in ts):
        return False
    if not (query.dtype == key.dtype == value.dtype and query.dtype.is_floating_point):
        return False
    if dropout_p != 0.0:
        return False
    if attn_mask is not None:
        if is_causal:
            return False  # PyTorch raises: let the composite kernel say so
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.device.type != "tpu":
            return False
        if attn_mask.requires_grad and torch.is_grad_enabled():
            return False
        if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
            return False
    b, hq, L, e = query.shape
    bk, hk, S, ek = key.shape
    bv, hv, Sv, ev = value.shape
    if not (b == bk == bv and e == ek and S == Sv and hk == hv):
        return False
    if hq != hk and not (enable_gqa and hq % hk == 0):
        return False
    return True


def sdpa_autograd_kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                         scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` on tpu: the fused overrideable op when the call
    fits (its lowering runs the flash kernel, or with the kernels off or unfit, a jnp
    path whose backward reuses the forward's output and logsumexp), else PyTorch's
    composite (math) path."""
    aten = torch.ops.aten
    # NOTE: the fused op with the kernels off, too: on XLA:CPU, against the composite's
    # bmm/_safe_softmax/bmm chain and its autograd, the perf attention rows ran 1.7-2.3x
    # faster in strict, 1.1-1.4x in defer at the two smaller shapes and 0.87x at the
    # largest (whose composite backward reuses the saved softmax); the GPT steps 1.1-1.4x
    # in both modes. It is one node of a program rather than ~20.
    if _sdpa_fusable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        fused = aten._scaled_dot_product_fused_attention_overrideable.default
        return fused(query, key, value, attn_mask, 0.0, is_causal, False, scale=scale)[0]
    if active():
        COUNTERS["pallas_fallbacks"] += 1
    return aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
