"""Tokens per second of transformers' continuous batching (``model.generate_batch``, the
engine behind ``transformers serve``) on tpu against PyTorch CPU eager (docs/huggingface.md).
Reported, never asserted.

    python -m perf.serving [--modes strict,defer] [--requests 16] [--new 32] [--calls 3]
                           [--layers 2] [--hidden 64] [--threads N] [--profile]
                           [--attention lazyrt,transformers]

A Llama-like model built from a config (random init, no hub); ``--requests`` prompts of
different lengths (3 to 24 tokens), greedy decoding of ``--new`` tokens each, one
``generate_batch`` call per run with an explicit paged cache. CPU eager runs the same
calls first; then each tpu mode runs ``--calls`` calls in this process, each checked
against CPU's tokens. Per call: seconds, generated tokens per second, programs compiled
(``cache_misses``) and Dynamo graphs; then a table: call 1, the median later call, and
compiles. Every run of the batch pads to the same
sizes, so later calls compile nothing. ``--profile`` adds one uncounted call per tpu mode
and prints a cProfile of its generation thread (where ``generate_batch`` runs the model).
``--attention``: ``lazyrt`` runs the decode steps' attention as
``torch.ops.lazyrt.paged_attention`` over the cache's block table (``cb_paged_attention``,
the default on tpu); ``transformers`` turns that path off (``max_blocks_per_request=0``),
so every step runs transformers' own attention over the gathered, padded keys.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import threading
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


def _profiled(run):
    """``run`` with the generation thread's cProfile printed after it (top 25, cumulative)."""
    orig = threading.Thread.run
    prof = cProfile.Profile()

    def thread_run(self):
        prof.enable()
        try:
            orig(self)
        finally:
            prof.disable()

    threading.Thread.run = thread_run
    try:
        return run()
    finally:
        threading.Thread.run = orig
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def _run(model, prompts, new: int, blocks: int, profile: bool = False,
         max_blocks: int | None = None):
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=255,
                          pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=256, page_size=16,
                                  max_blocks_per_request=max_blocks)
    # NOTE: generate_batch runs gc.collect() twice; over this process's heap (torch, JAX,
    # transformers) that took 2.6 s, 4x CPU's whole generation. Frozen objects are not
    # scanned, so the call is timed as in a lean serving process, for CPU and tpu alike.
    gc.freeze()
    t0 = time.perf_counter()
    with torch.no_grad():
        def call():
            return model.generate_batch(prompts, generation_config=gen,
                                        continuous_batching_config=cb, progress_bar=False)
        out = _profiled(call) if profile else call()
    dt = time.perf_counter() - t0
    if len(out) != len(prompts):  # generate_batch logs a failed request and leaves it out
        raise RuntimeError(f"generate_batch returned {len(out)} of {len(prompts)} requests")
    return [r.generated_tokens for r in out.values()], dt  # in the order of the prompts


def serving_row(mode: str = "defer", peer: str = "cuda", requests: int = 16, new: int = 32,
                calls: int = 2, layers: int = 2, hidden: int = 64) -> dict:
    """``perf.device``'s serving row: ``generate_batch`` tokens/s of transformers' own on
    ``peer`` ("cuda"; "cpu" in a dry run) against lazyrt in ``mode`` on tpu, the same
    model, prompts and greedy decoding; ``calls`` calls each (the first compiles), the
    warm figure the median of the later ones. ``tokens_match``: the share of requests
    whose tokens equal the peer's (float32 rounding may flip a near tie)."""
    import transformers  # noqa: F401  (the client patches hook its import)

    import lazyrt

    model = _model(layers, hidden)
    prompts = _prompts(requests)
    blocks = 2 * sum((len(p) + new + 15) // 16 for p in prompts)
    res: dict = {"requests": requests, "new_tokens": new, "layers": layers, "hidden": hidden,
                 "peer": peer, "mode": mode}
    model.to(peer)
    ref, times = None, []
    for _ in range(calls):
        ref, dt = _run(model, prompts, new, blocks)
        times.append(dt)
    n_tok = sum(map(len, ref))
    res["tokens"] = n_tok
    res["peer_seconds"] = times
    res["peer_tokens_per_s"] = n_tok / statistics.median(times[1:] or times)
    model.to("tpu")
    lazyrt.set_mode(mode)
    times, compiles, match = [], [], 0.0
    for _ in range(calls):
        lazyrt.metrics.reset()
        got, dt = _run(model, prompts, new, blocks)
        times.append(dt)
        compiles.append(lazyrt.metrics.counters()["cache_misses"])
        match = sum(g == r for g, r in zip(got, ref, strict=True)) / len(ref)
    lazyrt.sync()
    res.update(lazyrt_seconds=times, lazyrt_compiles=compiles, tokens_match=match,
               lazyrt_tokens_per_s=n_tok / statistics.median(times[1:] or times), ok=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.serving")
    ap.add_argument("--modes", default="strict,defer")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: as is)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the generation thread of one more call per tpu mode")
    ap.add_argument("--attention", default="lazyrt,transformers",
                    help="tpu decode attention: lazyrt (paged_attention op), transformers")
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
    print(f"cpu eager: {n_tok} tokens, calls " + ", ".join(f"{t:.2f}" for t in cpu_times)
          + " s", flush=True)

    model.to("tpu")
    rows = [("cpu eager", cpu_times, [0] * len(cpu_times))]
    for mode, attn in [(m, t) for m in a.modes.split(",") for t in a.attention.split(",")]:
        lazyrt.set_mode(mode)
        max_blocks = 0 if attn == "transformers" else None
        times, compiles = [], []
        for call in range(a.calls):
            lazyrt.metrics.reset()
            got, dt = _run(model, prompts, a.new, blocks, max_blocks=max_blocks)
            c = lazyrt.metrics.counters()
            times.append(dt)
            compiles.append(c["cache_misses"])
            print(f"tpu {mode} {attn} attention call {call + 1}: tokens match CPU: "
                  f"{got == ref}, {dt:.2f} s, {sum(map(len, got)) / dt:.0f} tokens/s, "
                  f"compiles {c['cache_misses']}, paged_attention calls "
                  f"{c['paged_attention_calls']}, compiled graphs {c['compiled_graphs']}",
                  flush=True)
        if a.profile:  # one more call, not counted (cProfile slows it)
            print(f"tpu {mode}, one more call under cProfile, its generation thread:")
            _run(model, prompts, a.new, blocks, profile=True, max_blocks=max_blocks)
        lazyrt.sync()
        rows.append((f"tpu {mode}, {attn} attention", times, compiles))
    print("\n| mode | call 1 s | warm s (median) | warm tokens/s | compiles call 1 / later |")
    print("| --- | --- | --- | --- | --- |")
    for name, times, compiles in rows:
        w = statistics.median(times[1:] or times)
        print(f"| {name} | {times[0]:.2f} | {w:.2f} | {n_tok / w:.0f} | "
              f"{compiles[0]} / {sum(compiles[1:])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
