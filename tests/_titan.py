"""torchtitan's llama3 debug model, run by its own trainer in subprocesses
(``tests/titan_launch.py``), for ``tests/test_torchtitan.py`` and ``docs/torchtitan.md``.

``make_assets(root)`` builds, in code, what the recipe reads relative to its working
directory: ``tests/assets/tokenizer`` (a byte-level BPE tokenizer with Llama 3's special
tokens) and ``tests/assets/c4_test`` (a json dataset). The dataset is one list of 200
documents written twice, so with 2 data-parallel ranks (torchtitan gives each rank a
contiguous half) both ranks read the same documents the 1-rank run reads: the 2-rank
global batch is the 1-rank batch twice, the mean loss and gradients the 1-rank ones.

``run(root, ...)`` runs the trainer (1 rank, or torchrun with 2) and returns the logged
``[[step, loss, grad_norm], ...]``; ``python tests/_titan.py DIR [args]`` runs it from a
shell (the commands of docs/torchtitan.md).
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "tests", "titan_launch.py")
SITE = os.path.join(ROOT, "tests", "titan_site")

# The recipe's command line (torchtitan 0.3.0), small shapes for a 2-core machine.
BASE_ARGS = [
    "--module", "llama3", "--config", "llama3_debugmodel",
    "--training.local-batch-size", "1", "--training.seq-len", "128",
    "--checkpoint.no-enable", "--validator.no-enable", "--metrics.log-freq", "1",
    "--debug.seed", "0",
]

_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "more no out so said what up its about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made after "
    "also did many before must through years where much your way well down should because "
    "each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might "
    "us great old year off come since against go came right used take three").split()


def make_assets(root: str) -> None:
    """``root/tests/assets/{tokenizer,c4_test}`` (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    assets = os.path.join(root, "tests", "assets")
    if os.path.exists(os.path.join(assets, "c4_test", "data.json")):
        return
    os.makedirs(os.path.join(assets, "tokenizer"), exist_ok=True)
    os.makedirs(os.path.join(assets, "c4_test"), exist_ok=True)
    rng = random.Random(0)
    docs = []
    for i in range(200):
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(30, 300)))
        docs.append({"text": text.capitalize() + ".", "timestamp": "2019-04-25T12:57:54Z",
                     "url": f"http://example.com/{i}"})
    with open(os.path.join(assets, "c4_test", "data.json"), "w") as f:
        for d in docs + docs:
            f.write(json.dumps(d) + "\n")
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([d["text"] for d in docs], trainer)
    tok.save(os.path.join(assets, "tokenizer", "tokenizer.json"))
    with open(os.path.join(assets, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": special[0], "eos_token": special[1], "add_bos_token": True,
                   "add_eos_token": True}, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(device: str, mode: str | None = None, init: str | None = None,
            losses: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, ROOT, env.get("PYTHONPATH")) if p)
    env["TITAN_DEVICE"] = device
    env["JAX_PLATFORMS"] = "cpu"
    env["OMP_NUM_THREADS"] = "1"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "TITAN_INIT", "TITAN_LOSSES", "TORCH_TPU_MODE"):
        env.pop(k, None)
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # no lazyrt in the reference
    if mode is not None:
        env["TORCH_TPU_MODE"] = mode
    if init is not None:
        env["TITAN_INIT"] = init
    if losses is not None:
        env["TITAN_LOSSES"] = losses
    return env


def command(nprocs: int = 1, args=()) -> list:
    if nprocs == 1:
        return [sys.executable, LAUNCH, *BASE_ARGS, *args]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nprocs}",
            "--master-addr=127.0.0.1", f"--master-port={_free_port()}", LAUNCH, *BASE_ARGS,
            *args]


def run(root: str, name: str, device: str = "tpu", mode: str | None = None, nprocs: int = 1,
        steps: int = 3, args=(), init: str | None = None, timeout: float = 900) -> list:
    """Train ``steps`` steps in ``root`` (assets made there); returns the logged
    ``[[step, loss, grad_norm], ...]``. The output is in ``root/name.log``; a failed or
    timed-out run raises with its tail."""
    make_assets(root)
    losses = os.path.join(root, f"{name}.losses.json")
    if os.path.exists(losses):
        os.remove(losses)
    cmd = command(nprocs, ["--training.steps", str(steps), "--dump-folder",
                           os.path.join(root, "out", name), *args, "activation-checkpoint:none"])
    log_path = os.path.join(root, f"{name}.log")
    with open(log_path, "w") as log:
        env = env_for(device, mode, init, losses)
        if nprocs == 1:  # its own rendezvous port (torchrun picks one for 2 ranks)
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        p = subprocess.Popen(cmd, cwd=root, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    with open(log_path) as f:
        text = f.read()
    if p.returncode != 0 or not os.path.exists(losses):
        tail = "\n".join(text.splitlines()[-60:])
        raise AssertionError(f"torchtitan run {name!r} failed (exit {p.returncode}):\n{tail}")
    with open(losses) as f:
        return json.load(f)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="run torchtitan's llama3 debug model")
    ap.add_argument("root", help="working directory (assets are made there)")
    ap.add_argument("--name", default="run")
    ap.add_argument("--device", default="tpu", choices=("tpu", "cpu"))
    ap.add_argument("--mode", default=None, choices=("strict", "defer", "debug"))
    ap.add_argument("--nprocs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--init", default=None, help="TITAN_INIT file")
    a, rest = ap.parse_known_args()  # the rest: more torchtitan arguments
    os.makedirs(a.root, exist_ok=True)
    out = run(a.root, a.name, a.device, a.mode, a.nprocs, a.steps, rest, a.init)
    for step, loss, gnorm in out:
        print(f"step {step}: loss {loss:.5f} grad_norm {gnorm:.4f}")
