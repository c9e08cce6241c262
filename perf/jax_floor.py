"""The "floor": the perf suite's workloads written in plain JAX and jitted whole, so there is
no per-op overhead at all: the MLP and GPT training steps (forward, backward and AdamW in
one executable, parameters donated), the GPT forward (``gpt_infer``) and causal attention's
forward and backward at each of the suite's shapes (``attention``, ``--variant``). Same
shapes as ``workloads.py``; different random numbers, so the losses are not compared.

    python -m perf.jax_floor [--steps 10] [--warmup 3] [--only mlp_train,gpt_train,...]

It runs in this process with JAX's defaults (lazyrt is not imported, so neither its
compile options nor its malloc setting apply; run it under the same ``MALLOC_*``
environment to compare like with like).
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def _adamw(params, grads, m, v, t, lr, wd=0.01, b1=0.9, b2=0.999, eps=1e-8):
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)

    def upd(p, m, v):
        p = p * (1 - lr * wd)
        return p - lr * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps)

    return jax.tree.map(upd, params, m, v), m, v


def _ln(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * w + b


def _xent(logits, tgt):
    lp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(lp, tgt[:, None], 1).mean()


def mlp_setup(rng, W=1024, B=64):
    def lin(i, o):
        s = 1 / np.sqrt(i)
        return {"w": jnp.asarray(rng.uniform(-s, s, (o, i)), jnp.float32),
                "b": jnp.asarray(rng.uniform(-s, s, (o,)), jnp.float32)}

    params = [lin(W, W), lin(W, W), lin(W, 10)]
    x = jnp.asarray(rng.standard_normal((B, W)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, (B,)), jnp.int32)

    def loss_fn(p):
        h = jax.nn.relu(x @ p[0]["w"].T + p[0]["b"])
        h = jax.nn.relu(h @ p[1]["w"].T + p[1]["b"])
        return _xent(h @ p[2]["w"].T + p[2]["b"], y)

    return params, loss_fn, 1e-3


def gpt_setup(rng, V=512, D=256, H=4, L=2, T=128, B=8, forward_only=False):
    def P(*s):
        return jnp.asarray(rng.standard_normal(s) * 0.02, jnp.float32)

    def blk():
        return {"ln1w": jnp.ones(D), "ln1b": jnp.zeros(D), "qkvw": P(3 * D, D),
                "qkvb": jnp.zeros(3 * D), "projw": P(D, D), "projb": jnp.zeros(D),
                "ln2w": jnp.ones(D), "ln2b": jnp.zeros(D), "fc1w": P(4 * D, D),
                "fc1b": jnp.zeros(4 * D), "fc2w": P(D, 4 * D), "fc2b": jnp.zeros(D)}

    params = {"tok": P(V, D), "pos": P(T, D), "lnw": jnp.ones(D), "lnb": jnp.zeros(D),
              "head": P(V, D), "blocks": [blk() for _ in range(L)]}
    idx = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    tgt = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    causal = jnp.tril(jnp.ones((T, T), bool))

    def heads(z):
        return z.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)

    def logits_fn(p):
        x = p["tok"][idx] + p["pos"][jnp.arange(T)]
        for bp in p["blocks"]:
            q, k, v = jnp.split(_ln(x, bp["ln1w"], bp["ln1b"]) @ bp["qkvw"].T + bp["qkvb"], 3, -1)
            q, k, v = heads(q), heads(k), heads(v)
            s = jnp.where(causal, (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(D // H), -jnp.inf)
            a = (jax.nn.softmax(s, -1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            x = x + a @ bp["projw"].T + bp["projb"]
            h = _ln(x, bp["ln2w"], bp["ln2b"]) @ bp["fc1w"].T + bp["fc1b"]
            h = h * 0.5 * (1 + jax.scipy.special.erf(h * 0.7071067811865476))
            x = x + h @ bp["fc2w"].T + bp["fc2b"]
        return _ln(x, p["lnw"], p["lnb"]) @ p["head"].T

    if forward_only:
        return params, logits_fn

    def loss_fn(p):
        return _xent(logits_fn(p).reshape(-1, V), tgt.reshape(-1))

    return params, loss_fn, 3e-4


# Other sizes (``run(size=...)``; ``perf.device`` runs them beside lazyrt's): keyword
# arguments of the setups. "d1024" is the issue-38 GPT (vocab 8192, d 1024, seq 512,
# batch 16); "tiny" is ``perf.device --dry-run``'s.
SIZES = {
    "d1024": {"gpt": {"V": 8192, "D": 1024, "T": 512, "B": 16}, "mlp": {}},
    "tiny": {"gpt": {"V": 64, "D": 32, "T": 16, "B": 2}, "mlp": {"W": 32, "B": 4}},
}
# Training steps: setup(rng) -> (params, loss_fn, lr); jitted with AdamW in ``run``.
SETUPS = {"mlp_train": mlp_setup, "gpt_train": gpt_setup}
# The suite's attention shapes, (batch, heads, seq, head_dim), as in ``workloads.py``.
ATTENTION_SHAPES = {"b8h4s128d64": (8, 4, 128, 64), "b4h8s256d64": (4, 8, 256, 64),
                    "b2h8s512d64": (2, 8, 512, 64)}


def _size_kw(kind: str, size: str | None) -> dict:
    return {} if size in (None, "default") else SIZES[size][kind]


def _gpt_infer(rng, variant, size=None):
    params, logits_fn = gpt_setup(rng, forward_only=True, **_size_kw("gpt", size))
    f = jax.jit(lambda p: logits_fn(p).sum())
    return lambda i: f(params)


def attention_loss(q, k, v):
    """The attention workload's loss: causal SDPA on (batch, heads, seq, dim), then
    ``(o * o).mean()``. In the same row blocks as lazyrt's jnp path (64 rows below 256,
    else 128: block ``[r0, r1)`` against keys ``[0, r1)``), so the floor skips the same
    masked work."""
    t, d = q.shape[-2], q.shape[-1]
    # NOTE: lazyrt.lowering.attention._causal_blocks' rule, written again: the floor runs
    # without lazyrt (importing it would)
    bs = t if t < 128 else 64 if t < 256 else max(128, -(-t // 16))
    outs = []
    for r0 in range(0, t, bs):
        r1 = min(r0 + bs, t)
        keep = jnp.arange(r1)[None, :] <= jnp.arange(r0, r1)[:, None]
        s = jnp.where(keep, q[..., r0:r1, :] @ jnp.swapaxes(k[..., :r1, :], -1, -2) / np.sqrt(d),
                      -jnp.inf)
        outs.append(jax.nn.softmax(s, -1) @ v[..., :r1, :])
    o = jnp.concatenate(outs, -2)
    return (o * o).mean()


def _attention(rng, variant, size=None):
    b, h, t, d = ATTENTION_SHAPES[variant or next(iter(ATTENTION_SHAPES))]
    sc = 1.0 / np.sqrt(np.sqrt(d))
    q, k = (jnp.asarray(rng.standard_normal((b, h, t, d)) * sc, jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.standard_normal((b, h, t, d)), jnp.float32)
    # NOTE: written out in the workload's (batch, heads, seq, dim); on this CPU that is
    # faster than jax.nn.dot_product_attention's (batch, seq, heads, dim) einsums (22 vs
    # 56 ms at b4h8s256d64 here).
    f = jax.jit(jax.value_and_grad(attention_loss, argnums=(0, 1, 2)))
    return lambda i: f(q, k, v)[0]


def _train(name):
    def setup(rng, variant, size=None):
        params, loss_fn, lr = SETUPS[name](rng, **_size_kw(name[:3], size))

        def step(p, m, v, t):
            loss, g = jax.value_and_grad(loss_fn)(p)
            p, m, v = _adamw(p, g, m, v, t, lr)
            return p, m, v, loss

        f = jax.jit(step, donate_argnums=(0, 1, 2))
        state = [params, jax.tree.map(jnp.zeros_like, params),
                 jax.tree.map(jnp.zeros_like, params)]

        def run_step(i):
            p, m, v, loss = f(*state, float(i + 1))
            state[:] = [p, m, v]
            return loss

        return run_step

    return setup


_STEPS = {"mlp_train": _train("mlp_train"), "gpt_train": _train("gpt_train"),
          "gpt_infer": _gpt_infer, "attention": _attention}
# Every workload with a floor (``perf.suite``'s ``ONLY_FOR["jax"]`` lists the same).
FLOORS = tuple(_STEPS)


def run(name: str, steps: int, warmup: int, per_step: bool = False, variant: str | None = None,
        size: str | None = None):
    """Median ms per timed step and every step's loss (``per_step``: also each timed
    step's ms, in the middle). ``variant``: the attention shape; ``size``: a ``SIZES``
    key (None: the suite's sizes)."""
    if size not in (None, "default") and name == "attention":
        raise ValueError("attention has no other sizes (its variants are its shapes)")
    step = _STEPS[name](np.random.default_rng(0), variant, size)
    ts, losses = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        # the step ends when its loss is on the host, as in the perf workloads
        losses.append(float(step(i)))
        if i >= warmup:
            ts.append(time.perf_counter() - t0)
    med = statistics.median(ts) * 1e3
    if per_step:
        return med, [t * 1e3 for t in ts], losses
    return med, losses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.jax_floor")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default=",".join(FLOORS))
    a = ap.parse_args(argv)
    for name in [n.strip() for n in a.only.split(",") if n.strip()]:
        if name not in FLOORS:
            ap.error(f"unknown workload {name!r}; choose from {list(FLOORS)}")
        for variant in ATTENTION_SHAPES if name == "attention" else [None]:
            ms, losses = run(name, a.steps, a.warmup, variant=variant)
            label = name if variant is None else f"{name}/{variant}"
            print(f"{label:<22} plain-JAX whole-step jit: {ms:.2f} ms/step (jax "
                  f"{jax.__version__}, {jax.default_backend()}); loss {losses[0]:.4g} -> "
                  f"{losses[-1]:.4g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
