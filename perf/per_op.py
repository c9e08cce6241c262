"""CPU time per op of the issuing thread, the figure least disturbed by a loaded machine:
the minimum over ``--reps`` chains of ``--ops`` 4x4 ``mul``/``add`` ops, for the two floors
(``floor_dispatch``: a ``__torch_dispatch__`` that only returns a new wrapper; ``floor_jit``:
a cached ``jax.jit`` call per op), defer recording (the trace is dropped, never run) and
strict (every op run; ``strict_scalar``: ``y * 0.999``, ``y + 0.001``, the scalars runtime
inputs; ``strict_new_scalar``: a value never used before at every op); and
``flush_hit_200``, the CPU time of one cache-hit flush of a 200-op trace (``x = x + b`` on
4x4; the trace recorded before the clock starts; ``flush_hit_200_scalar``: the scalar
chain, 200 runtime scalars).

    python -m perf.per_op [--ops 2000] [--reps 25]

Run it under another checkout (``PYTHONPATH=/other/checkout``, and
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) to compare two versions side by side.
"""
from __future__ import annotations

import argparse
import time


def _chain(y, a, n):
    for _ in range(n // 2):
        y = y * a
        y = y + a
    return y


def _chain_scalars(y, n):
    """The same chain with Python float operands: runtime scalars."""
    for _ in range(n // 2):
        y = y * 0.999
        y = y + 0.001
    return y


_NEW = [0]


def _chain_new_scalars(y, n):
    """The chain with a value never used before at every op (as a random op's seed)."""
    k = _NEW[0]
    for i in range(k, k + n // 2):
        y = y * (1.0 + i * 1e-12)
        y = y + i * 1e-12
    _NEW[0] = k + n // 2
    return y


def _best(f, reps: int, n: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.thread_time()
        f(n)
        ts.append((time.thread_time() - t0) / n * 1e6)
    return min(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.per_op")
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=25)
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import torch

    from .workloads import _NewWrapper

    x, w = torch.rand(4, 4), torch.full((4, 4), 0.999)
    res = {}
    wx, ww = _NewWrapper(x), _NewWrapper(w)
    res["floor_dispatch"] = _best(lambda n: _chain(wx, ww, n), a.reps, a.ops)
    jx, jw = jnp.asarray(x.numpy()), jnp.asarray(w.numpy())
    mul, add = jax.jit(lambda p, q: p * q), jax.jit(lambda p, q: p + q)

    def jit_chain(n):
        y = jx
        for _ in range(n // 2):
            y = add(mul(y, jw), jw)
        y.block_until_ready()

    jit_chain(2)
    res["floor_jit"] = _best(jit_chain, a.reps, a.ops)

    import lazyrt
    from lazyrt._exec import defer as _defer

    with lazyrt.set_mode("defer"):
        tx, tw = x.to("tpu"), w.to("tpu")

        def record(n):
            _chain(tx, tw, n)
            _defer._trace = _defer.Trace()  # drop the trace: recording only

        res["defer_record"] = _best(record, a.reps, a.ops)

        def flush_hit(scalars=False):
            y = _chain_scalars(tx, 200) if scalars else tx
            for _ in range(0 if scalars else 200):
                y = y + tw
            t0, w0 = time.thread_time(), time.perf_counter()
            lazyrt.sync()
            return (time.thread_time() - t0) * 1e6, (time.perf_counter() - w0) * 1e6

        flushes = {}
        for name, sc in (("flush_hit_200", False), ("flush_hit_200_scalar", True)):
            for _ in range(3):
                flush_hit(sc)  # compile, then hits
            fl = [flush_hit(sc) for _ in range(a.reps)]
            flushes[name] = (min(c for c, _ in fl), min(w for _, w in fl))
    with lazyrt.set_mode("strict"):
        def strict(n):
            _chain(tx, tw, n).cpu()

        strict(a.ops)
        res["strict"] = _best(strict, a.reps, a.ops)

        def strict_scalar(n):
            _chain_scalars(tx, n).cpu()

        strict_scalar(a.ops)
        res["strict_scalar"] = _best(strict_scalar, a.reps, a.ops)

        def strict_new_scalar(n):
            _chain_new_scalars(tx, n).cpu()

        strict_new_scalar(a.ops)
        res["strict_new_scalar"] = _best(strict_new_scalar, a.reps, a.ops)
    for k, v in res.items():
        print(f"{k:<17} {v:6.2f} us/op (CPU time, min of {a.reps})")
    for name, (flush_us, flush_wall) in flushes.items():
        print(f"{name:<15} {flush_us / 1e3:6.3f} ms per flush (CPU time, min of {a.reps}; "
              f"wall {flush_wall / 1e3:.3f} ms)")
    print(f"defer_record / floor_dispatch {res['defer_record'] / res['floor_dispatch']:.2f}x, "
          f"strict / floor_jit {res['strict'] / res['floor_jit']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
