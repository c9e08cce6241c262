"""The benchmark workloads.

Each workload is a class built with ``(device, mode, variant)``; everything random is made
on the CPU from a fixed seed and then moved to the device, so every mode starts from the
same numbers and the losses compare. ``step()`` runs one full timed step *including getting
the result* (``loss.item()`` or ``lazyrt.sync()`` on ``tpu``; nothing extra on ``cpu``) and
returns the step's loss (a float) or None. ``probe()`` (optional) returns a checksum of the
state for workloads whose step has no loss of its own; the runner calls it only outside the
measured window.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

SEED = 0


def _sync(device: str) -> None:
    if device == "cuda":  # PyTorch's own CUDA eager / inductor (``perf.device``'s peers)
        torch.cuda.synchronize()
        return
    if device != "cpu":
        import lazyrt

        lazyrt.sync()


def _rand(*shape, scale=1.0):
    return torch.randn(*shape) * scale


class Workload:
    name = ""
    unit = "ms/step"
    # ops per step, for per-op reporting (tiny_ops)
    ops_per_step: int | None = None
    training = False

    def __init__(self, device: str, mode: str, variant: str | None = None):
        self.device = device
        self.mode = mode
        self.variant = variant

    def step(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def probe(self):
        return None

    def describe(self) -> str:
        return ""

    def compile(self, step: bool) -> bool:
        """``torch.compile`` what this workload runs: its model (and, with ``step``, the
        optimizer step). Returns False where there is nothing to compile."""
        did = False
        if getattr(self, "model", None) is not None:
            self.model = torch.compile(self.model)
            did = True
        if step and getattr(self, "opt", None) is not None:
            self.opt.step = torch.compile(self.opt.step)
            did = True
        return did


# ---------------------------------------------------------------------------


class EwChain(Workload):
    """20 chained elementwise ops on a 1M-element float32 tensor, then sync.

    The mix is what training code chains (arithmetic, exp/tanh/erf/sigmoid/log1p, relu,
    clamp). No sin/cos: XLA's CPU sin/cos are ~8x slower than PyTorch's (9-10 ms vs ~1.1 ms
    per 1M floats here), which would make this a benchmark of one math routine instead of
    fusion and dispatch.
    """

    name = "ew_chain"

    def __init__(self, device, mode, variant=None):
        super().__init__(device, mode, variant)
        torch.manual_seed(SEED)
        self.x = _rand(1 << 20).to(device)
        self.out = None

    def _chain(self, x):
        y = x * 1.5          # 1
        y = y + 0.25         # 2
        y = torch.erf(y)     # 3
        y = y * y            # 4
        y = y - 0.5          # 5
        y = torch.tanh(y)    # 6
        y = torch.exp(y)     # 7
        y = y / 3.0          # 8
        y = torch.sqrt(y)    # 9
        y = y + x            # 10
        y = torch.abs(y)     # 11
        y = torch.sigmoid(y)  # 12
        y = y * 2.0          # 13
        y = torch.reciprocal(y)  # 14
        y = y + 1.0          # 15
        y = torch.log1p(y)   # 16
        y = torch.relu(y)    # 17
        y = y * x            # 18
        y = torch.clamp(y, -2.0, 2.0)  # 19
        y = y - x            # 20
        return y

    def step(self):
        self.out = None  # let the previous result go, as a loop would
        self.out = self._chain(self.x)
        _sync(self.device)

    def compile(self, step):
        self._chain = torch.compile(self._chain)
        return True

    def probe(self):
        return float(self.out.double().sum().item()) if self.device == "cpu" else float(
            self.out.sum().item())

    def describe(self):
        return "20 elementwise ops on 1M float32, then sync"


class TinyOps(Workload):
    """1000 small ops on a 4x4 tensor, then one sync: per-op cost."""

    name = "tiny_ops"
    ops_per_step = 1000

    # Floors measured in the same run (perf modes): ``floor_dispatch``, the same chain on a
    # ``__torch_dispatch__`` subclass that only returns a new wrapper tensor (the least a
    # Python device backend can cost per op), and ``floor_jit``, on JAX arrays with a
    # cached ``jax.jit`` call per op (the least a strict mode can cost per op).
    def __init__(self, device, mode, variant=None):
        super().__init__(device, mode, variant)
        torch.manual_seed(SEED)
        x = _rand(4, 4)
        a = torch.full((4, 4), 0.999)
        b = torch.full((4, 4), 0.001)
        self.out = None
        if mode == "floor_dispatch":
            self.x, self.a, self.b = (_NewWrapper(t) for t in (x, a, b))
        elif mode == "floor_jit":
            import jax
            import jax.numpy as jnp

            self.x, self.a, self.b = (jnp.asarray(t.numpy()) for t in (x, a, b))
            mul, add = jax.jit(lambda p, q: p * q), jax.jit(lambda p, q: p + q)

            def ops(y, a, b):
                for _ in range(self.ops_per_step // 2):
                    y = mul(y, a)
                    y = add(y, b)
                return y

            self._ops = ops
        else:
            self.x, self.a, self.b = x.to(device), a.to(device), b.to(device)

    def _ops(self, y, a, b):
        for _ in range(self.ops_per_step // 2):
            y = y * a
            y = y + b
        return y

    def step(self):
        self.out = self._ops(self.x, self.a, self.b)
        if self.mode == "floor_jit":
            self.out.block_until_ready()
        else:
            _sync(self.device)

    def compile(self, step):
        self._ops = torch.compile(self._ops)
        return True

    def probe(self):
        if self.mode == "floor_jit":
            return float(self.out.sum())
        if self.mode == "floor_dispatch":
            return None
        return float(self.out.sum().item())


class _NewWrapper(torch.Tensor):
    """``tiny_ops``' dispatch floor: every op returns a new wrapper of its first input."""

    @staticmethod
    def __new__(cls, elem):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype,
                                                device=elem.device)
        r.elem = elem
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _NewWrapper(args[0].elem)

    def describe(self):
        return "1000 ops (mul/add) on 4x4, then one sync"


# ---------------------------------------------------------------------------


class MLPTrain(Workload):
    """3-layer MLP, width 1024, batch 64, AdamW: zero_grad/forward/backward/step/loss.item()."""

    name = "mlp_train"
    training = True
    WIDTH, BATCH = 1024, 64  # (``perf.device --dry-run`` shrinks them)

    def __init__(self, device, mode, variant=None):
        super().__init__(device, mode, variant)
        torch.manual_seed(SEED)
        w = self.WIDTH
        self.model = nn.Sequential(
            nn.Linear(w, w), nn.ReLU(),
            nn.Linear(w, w), nn.ReLU(),
            nn.Linear(w, 10),
        ).to(device)
        self.x = _rand(self.BATCH, w).to(device)
        self.y = torch.randint(0, 10, (self.BATCH,)).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        return loss.item()

    def describe(self):
        return "MLP 1024-1024-1024-10, batch 64, AdamW"


class AdamWMany(Workload):
    """AdamW step alone over 200 params of 16k elements (foreach=False: the for-loop)."""

    name = "adamw_many"
    foreach = False
    training = True

    def __init__(self, device, mode, variant=None):
        super().__init__(device, mode, variant)
        torch.manual_seed(SEED)
        self.params = []
        for _ in range(200):
            p = _rand(128, 128).to(device).requires_grad_(True)
            p.grad = _rand(128, 128).to(device)
            self.params.append(p)
        kw = {} if self.foreach is None else {"foreach": self.foreach}
        self.opt = torch.optim.AdamW(self.params, lr=1e-2, **kw)
        from torch.optim.optimizer import _default_to_fused_or_foreach

        fused, foreach = _default_to_fused_or_foreach(self.params, False, False)
        self.default_impl = "fused" if fused else ("foreach" if foreach else "for-loop")

    def step(self):
        self.opt.step()
        _sync(self.device)

    def probe(self):
        return float(self.params[0].detach().sum().item())

    def describe(self):
        return (f"AdamW step, 200 x 16k params, foreach={self.foreach} "
                f"(torch's default here: {self.default_impl})")


class AdamWManyForeach(AdamWMany):
    """The same with foreach=True: the ``_foreach_*`` implementation (PyTorch's default for
    plain CPU tensors and, once it recognizes them, for tpu tensors)."""

    name = "adamw_many_foreach"
    # NOTE: explicit, not None: torch.optim's default picks foreach only for tensors whose
    # type is exactly Tensor/Parameter, which lazyrt's wrapper subclass is not (see
    # ``default_impl`` in the results).
    foreach = True


# ---------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.h, d // self.h).transpose(1, 2)
        k = k.view(b, t, self.h, d // self.h).transpose(1, 2)
        v = v.view(b, t, self.h, d // self.h).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x


class GPT(nn.Module):
    def __init__(self, vocab=512, d=256, h=4, layers=2, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, pos):
        x = self.tok(idx) + self.pos(pos)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


class GPTTrain(Workload):
    """2-layer GPT decoder (d 256, 4 heads, seq 128, batch 8, vocab 512), AdamW, full step."""

    name = "gpt_train"
    training = True
    VOCAB, SEQ, BATCH, D = 512, 128, 8, 256  # (``perf.device --dry-run`` shrinks them)

    def __init__(self, device, mode, variant=None):
        super().__init__(device, mode, variant)
        torch.manual_seed(SEED)
        self.model = GPT(vocab=self.VOCAB, d=self.D, seq=self.SEQ).to(device)
        data = torch.randint(0, self.VOCAB, (self.BATCH, self.SEQ + 1))
        self.idx = data[:, :-1].contiguous().to(device)
        self.tgt = data[:, 1:].contiguous().to(device)
        self.pos = torch.arange(self.SEQ).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(self.idx, self.pos)
        loss = F.cross_entropy(logits.view(-1, self.VOCAB), self.tgt.view(-1))
        loss.backward()
        self.opt.step()
        return loss.item()

    def describe(self):
        return "GPT 2L d256 h4 seq128 b8 V512, SDPA causal, AdamW"


class GPTInfer(GPTTrain):
    """The same model, forward only under no_grad; logits.sum().item()."""

    name = "gpt_infer"
    training = False

    def step(self):
        with torch.no_grad():
            logits = self.model(self.idx, self.pos)
            return logits.sum().item()

    def describe(self):
        return "GPT forward only (no_grad), logits.sum().item()"


# ---------------------------------------------------------------------------

ATTENTION_SHAPES = {
    # name: (batch, heads, seq, head_dim)
    "b8h4s128d64": (8, 4, 128, 64),
    "b4h8s256d64": (4, 8, 256, 64),
    "b2h8s512d64": (2, 8, 512, 64),
}


class Attention(Workload):
    """Causal SDPA forward + backward at one shape (the variant). The step ends when the
    gradients are computed (``lazyrt.sync()``), as a training step's are before its
    optimizer reads them; without it strict's step would end at the loss, with its
    backward still running into the next step."""

    name = "attention"

    def __init__(self, device, mode, variant=None):
        super().__init__(device, mode, variant)
        variant = variant or next(iter(ATTENTION_SHAPES))
        self.variant = variant
        shape = ATTENTION_SHAPES[variant]
        torch.manual_seed(SEED)
        s = 1.0 / math.sqrt(math.sqrt(shape[-1]))
        self.q = _rand(*shape, scale=s).to(device).requires_grad_(True)
        self.k = _rand(*shape, scale=s).to(device).requires_grad_(True)
        self.v = _rand(*shape).to(device).requires_grad_(True)

    @staticmethod
    def _loss(q, k, v):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (o * o).mean()

    def step(self):
        for t in (self.q, self.k, self.v):
            t.grad = None
        loss = self._loss(self.q, self.k, self.v)
        loss.backward()
        _sync(self.device)
        return loss.item()

    def compile(self, step):
        self._loss = torch.compile(self._loss)
        return True

    def probe(self):
        return float(self.q.grad.sum().item())

    def describe(self):
        b, h, s, d = ATTENTION_SHAPES[self.variant]
        return f"SDPA causal fwd+bwd B{b} H{h} S{s} D{d}"


# ---------------------------------------------------------------------------


def _rope(t, hd, device, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, device=device).float() / hd))
    freqs = torch.outer(torch.arange(t, device=device).float(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class LlamaBlock(nn.Module):
    def __init__(self, d, h, kv, hidden):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        hx = self.input_layernorm(x)
        q = self.q_proj(hx).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(hx).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(hx).view(b, t, self.kv, self.hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = self.h // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        hx = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(hx)) * self.up_proj(hx))


class Llama(nn.Module):
    """A Llama-like decoder (RMSNorm, rotary positions computed per call, grouped-query
    attention, SwiGLU), the way Hugging Face's LlamaForCausalLM computes it."""

    def __init__(self, vocab=512, d=256, h=4, kv=2, hidden=512, layers=2):
        super().__init__()
        self.hd = d // h
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaBlock(d, h, kv, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        cos, sin = _rope(idx.shape[1], self.hd, idx.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


class LlamaInfer(Workload):
    """2-layer Llama-like decoder forward (d 256, 4 heads, 2 kv heads, SwiGLU 512, seq 128,
    batch 1, vocab 512) under no_grad; the step reads the last position's top logit."""

    name = "llama_infer"
    VOCAB, SEQ, BATCH = 512, 128, 1

    def __init__(self, device, mode, variant=None):
        super().__init__(device, mode, variant)
        torch.manual_seed(SEED)
        self.model = Llama(vocab=self.VOCAB).eval().to(device)
        self.idx = torch.randint(0, self.VOCAB, (self.BATCH, self.SEQ)).to(device)

    def step(self):
        with torch.no_grad():
            logits = self.model(self.idx)
            return float(logits[:, -1].max().item())

    def describe(self):
        return "Llama-like decoder 2L d256 h4 kv2 seq128 b1 V512, forward under no_grad"


WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls
    for cls in (EwChain, TinyOps, MLPTrain, AdamWMany, AdamWManyForeach, GPTTrain, GPTInfer,
                Attention, LlamaInfer)
}
