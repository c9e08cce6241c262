"""Constants made on the host: factories run without compiling a program for each shape.

Start-up is full of programs that make a constant: every parameter moved with ``.to("tpu")``
starts as an ``empty_strided`` of its shape, an optimizer's state is a ``zeros_like`` per
parameter shape, a static cache is ``zeros`` per layer. In strict mode each would be a
program compiled once and run once (a third of a small CNN's first-step compiles). A Prog
whose outputs read no input's value (``Prog.const``) is evaluated here instead, with
numpy, from its jaxpr, and the result is transferred: no compile at all.

Only primitives whose numpy result is exactly XLA's are evaluated (broadcasts, iotas,
reshapes, selects, integer arithmetic, comparisons, exact conversions); a program with any
other (float arithmetic, a float-to-int conversion) is compiled as before. On the CPU
platform the transfer is free, so a constant is always made here; elsewhere a program
that keeps being called (``DEVICE_CALLS``) is compiled, since filling on the device beats
a transfer. A program whose inputs lie on several devices (a mesh) is compiled: where its
outputs go is GSPMD's choice.
"""
from __future__ import annotations

import os

import jax
import jax.extend.core as jcore
import numpy as np

from .._base import dtypes as _dtypes  # noqa: F401  (numpy knows bfloat16 through it)
from .._base.platform import on_cpu

DEVICE_CALLS = 8
# ``LAZYRT_HOST_CONSTANTS=0`` turns it off (every constant is compiled, as any program).
ENABLED = os.environ.get("LAZYRT_HOST_CONSTANTS", "1") != "0"


def _literal(v):
    return np.asarray(v.val) if type(v) is jcore.Literal else None


def _int(dt) -> bool:
    return np.issubdtype(dt, np.integer) or dt == np.bool_


_NARROW_FLOATS = (np.dtype(jax.numpy.bfloat16), np.dtype(np.float16))


def _convert(x, p):
    """``x.astype`` where numpy rounds exactly as XLA does; None elsewhere."""
    new, old = np.dtype(p["new_dtype"]), x.dtype
    if old == np.bool_ or old == new:
        return x.astype(new)
    if np.issubdtype(old, np.floating):
        # float -> int/bool: XLA's rounding and saturation are not numpy's; float64 ->
        # bfloat16/float16 may round twice in numpy (through float32)
        if not np.issubdtype(new, np.floating) or (new in _NARROW_FLOATS and old.itemsize > 4):
            return None
        return x.astype(new)
    if np.issubdtype(old, np.integer):
        if new in _NARROW_FLOATS:  # may round twice in numpy
            return None
        return x.astype(new)  # integers wrap, and round to nearest even, as in XLA
    return None


def _broadcast(x, p):
    shape, dims = tuple(p["shape"]), tuple(p["broadcast_dimensions"])
    expanded = [1] * len(shape)
    for i, d in enumerate(dims):
        expanded[d] = x.shape[i]
    return np.broadcast_to(x.reshape(expanded), shape)


def _iota(p):
    shape, dim = tuple(p["shape"]), p["dimension"]
    r = np.arange(shape[dim], dtype=np.dtype(p["dtype"]))
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return np.broadcast_to(r.reshape(view), shape)


def _int_binop(f):
    def op(a, b, p):
        if not (_int(a.dtype) and _int(b.dtype)):
            return None
        return f(a, b).astype(np.result_type(a, b))
    return op


_BINOPS = {
    "add": _int_binop(np.add), "sub": _int_binop(np.subtract), "mul": _int_binop(np.multiply),
    "max": _int_binop(np.maximum), "min": _int_binop(np.minimum),
    "and": _int_binop(np.bitwise_and), "or": _int_binop(np.bitwise_or),
    "eq": lambda a, b, p: np.equal(a, b), "ne": lambda a, b, p: np.not_equal(a, b),
    "lt": lambda a, b, p: np.less(a, b), "le": lambda a, b, p: np.less_equal(a, b),
    "gt": lambda a, b, p: np.greater(a, b), "ge": lambda a, b, p: np.greater_equal(a, b),
}


def _eval(jaxpr, consts, args):
    """Evaluate ``jaxpr`` on numpy ``args``; None if a primitive is not supported."""
    env = {}
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = np.asarray(c)
    for v, a in zip(jaxpr.invars, args):
        env[v] = a

    def read(v):
        lit = _literal(v)
        return lit if lit is not None else env[v]

    for eqn in jaxpr.eqns:
        name, p = eqn.primitive.name, eqn.params
        ins = [read(v) for v in eqn.invars]
        if name in ("pjit", "jit", "closed_call"):
            inner = p.get("jaxpr") or p.get("call_jaxpr")
            out = _eval(inner.jaxpr, inner.consts, ins)
            if out is None:
                return None
        elif name == "broadcast_in_dim":
            out = [_broadcast(ins[0], p)]
        elif name == "iota":
            out = [_iota(p)]
        elif name == "convert_element_type":
            r = _convert(ins[0], p)
            if r is None:
                return None
            out = [r]
        elif name == "reshape":
            out = [np.reshape(ins[0], tuple(p["new_sizes"]))]
        elif name == "squeeze":
            out = [np.squeeze(ins[0], axis=tuple(p["dimensions"]))]
        elif name == "expand_dims":
            out = [np.expand_dims(ins[0], tuple(p["dimensions"]))]
        elif name == "copy" or name == "copy_p":
            out = [ins[0]]
        elif name == "select_n":
            pred, *cases = ins
            out = [np.choose(pred.astype(np.intp), cases) if cases else None]
        elif name in _BINOPS:
            r = _BINOPS[name](ins[0], ins[1], p)
            if r is None:
                return None
            out = [r]
        else:
            return None
        for v, o in zip(eqn.outvars, out):
            env[v] = np.asarray(o, dtype=v.aval.dtype)
    return [read(v) for v in jaxpr.outvars]


def evaluate(prog, arrays: list, scalars: list):
    """``prog``'s outputs made on the host and transferred (jax.Arrays), or None when it
    is to be compiled instead: not a constant, not supported, or called often on an
    accelerator."""
    host = prog.host
    if host is False or not ENABLED:
        return None
    dev = None
    if arrays:
        devs = set().union(*(a.devices() for a in arrays))
        if len(devs) != 1:  # a program over a mesh: its outputs' placement is GSPMD's choice
            return None
        dev = next(iter(devs))
    prog.host_calls += 1
    if prog.host_calls > DEVICE_CALLS and not on_cpu():
        return None
    if host is None:
        try:
            with jax.enable_x64(True):
                host = jax.make_jaxpr(prog.fn)(
                    *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays], *scalars)
        except Exception:  # not traceable on its own: compile it as any program
            host = False
        if host is not False and _used(host.jaxpr) & set(host.jaxpr.invars[:len(arrays)]):
            host = False  # reads an input's value after all
        prog.host = host
        if host is False:
            return None
    outs = _eval(host.jaxpr, host.consts, [None] * len(arrays) + [np.asarray(s) for s in scalars])
    if outs is None:
        prog.host = False
        return None
    with jax.enable_x64(True):
        return [jax.device_put(np.array(o, order="C"), dev) for o in outs]


def _used(jaxpr) -> set:
    used = {v for e in jaxpr.eqns for v in e.invars if type(v) is not jcore.Literal}
    used.update(v for v in jaxpr.outvars if type(v) is not jcore.Literal)
    return used
