"""Tokens per second of transformers' continuous batching (``model.generate_batch``, the
engine behind ``transformers serve``) on tpu against PyTorch CPU eager (docs/huggingface.md).
Reported, never asserted.

    python -m perf.serving [--modes strict,defer] [--requests 16] [--new 32] [--calls 3]
                           [--layers 2] [--hidden 64] [--threads N]

A Llama-like model built from a config (random init, no hub); ``--requests`` prompts of
different lengths (3 to 24 tokens), greedy decoding of ``--new`` tokens each, one
``generate_batch`` call per run with an explicit paged cache. CPU eager runs the same
calls first (its first call and its best warm call); then each tpu mode runs ``--calls``
calls in this process, each checked against CPU's tokens. Per call: seconds, generated
tokens per second, programs compiled (``cache_misses``) and Dynamo graphs. Every run of
the batch pads to the same sizes, so warm calls compile nothing.
"""
from __future__ import annotations

import argparse
import time

import torch


def _model(layers: int, hidden: int):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, initializer_range=0.5, pad_token_id=0,
        bos_token_id=1, eos_token_id=255)
    return transformers.LlamaForCausalLM(cfg).eval()


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = [3 + (7 * i) % 22 for i in range(n)]  # 3..24 tokens, every length differs nearby
    return [[1] + torch.randint(2, 250, (k - 1,), generator=g).tolist() for k in lengths]


def _run(model, prompts, new: int, blocks: int) -> tuple[list[list[int]], float]:
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    gc = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=255,
                          pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=256, page_size=16)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate_batch(prompts, generation_config=gc, continuous_batching_config=cb,
                                   progress_bar=False)
    dt = time.perf_counter() - t0
    if len(out) != len(prompts):  # generate_batch logs a failed request and leaves it out
        raise RuntimeError(f"generate_batch returned {len(out)} of {len(prompts)} requests")
    return [r.generated_tokens for r in out.values()], dt  # in the order of the prompts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.serving")
    ap.add_argument("--modes", default="strict,defer")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: as is)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    import transformers  # noqa: F401  (the client patches hook its import)

    import lazyrt

    model = _model(a.layers, a.hidden)
    prompts = _prompts(a.requests)
    pages = sum((len(p) + a.new + 15) // 16 for p in prompts)
    blocks = 2 * pages  # room for every request at once
    print(f"{a.requests} requests, prompts {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens, {a.new} new tokens each, {a.layers} layers, hidden {a.hidden}, "
          f"{blocks} cache pages of 16, torch threads {torch.get_num_threads()}", flush=True)

    ref, cpu_times = None, []
    for _ in range(a.calls):
        ref, dt = _run(model, prompts, a.new, blocks)
        cpu_times.append(dt)
    n_tok = sum(map(len, ref))
    warm = min(cpu_times[1:] or cpu_times)
    print(f"cpu eager: call 1 {cpu_times[0]:.2f} s, warm {warm:.2f} s, "
          f"{n_tok} tokens, {n_tok / warm:.0f} tokens/s warm", flush=True)

    model.to("tpu")
    for mode in a.modes.split(","):
        lazyrt.set_mode(mode)
        for call in range(a.calls):
            lazyrt.metrics.reset()
            got, dt = _run(model, prompts, a.new, blocks)
            c = lazyrt.metrics.counters()
            print(f"tpu {mode} call {call + 1}: tokens match CPU: {got == ref}, {dt:.2f} s, "
                  f"{sum(map(len, got)) / dt:.0f} tokens/s, compiles {c['cache_misses']}, "
                  f"compiled graphs {c['compiled_graphs']} (CPU eager warm "
                  f"{n_tok / warm:.0f} tokens/s)", flush=True)
        lazyrt.sync()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
