"""Backward ops derived from their forward: ``jax.vjp`` of the forward's JAX function.

A ``*_backward`` ATen op computes a vector-Jacobian product of a forward op. Instead
of a hand-written formula per op, ``BACKWARDS`` declares for each such op how it maps
onto its forward, and ``derive`` builds the lowering:

* ``forward``: the forward ``OpOverload``. Its JAX function is its own lowering when the
  table has one (``_cdist_forward``), else PyTorch's decomposition of it run on
  lazyrt's lowerings (``_traced.jax_fn``); ``fn`` overrides that with another JAX
  function of the same calling convention (where the lowering is not differentiable
  where PyTorch's formula is defined).
* ``grads``: the forward arguments whose gradients the backward returns, in the order
  of the backward's returns.
* ``cotangents``: for each forward output, the backward argument holding its cotangent
  (None: that output is not differentiated, e.g. ``_ctc_loss``'s ``log_alpha``).
* ``args``: where a forward argument comes from when the backward does not have an
  argument of the same name: a backward argument's name, ``Zeros(size_arg)`` /
  ``ZerosLike(arg)`` (the primal of a forward that is linear in it: upsampling,
  padding, ``masked_scatter``; the point does not matter), or ``Const(value)``.
  Unnamed ones take the forward's default.
* ``output_mask``: the backward argument (``bool[]``, one per ``grads``) saying which
  gradients are wanted; the others are returned as None and not computed, except those
  in ``always`` (PyTorch computes ``grid_sampler``'s grid gradient whatever the mask).
* ``adjust``: ``adjust(grads, bargs) -> grads`` where PyTorch's backward formula is
  not the mathematical gradient of its forward (``_ctc_loss_backward``).

The derived lowering is registered under the backward op only where no hand-written
lowering exists (those are kept: they are faster or match PyTorch's conventions), so
this module is imported after every other lowering module. Each derived lowering is a
named function (``derived_backward.upsample_bilinear2d_backward``; its ``derived_from``
attribute names the forward); ``BACKWARDS`` maps the backward op to its declaration.
Saved forward outputs the backward receives (``cdist``, ``log_alpha``, ``is_target``)
are not read: the forward is recomputed inside the same XLA computation.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from torch._ops import OpOverload

from . import _traced
from ._registry import LOWERINGS, aten, lower
from ._util import vjp

__all__ = ["Backward", "Zeros", "ZerosLike", "Const", "BACKWARDS", "derive"]


@dataclasses.dataclass(frozen=True)
class Zeros:
    """Zeros of the shape held by an int-list backward argument (dtype of the cotangent)."""
    size_arg: str


@dataclasses.dataclass(frozen=True)
class ZerosLike:
    """Zeros shaped like a tensor backward argument (dtype of the cotangent)."""
    arg: str


@dataclasses.dataclass(frozen=True)
class Const:
    value: Any


@dataclasses.dataclass(frozen=True)
class Backward:
    forward: OpOverload
    grads: tuple[str, ...]
    cotangents: tuple[str | None, ...] = ("grad_output",)
    args: dict = dataclasses.field(default_factory=dict)
    output_mask: str | None = None
    adjust: Callable | None = None
    fn: Callable | None = None
    always: tuple[str, ...] = ()


BACKWARDS: dict[OpOverload, Backward] = {}


def _lowering_name(op: OpOverload) -> str:
    name = op._schema.name.split("::")[-1]
    return name if op._overloadname == "default" else f"{name}_{op._overloadname}"


def _make(bop: OpOverload, spec: Backward) -> Callable:
    fop = spec.forward
    bschema, fschema = bop._schema, fop._schema
    bnames = [a.name for a in bschema.arguments]
    bpos = [a.name for a in bschema.arguments if not a.kwarg_only]
    bdefaults = {a.name: a.default_value for a in bschema.arguments if a.has_default_value()}
    fargs = list(fschema.arguments)
    n_ret = len(bschema.returns)

    # Validate the declaration against both schemas at import.
    sources = {}
    for a in fargs:
        if a.name in spec.args:
            src = spec.args[a.name]
        elif a.name in bnames:
            src = a.name
        elif a.has_default_value():
            src = Const(a.default_value)
        else:
            raise ValueError(f"lazyrt: derived {bop}: no source for {fop}'s argument {a.name!r}")
        for ref in ([src] if isinstance(src, str) else
                    [src.size_arg] if isinstance(src, Zeros) else
                    [src.arg] if isinstance(src, ZerosLike) else []):
            if ref not in bnames:
                raise ValueError(f"lazyrt: derived {bop}: {ref!r} is not an argument of it")
        sources[a.name] = src
    for g in spec.grads:
        if g not in sources:
            raise ValueError(f"lazyrt: derived {bop}: {g!r} is not an argument of {fop}")
    if len(spec.cotangents) != len(fschema.returns):
        raise ValueError(f"lazyrt: derived {bop}: {len(spec.cotangents)} cotangents for "
                         f"{len(fschema.returns)} outputs of {fop}")
    if len(spec.grads) != n_ret:
        raise ValueError(f"lazyrt: derived {bop}: {len(spec.grads)} grads for {n_ret} returns")
    cot_idx = [i for i, c in enumerate(spec.cotangents) if c is not None]
    first_cot = spec.cotangents[cot_idx[0]]

    def lowering(*args, **kwargs):
        b = dict(bdefaults)
        b.update(zip(bpos, args))
        b.update(kwargs)
        fwd = spec.fn or _traced.jax_fn(fop)
        dt = jnp.asarray(b[first_cot]).dtype

        def value(src):
            if isinstance(src, str):
                return b[src]
            if isinstance(src, Zeros):
                return jnp.zeros(tuple(b[src.size_arg]), dt)
            if isinstance(src, ZerosLike):
                return jnp.zeros(jnp.shape(b[src.arg]), dt)
            return src.value

        vals = {name: value(src) for name, src in sources.items()}
        mask = b[spec.output_mask] if spec.output_mask else [True] * len(spec.grads)
        want = [g for g, m in zip(spec.grads, mask) if m or g in spec.always]

        def forward(*primals):
            v = dict(vals)
            v.update(zip(want, primals))
            pos = [v[a.name] for a in fargs if not a.kwarg_only]
            kw = {a.name: v[a.name] for a in fargs if a.kwarg_only}
            out = fwd(*pos, **kw)
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            return tuple(outs[i] for i in cot_idx)

        got = {}
        if want:
            _, pull = vjp(forward, *[vals[g] for g in want])
            got = dict(zip(want, pull(tuple(b[spec.cotangents[i]] for i in cot_idx))))
        grads = tuple(got.get(g) for g in spec.grads)
        if spec.adjust is not None:
            grads = spec.adjust(grads, b)
        return grads[0] if n_ret == 1 else grads

    name = _lowering_name(bop)
    lowering.__name__ = lowering.__qualname__ = name
    lowering.__module__ = __name__
    lowering.__doc__ = f"{bop}: jax.vjp of {fop} (declared in derived_backward.BACKWARDS)."
    lowering.derived_from = fop
    return lowering


def derive(bop: OpOverload, forward: OpOverload, grads, cotangents=("grad_output",), *,
           output_mask=None, adjust=None, fn=None, always=(), static_floats=None, **args):
    """Declare ``bop`` as the vjp of ``forward`` and register its lowering, unless a
    hand-written lowering of ``bop`` exists. ``args``: forward argument -> source."""
    spec = Backward(forward, tuple(grads), tuple(cotangents), dict(args), output_mask, adjust, fn,
                    tuple(always))
    lowering = _make(bop, spec)
    BACKWARDS[bop] = spec
    globals()[lowering.__name__] = lowering
    if bop in LOWERINGS:
        return lowering
    flow = LOWERINGS.get(forward)
    if static_floats is None:
        static_floats = fn is None and _traced.needs_static_floats(forward)
    lower(bop, static_floats=static_floats,
          data_dependent=bool(flow is not None and flow.data_dependent))(lowering)
    return lowering


# ---- upsampling (linear in the input: differentiated at zeros of input_size) -----------------

for _name, _nd in (("upsample_linear1d", 1), ("upsample_bilinear2d", 2), ("upsample_bicubic2d", 2),
                   ("upsample_trilinear3d", 3), ("_upsample_bilinear2d_aa", 2),
                   ("_upsample_bicubic2d_aa", 2)):
    derive(getattr(aten, f"{_name}_backward").default, getattr(aten, _name).default, ("self",),
           self=Zeros("input_size"))

# ---- grid sampling ----------------------------------------------------------------------------

derive(aten.grid_sampler_2d_backward.default, aten.grid_sampler_2d.default, ("input", "grid"),
       output_mask="output_mask", always=("grid",))
derive(aten.grid_sampler_3d_backward.default, aten.grid_sampler_3d.default, ("input", "grid"),
       output_mask="output_mask", always=("grid",))

# ---- padding ----------------------------------------------------------------------------------

for _nd in (1, 2, 3):
    derive(getattr(aten, f"replication_pad{_nd}d_backward").default,
           getattr(aten, f"replication_pad{_nd}d").default, ("self",))

# ---- activations ------------------------------------------------------------------------------

derive(aten.softshrink_backward.default, aten.softshrink.default, ("self",))
derive(aten.hardshrink_backward.default, aten.hardshrink.default, ("self",), ("grad_out",))

# ---- losses -----------------------------------------------------------------------------------

derive(aten.multi_margin_loss_backward.default, aten.multi_margin_loss.default, ("self",))
derive(aten.multilabel_margin_loss_backward.default, aten.multilabel_margin_loss_forward.default,
       ("self",), ("grad_output", None))


def _ctc_pytorch_grad(grads, b):
    """PyTorch's CTC backward returns d(nll)/d(log_probs) + exp(log_probs) * grad (the
    gradient w.r.t. the logits before a log_softmax, folded in), zero past each input
    length and, with zero_infinity, for infinite losses."""
    (g,) = grads
    lp = b["log_probs"]
    grad = jnp.asarray(b["grad"])
    il = np.asarray(b["input_lengths"]).reshape(-1)
    unbatched = lp.ndim == 2
    lp3 = lp[:, None] if unbatched else lp
    g3 = g[:, None] if unbatched else g
    T, N = lp3.shape[:2]
    alive = jnp.asarray(np.arange(T)[:, None] < il.reshape(1, N))[..., None]
    gr = grad.reshape(1, N, 1).astype(lp3.dtype)
    out = jnp.where(alive, g3 + jnp.exp(lp3) * gr, 0)
    if b["zero_infinity"]:
        nll = _traced.jax_fn(aten._ctc_loss.default)(
            lp, b["targets"], list(np.asarray(b["input_lengths"]).reshape(-1).tolist()),
            list(np.asarray(b["target_lengths"]).reshape(-1).tolist()), b["blank"], False)[0]
        out = jnp.where(jnp.isinf(jnp.reshape(nll, (1, N, 1))), 0, out)
    return (out[:, 0] if unbatched else out,)


derive(aten._ctc_loss_backward.default, aten._ctc_loss.default, ("log_probs",), ("grad", None),
       adjust=_ctc_pytorch_grad)
derive(aten._ctc_loss_backward.Tensor, aten._ctc_loss.Tensor, ("log_probs",), ("grad", None),
       adjust=_ctc_pytorch_grad)

# ---- distances, weight norm -------------------------------------------------------------------

# _cdist_backward / _pdist_backward are hand-written (nn.py): PyTorch's formulas give zero at
# zero distances and the full gradient to every tie of the inf-norm, where the vjp divides it.
derive(aten._weight_norm_interface_backward.default, aten._weight_norm_interface.default,
       ("v", "g"), ("grad_w", None), v="saved_v", g="saved_g")

# ---- indexing ---------------------------------------------------------------------------------

derive(aten.masked_scatter_backward.default, aten.masked_scatter.default, ("source",),
       self=ZerosLike("grad_output"), source=Zeros("sizes"))


def segment_reduce_differentiable(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                                  unsafe=False, initial=None):
    """segment_reduce with a product JAX can differentiate (a scatter-multiply has no vjp
    for repeated indices): each segment's product over a dense [segment, element] mask."""
    from .indexing import segment_reduce

    if reduce != "prod":
        return segment_reduce(data, reduce, lengths=lengths, indices=indices, offsets=offsets,
                              axis=axis, unsafe=unsafe, initial=initial)
    ax = axis % data.ndim
    if lengths is None:
        lengths = offsets[..., 1:] - offsets[..., :-1]
    lengths = lengths.astype(jnp.int64)
    lead, n, rest = data.shape[:ax], data.shape[ax], data.shape[ax + 1:]
    nseg = lengths.shape[-1]
    x = data.reshape((-1, n) + rest)
    lens = jnp.broadcast_to(lengths, lead + (nseg,)).reshape(-1, nseg)
    init = 1 if initial is None else initial

    def one(xb, lb):
        seg = jnp.searchsorted(jnp.cumsum(lb), jnp.arange(n), side="right")
        member = (seg[None, :] == jnp.arange(nseg)[:, None]).reshape((nseg, n) + (1,) * len(rest))
        return jnp.prod(jnp.where(member, xb[None], 1), axis=1) * init

    return jax.vmap(one)(x, lens).reshape(lead + (nseg,) + rest)


def _segment_extreme_pytorch_grad(grads, b):
    """max/min: PyTorch's kernel gives each extreme element (or NaN) the segment's gradient and
    divides it by the number of them only where it is positive; the vjp splits every tie."""
    if b["reduce"] not in ("max", "min"):
        return grads
    data, output, grad = b["data"], b["output"], b["grad"]
    lengths, offsets = b["lengths"], b["offsets"]
    ax = b["axis"] % data.ndim
    if lengths is None:
        lengths = offsets[..., 1:] - offsets[..., :-1]
    lead, n, rest = data.shape[:ax], data.shape[ax], data.shape[ax + 1:]
    nseg = lengths.shape[-1]
    x = data.reshape((-1, n) + rest)
    out = output.reshape((-1, nseg) + rest)
    g = grad.reshape((-1, nseg) + rest).astype(data.dtype)
    lens = jnp.broadcast_to(lengths.astype(jnp.int64), lead + (nseg,)).reshape(-1, nseg)

    def one(xb, ob, gb, lb):
        seg = jnp.searchsorted(jnp.cumsum(lb), jnp.arange(n), side="right")
        valid = (seg < nseg).reshape((n,) + (1,) * len(rest))
        s = jnp.minimum(seg, nseg - 1)
        ext = valid & (jnp.isnan(xb) | (xb == ob[s]))
        ge = jnp.where(ext, gb[s], 0)
        count = jnp.zeros((nseg,) + rest, jnp.int32).at[s].add(ext.astype(jnp.int32))[s]
        return jnp.where((count >= 2) & (ge > 0), ge / jnp.maximum(count, 1).astype(ge.dtype), ge)

    return (jax.vmap(one)(x, out, g, lens).reshape(data.shape),)


derive(aten._segment_reduce_backward.default, aten.segment_reduce.default, ("data",), ("grad",),
       fn=segment_reduce_differentiable, adjust=_segment_extreme_pytorch_grad)
