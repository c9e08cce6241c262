"""Lean programs: the jaxpr of a defer flush, simplified before XLA sees it.

A flush traces every node's lowering one after another, so the program carries what the
trace itself introduced and a hand-written JAX program would not have: the same
subexpression computed by several nodes (a runtime scalar converted to float32 for each
of the 200 parameters it scales, the same view derived from a weight by three consumers,
the same mask built twice) and ``convert_element_type`` ops that change nothing but JAX's
weak-type flag (PyTorch has no weak types: the value, the dtype and the XLA type are the
same before and after). ``simplify`` removes both from the top level of the jaxpr:

* common-subexpression elimination: an equation with the same primitive, the same
  parameters and the same inputs (variables, or literals equal bit for bit: ``-0.0`` is
  not ``0.0``) as an earlier one is dropped and its outputs replaced by the earlier
  one's. Equations with effects are never merged;
* a ``convert_element_type`` whose input already has the output's dtype is dropped (its
  output replaced by its input). A convert that changes the dtype always stays, so a
  value is rounded exactly where PyTorch rounds it;
* constants folded: a float32/float64 scalar ``add``/``sub``/``mul``/``div``/``neg``/
  ``sqrt``/``convert_element_type`` of literals becomes a literal (numpy computes these
  correctly rounded, as XLA does).

``lower`` traces a function, simplifies its jaxpr and lowers that. It reaches into
``jax.stages.Traced`` to lower a rewritten jaxpr; if that private layout changes, it
lowers the traced jaxpr unchanged (a bigger program, the same results).
"""
from __future__ import annotations

import numpy as np
from jax.extend import core as jcore

from .._base.metrics import COUNTERS

_Literal = jcore.Literal
_DropVar = jcore.DropVar
# Primitives whose result is not a function of their operands alone.
_NEVER_MERGE = frozenset({"rng_uniform", "iota_random", "create_token", "after_all"})


def _freeze(x):
    """A hashable, bit-exact stand-in for a parameter value (TypeError if there is none)."""
    t = type(x)
    if t is float:
        return (float, np.float64(x).tobytes())
    if t is tuple or t is list:
        return (t, tuple(_freeze(v) for v in x))
    if t is dict:
        return (dict, tuple(sorted((k, _freeze(v)) for k, v in x.items())))
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        return (np.ndarray, x.dtype.str, x.shape, x.tobytes())
    hash(x)
    return x


_FOLD = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "neg": np.negative, "sqrt": np.sqrt,
}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _fold(eqn, invars):
    """The literal ``eqn`` computes from literal scalar inputs, or None."""
    name = eqn.primitive.name
    if len(eqn.outvars) != 1 or (name not in _FOLD and name != "convert_element_type"):
        return None
    out = eqn.outvars[0].aval
    if getattr(out, "shape", None) != () or out.dtype not in _FLOATS:
        return None
    vals = []
    for v in invars:
        if type(v) is not _Literal:
            return None
        x = np.asarray(v.val)
        if x.shape != () or x.dtype not in _FLOATS:
            return None
        vals.append(x)
    with np.errstate(all="ignore"):
        if name == "convert_element_type":
            r = vals[0].astype(out.dtype)
        else:
            if any(x.dtype != out.dtype for x in vals):
                return None
            r = _FOLD[name](*vals)
    return _Literal(np.asarray(r, dtype=out.dtype)[()], out)


def _atom_key(a, sub: dict):
    if type(a) is _Literal:
        v = np.asarray(a.val)
        av = a.aval
        return ("L", v.dtype.str, v.shape, v.tobytes(), getattr(av, "weak_type", None))
    return sub.get(a, a)


def simplify(closed):
    """``(closed jaxpr, equations removed)``: ``closed`` with its common subexpressions,
    no-op converts and scalar constant arithmetic removed (the same object if none)."""
    jaxpr = closed.jaxpr
    sub: dict = {}  # var -> the atom that replaces it
    seen: dict = {}
    eqns = []
    removed = 0
    for eqn in jaxpr.eqns:
        invars = [sub.get(v, v) if type(v) is not _Literal else v for v in eqn.invars]
        prim = eqn.primitive
        if not eqn.effects and type(eqn.outvars[0]) is not _DropVar:
            lit = _fold(eqn, invars)
            if lit is not None:
                sub[eqn.outvars[0]] = lit
                removed += 1
                continue
        if (prim.name == "convert_element_type" and not eqn.effects
                and type(invars[0]) is not _Literal
                and invars[0].aval.dtype == eqn.outvars[0].aval.dtype
                and invars[0].aval.shape == eqn.outvars[0].aval.shape):
            sub[eqn.outvars[0]] = invars[0]
            removed += 1
            continue
        key = None
        if not eqn.effects and prim.name not in _NEVER_MERGE:
            try:
                key = (prim, _freeze(eqn.params), tuple(_atom_key(v, sub) for v in invars))
                hash(key)
            except TypeError:
                key = None
        if key is not None:
            prev = seen.get(key)
            if prev is not None:
                for o, p in zip(eqn.outvars, prev):
                    if type(o) is not _DropVar:
                        sub[o] = p
                removed += 1
                continue
            if not any(type(o) is _DropVar for o in eqn.outvars):
                seen[key] = eqn.outvars
        if any(a is not b for a, b in zip(invars, eqn.invars)):
            eqn = eqn.replace(invars=invars)
        eqns.append(eqn)
    if not removed:
        return closed, 0
    outvars = [sub.get(v, v) if type(v) is not _Literal else v for v in jaxpr.outvars]
    return closed.replace(jaxpr=jaxpr.replace(eqns=eqns, outvars=outvars)), removed


def lower(jitted, args: tuple):
    """``jitted`` (a ``jax.jit`` function) traced at ``args``, simplified and lowered."""
    traced = jitted.trace(*args)
    try:
        closed, removed = simplify(traced.jaxpr)
        lean = traced
        if removed:
            lean = type(traced)(traced._meta_tys_flat, dict(traced._params, jaxpr=closed),
                                traced._in_tree, traced.out_tree, traced._consts)
        lowered = lean.lower()
    except Exception:
        # NOTE: jax's private Traced layout changed (or the rewrite broke a lowering
        # rule): the program as traced, whose own errors are the ones to raise.
        COUNTERS["lean_fallbacks"] += 1
        return traced.lower()
    COUNTERS["lean_eqns_removed"] += removed
    return lowered
