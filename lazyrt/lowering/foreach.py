"""``_foreach_*`` ops and the fused Adam/AdamW step: one node over whole tensor
lists (what ``torch.optim`` emits on tpu by default), not one op per tensor."""
from __future__ import annotations

import jax.numpy as jnp

from . import pointwise as pw
from ._registry import aten, lower, named

_BINARY = {
    "add": pw.add, "sub": pw.sub, "mul": pw.mul, "div": pw.div, "maximum": pw.maximum,
    "minimum": pw.minimum, "pow": pw.pow_, "clamp_min": pw.clamp_min, "clamp_max": pw.clamp_max,
}


def _as_list(other, n):
    if isinstance(other, (list, tuple)):
        return list(other)
    return [other] * n


def _scalars(scalars, n):
    """Scalar (Python or traced float), ScalarList, or a 1-D Tensor of n values."""
    if isinstance(scalars, (list, tuple)):
        return list(scalars)
    if hasattr(scalars, "ndim") and scalars.ndim == 1:
        return [scalars[i] for i in range(n)]
    return [scalars] * n


for _name, _f in _BINARY.items():
    _packet = getattr(aten, f"_foreach_{_name}", None)
    if _packet is None:
        continue

    def _fe(self, other=None, *, alpha=None, _f=_f, _name=_name):
        others = _as_list(other, len(self))
        if alpha is not None:
            return [_f(a, b, alpha=alpha) for a, b in zip(self, others)]
        return [_f(a, b) for a, b in zip(self, others)]

    for _ov in _packet.overloads():
        lower(getattr(_packet, _ov))(named(_fe, f"_foreach_{_name}"))


@lower(aten._foreach_pow.ScalarAndTensor, replace=True)
def _foreach_pow_scalar_and_tensor(self, exponent):
    """``scalar ** tensor`` for each tensor (torch.optim's compiled Adam bias correction)."""
    return [pw.pow_(self, e) for e in exponent]

_UNARY = ["sqrt", "exp", "log", "neg", "abs", "sign", "sigmoid", "tanh", "reciprocal", "sin",
          "cos", "floor", "ceil", "round", "trunc", "frac", "log1p", "expm1", "erf", "rsqrt", "zero"]
for _name in _UNARY:
    _packet = getattr(aten, f"_foreach_{_name}", None)
    _low = pw.__dict__.get(_name) or pw.__dict__.get(_name + "_")
    if _packet is None:
        continue
    if _name == "zero":
        _low = jnp.zeros_like
    if _low is None:
        from ._registry import LOWERINGS

        _low = LOWERINGS[getattr(aten, _name).default].fn

    def _fu(self, _low=_low):
        return [_low(a) for a in self]

    lower(_packet.default)(named(_fu, f"_foreach_{_name}"))


@lower(aten._foreach_addcmul.Scalar, aten._foreach_addcmul.ScalarList, aten._foreach_addcmul.Tensor)
def foreach_addcmul(self, tensor1, tensor2, scalars=1):
    vals = _scalars(scalars, len(self))
    return [a + v * b * c for a, b, c, v in zip(self, tensor1, tensor2, vals)]


@lower(aten._foreach_addcdiv.Scalar, aten._foreach_addcdiv.ScalarList, aten._foreach_addcdiv.Tensor)
def foreach_addcdiv(self, tensor1, tensor2, scalars=1):
    vals = _scalars(scalars, len(self))
    return [a + v * (b / c) for a, b, c, v in zip(self, tensor1, tensor2, vals)]


@lower(aten._foreach_lerp.Scalar, aten._foreach_lerp.List, aten._foreach_lerp.ScalarList)
def foreach_lerp(self, tensors1, weight):
    ws = _as_list(weight, len(self))
    return [a + w * (b - a) for a, b, w in zip(self, tensors1, ws)]


@lower(aten._foreach_copy.default)
def foreach_copy(self, src, non_blocking=False):
    return [jnp.broadcast_to(s.astype(d.dtype), d.shape) for d, s in zip(self, src)]


@lower(aten._foreach_norm.Scalar)
def foreach_norm(self, ord=2, dtype=None):
    from .reductions import vector_norm

    return [vector_norm(a, ord) for a in self]


def _adam(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
          weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, decoupled):
    new_p, new_m, new_v, new_vmax = [], [], [], []
    inv_scale = None if grad_scale is None else 1.0 / grad_scale
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        pf = p.astype(jnp.float32) if p.dtype in (jnp.bfloat16, jnp.float16) else p
        gf = g.astype(pf.dtype)
        if inv_scale is not None:
            gf = gf * inv_scale
        if maximize:
            gf = -gf
        # NOTE: the fused kernels have already incremented state_steps.
        step = state_steps[i].astype(pf.dtype)
        if decoupled:
            pf = pf * (1 - lr * weight_decay)
        elif not (isinstance(weight_decay, (int, float)) and weight_decay == 0):
            gf = gf + weight_decay * pf
        m2 = m + (1 - beta1) * (gf - m)
        v2 = beta2 * v + (1 - beta2) * gf * gf
        bc1 = 1 - beta1**step
        bc2 = 1 - beta2**step
        step_size = lr / bc1
        bc2_sqrt = jnp.sqrt(bc2)
        if amsgrad:
            vmax = jnp.maximum(max_exp_avg_sqs[i], v2)
            new_vmax.append(vmax)
            denom = jnp.sqrt(vmax) / bc2_sqrt + eps
        else:
            denom = jnp.sqrt(v2) / bc2_sqrt + eps
        p2 = pf - step_size * m2 / denom
        if found_inf is not None:
            skip = found_inf.reshape(()) > 0
            p2 = jnp.where(skip, p, p2)
            m2 = jnp.where(skip, m, m2)
            v2 = jnp.where(skip, v, v2)
        new_p.append(p2)
        new_m.append(m2)
        new_v.append(v2)
    if not amsgrad:
        new_vmax = list(max_exp_avg_sqs)
    return new_p, list(grads), new_m, new_v, new_vmax


@lower(aten._fused_adam_.default, aten._fused_adam_.tensor_lr)
def fused_adam_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
                beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    return _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, decoupled=False)


@lower(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)
def fused_adamw_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
                 beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
    return _adam(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, decoupled=True)


# ---- torch.amp.GradScaler ----------------------------------------------------------------

@lower(aten._amp_foreach_non_finite_check_and_unscale.default)
def _amp_unscale(self, found_inf, inv_scale):
    """Each gradient times ``inv_scale`` (in float32, as CUDA's kernel); ``found_inf`` set
    to 1 when any gradient has an inf or nan."""
    bad = jnp.zeros((), bool)
    outs = []
    for g in self:
        bad = bad | ~jnp.all(jnp.isfinite(g))
        outs.append((g.astype(jnp.float32) * inv_scale.astype(jnp.float32)).astype(g.dtype))
    return outs, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lower(aten._amp_update_scale.default)
def _amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor,
                      scale_backoff_factor, growth_interval):
    """GradScaler's scale update: back off on inf/nan (tracker reset), grow after
    ``growth_interval`` clean steps when the grown scale is finite."""
    inf = found_inf.reshape(()) > 0
    tracker = growth_tracker.reshape(()) + 1
    grow = tracker >= growth_interval
    grown = self * scale_growth_factor
    clean = jnp.where(grow & jnp.isfinite(grown).reshape(()), grown, self)
    scale = jnp.where(inf, self * scale_backoff_factor, clean).astype(self.dtype)
    new_tracker = jnp.where(inf | grow, 0, tracker).astype(growth_tracker.dtype)
    return scale, new_tracker.reshape(growth_tracker.shape)
