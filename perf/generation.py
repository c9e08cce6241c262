"""Compiles per call and ms per token of Hugging Face ``generate()`` on tpu (docs/generation.md).
Reported, never asserted.

    python -m perf.generation [--mode strict|defer] [--cache dynamic|static] [--new 16]

A 2-layer Llama-like model built from a config (random init, no hub), a 6-token prompt,
greedy decoding of exactly ``--new`` tokens; three calls in one process, each checked
against PyTorch CPU's tokens.
"""
from __future__ import annotations

import argparse
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.generation")
    ap.add_argument("--mode", default="defer", choices=("strict", "defer"))
    ap.add_argument("--cache", default="dynamic", choices=("dynamic", "static"))
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--calls", type=int, default=3)
    a = ap.parse_args(argv)

    import transformers

    import lazyrt

    lazyrt.set_mode(a.mode)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, 6))
    kw = {"max_new_tokens": a.new, "min_new_tokens": a.new, "do_sample": False}
    if a.cache != "dynamic":
        kw["cache_implementation"] = a.cache
    t0 = time.perf_counter()
    ref = model.generate(ids, **kw)
    cpu_ms = 1000 * (time.perf_counter() - t0) / a.new
    model = model.to("tpu")
    for call in range(a.calls):
        lazyrt.metrics.reset()
        t0 = time.perf_counter()
        out = model.generate(ids.to("tpu"), **kw).cpu()
        dt = time.perf_counter() - t0
        c = lazyrt.metrics.counters()
        print(f"{a.mode} {a.cache} call {call + 1}: tokens match CPU: {out.tolist() == ref.tolist()}, "
              f"compiles {c['cache_misses']}, compiled graphs {c['compiled_graphs']}, "
              f"flushes {c['flushes']}, {1000 * dt / a.new:.1f} ms/token "
              f"(PyTorch CPU {cpu_ms:.1f} ms/token)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
