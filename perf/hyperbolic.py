"""``python -m perf.hyperbolic``: the accuracy of lazyrt's ``cosh``/``sinh`` lowering against
XLA's own (``jnp.cosh``/``jnp.sinh``), in ulps of the result's dtype, over a grid of
``--points`` values spanning [-90, 90] (float32) and [-712, 712] (float64) plus special
values, against a reference computed in ``numpy.longdouble``. Columns: max and mean ulp
error over finite results, and mismatches on inf/NaN/signed zero.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=200001)
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import lazyrt  # noqa: F401
    from lazyrt.lowering import pointwise as pw

    jax.config.update("jax_enable_x64", True)
    specials = [0.0, -0.0, 1e-30, -1e-8, 1e-3, 0.5, 1.0, np.inf, -np.inf, np.nan]
    print("| op | dtype | lowering | max ulp | mean ulp | special mismatches |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dt, top in ((np.float32, 90.0), (np.float64, 712.0)):
        x = np.concatenate([np.linspace(-top, top, a.points), specials]).astype(dt)
        for name in ("cosh", "sinh"):
            ref = getattr(np, name)(x.astype(np.longdouble))
            with np.errstate(over="ignore", invalid="ignore"):
                fin = np.isfinite(ref) & (np.abs(ref) <= np.finfo(dt).max)
                spacing = np.spacing(np.abs(ref[fin]).astype(dt)).astype(np.longdouble)
            for label, fn in (("XLA's", getattr(jnp, name)), ("lazyrt", getattr(pw, name))):
                y = np.asarray(jax.jit(fn)(jnp.asarray(x)))
                ulp = (np.abs(y[fin].astype(np.longdouble) - ref[fin]) / spacing).astype(np.float64)
                sp = ~fin
                yl = y[sp].astype(np.longdouble)
                r = np.where(np.abs(ref[sp]) > np.finfo(dt).max, np.sign(ref[sp]) * np.inf, ref[sp])
                bad = ~((yl == r) | (np.isnan(yl) & np.isnan(r)))
                z = x == 0
                bad_zero = int((np.signbit(y[z]) != np.signbit(ref[z].astype(dt))).sum())
                print(f"| {name} | {np.dtype(dt).name} | {label} | {ulp.max():.2f} | {ulp.mean():.3f} | "
                      f"{int(bad.sum()) + bad_zero} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
