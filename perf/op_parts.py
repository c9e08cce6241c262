"""CPU time of one 4x4 ``x + b`` op split into its parts (each part called alone in a loop
of 20,000 on the op's own arguments; thread CPU time, minimum of 7 loops).

    python -m perf.op_parts [strict|defer]
"""
from __future__ import annotations

import sys
import time

import torch

import lazyrt
from lazyrt._base import memory
from lazyrt._exec import defer as _defer
from lazyrt._exec import strict as _strict
from lazyrt._exec import values as _values
from lazyrt._ops import dispatch as _disp
from lazyrt._ops import plan as _plan
from lazyrt._ops.resolve import BY_ID, resolve

N = 20000


def best(f):
    ts = []
    for _ in range(7):
        t0 = time.thread_time()
        f()
        ts.append((time.thread_time() - t0) / N * 1e6)
        _defer._trace = _defer.Trace()
    return min(ts)


def _common(mode: str):
    """The op's setup in ``mode`` and the parts both modes share: ``(res, e, args, kw,
    plan, vals, scal)``."""
    lazyrt.set_mode(mode)
    x, b = torch.rand(4, 4).to("tpu"), torch.rand(4, 4).to("tpu")
    lazyrt.sync()
    func = torch.ops.aten.add.Tensor
    e = BY_ID.get(id(func)) or resolve(func)
    x + b
    args, kw = (x, b), {}
    plan, vals, scal = _plan.plan_for(e, args, kw)
    lazyrt.sync()
    res = {}
    def whole():
        for _ in range(N):
            x + b
    res["whole op (x + b)"] = best(whole)
    def disp():
        for _ in range(N):
            _disp._torch_dispatch(None, func, None, args, None)
    res["lazyrt __torch_dispatch__ body"] = best(disp)
    def pf():
        for _ in range(N):
            _plan.plan_for(e, args, kw)
    res["plan_for"] = best(pf)
    return res, plan, vals, scal


def _print(res: dict) -> None:
    w = max(len(k) for k in res) + 1
    for k, v in res.items():
        print(f"{k:<{w}} {v:6.2f} us")


def strict():
    res, plan, vals, scal = _common("strict")
    prog = plan.prog
    outs = _strict.run(prog, vals, scal)
    d = prog.direct
    def sr():
        for _ in range(N):
            _strict.run(prog, vals, scal)
    res["strict.run (all)"] = best(sr)
    def ex():
        f, h = d[1], d[2]
        for _ in range(N):
            f(vals).consume_with_handlers(h)
    res["  execute_sharded + handlers (C)"] = best(ex)
    def cr():
        for _ in range(N):
            o = d[1](vals).consume_with_handlers(d[2])
            memory.count_run(o, prog.out_nbytes, 0, 0, "add")
    res["  execute + memory.count_run"] = best(cr)
    def nt():
        o = outs[0]
        for _ in range(N):
            _values.new_tensor(o, plan.layout.single)
    res["new_tensor (Storage + wrapper)"] = best(nt)
    _print(res)


def defer():
    res, plan, vals, scal = _common("defer")
    prog = plan.prog
    def rec():
        with _defer.LOCK:
            for _ in range(N):
                _defer.record(prog, vals, scal)
    res["defer.record"] = best(rec)
    def nt():
        with _defer.LOCK:
            p = _defer.record(prog, vals, scal)[0]
            for _ in range(N):
                _values.new_tensor(p, plan.layout.single)
    res["new_tensor (Storage + wrapper + note_storage)"] = best(nt)
    def lk():
        o = _defer._owned
        for _ in range(N):
            o()
    res["LOCK._is_owned() check"] = best(lk)
    def wl():
        for _ in range(N):
            with _defer.LOCK:
                pass
    res["with LOCK (dispatch's)"] = best(wl)
    _print(res)


if __name__ == "__main__":
    (defer if sys.argv[1:] == ["defer"] else strict)()
