"""Run ranks as concurrent subprocesses on 127.0.0.1, with a hard timeout.

``launch(checks, nprocs=2)`` starts ``tests/dist_worker.py`` once per rank (env://
rendezvous on a free port), each rank runs the named checks in order and saves what they
return (``torch.save``) to a file; the results come back as one list per rank. A rank
that fails, or a launch that outlives its timeout (the whole process group is killed),
raises with the tail of every rank's output.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "dist_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank, world, port, extra):
    env = dict(os.environ)
    env.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
        "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
        "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        "LAZYRT_DIST_INIT_TIMEOUT": env.get("LAZYRT_DIST_INIT_TIMEOUT", "60"),
        "OMP_NUM_THREADS": "1",
        # a rank that fails waits this long in JAX's shutdown barrier before it exits
        "LAZYRT_DIST_SHUTDOWN_TIMEOUT": env.get("LAZYRT_DIST_SHUTDOWN_TIMEOUT", "20"),
    })
    env.pop("TORCH_TPU_MODE", None)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def launch(checks, nprocs: int = 2, timeout: float = 180, env=None, ranks=None,
           script: str = WORKER, args=()):
    """Run ``checks`` (names of functions in dist_worker.py) on ``nprocs`` ranks; returns
    ``[results of rank 0, results of rank 1, ...]`` (each a dict check -> its return).
    ``ranks``: start only these ranks (a missing-peer test)."""
    port = free_port()
    out_dir = tempfile.mkdtemp(prefix="lazyrt_dist_")
    procs = []
    logs = []
    for r in (range(nprocs) if ranks is None else ranks):
        log = open(os.path.join(out_dir, f"log{r}.txt"), "w+")
        cmd = [sys.executable, script, out_dir, ",".join(checks), *args]
        p = subprocess.Popen(cmd, env=_env(r, nprocs, port, env), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        procs.append((r, p))
        logs.append(log)
    deadline = time.monotonic() + timeout
    timed_out = False
    for _, p in procs:
        left = deadline - time.monotonic()
        try:
            p.wait(timeout=max(left, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for _, p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    text = {}
    for (r, _), log in zip(procs, logs):
        log.seek(0)
        text[r] = log.read()
        log.close()
    failed = [r for r, p in procs if p.returncode != 0]
    if timed_out or failed:
        tails = "\n".join(f"--- rank {r} (exit {p.returncode}) ---\n" + _tail(text[r])
                          for r, p in procs)
        raise LaunchError(f"timed out after {timeout:g}s" if timed_out else
                          f"rank(s) {failed} failed", tails, text,
                          {r: p.returncode for r, p in procs}, out_dir)
    results = []
    for r, _ in procs:
        path = os.path.join(out_dir, f"result{r}.pt")
        results.append(torch.load(path, weights_only=False) if os.path.exists(path) else None)
    return results


def launch_torchrun(checks, nprocs: int = 2, timeout: float = 180, env=None):
    """As ``launch``, but through ``torchrun`` (its elastic agent sets the env)."""
    port = free_port()
    out_dir = tempfile.mkdtemp(prefix="lazyrt_torchrun_")
    e = _env(0, nprocs, port, env)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nprocs}",
           "--master-addr=127.0.0.1", f"--master-port={port}", WORKER, out_dir, ",".join(checks)]
    p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, cwd=ROOT, text=True)
    try:
        text, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate()
        raise LaunchError(f"torchrun timed out after {timeout}s", _tail(text), {0: text}, {0: None},
                          out_dir) from None
    if p.returncode != 0:
        raise LaunchError(f"torchrun failed ({p.returncode})", _tail(text), {0: text},
                          {0: p.returncode}, out_dir)
    return [torch.load(os.path.join(out_dir, f"result{r}.pt"), weights_only=False)
            for r in range(nprocs)]


def check_items(results, train_atol: float = 1e-6) -> dict:
    """Assert every ``(name, got, expected)`` of every rank: same type, dtype, shape and
    values (bfloat16 to 1e-2 relative, float32 to 1e-5; training params and losses to
    ``train_atol`` absolute). Items with ``expected`` None are information; returned as
    {(rank, name): got} together with the training deviations."""
    info, failures = {}, []
    for rank, per_check in enumerate(results):
        for chk, items in per_check.items():
            for name, got, exp in items:
                if exp is None:
                    info[(rank, name)] = got
                    continue
                try:
                    _compare(name, got, exp, train_atol, info, rank)
                except AssertionError as e:
                    failures.append(f"rank {rank} [{chk}] {name}: {e}")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:40])
    return info


def _compare(name, got, exp, train_atol, info, rank):
    if isinstance(exp, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got).__name__}"
        assert got.dtype == exp.dtype, f"dtype {got.dtype} != {exp.dtype}"
        assert got.shape == exp.shape, f"shape {tuple(got.shape)} != {tuple(exp.shape)}"
        if " params" in name or name.endswith("losses"):
            dev = (got.double() - exp.double()).abs().max().item() if exp.numel() else 0.0
            info[(rank, name + " max deviation")] = max(dev, info.get((rank, name + " max deviation"), 0.0))
            assert dev <= train_atol, f"max deviation {dev:.3g} > {train_atol:g}"
        elif exp.dtype == torch.bfloat16:
            torch.testing.assert_close(got, exp, rtol=1e-2, atol=1e-2)
        elif exp.dtype.is_floating_point:
            torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(got, exp), f"{got} != {exp}"
    elif isinstance(exp, (list, tuple)) and exp and isinstance(exp[0], torch.Tensor):
        assert isinstance(got, (list, tuple)) and len(got) == len(exp), \
            f"expected {len(exp)} tensors, got {got!r:.200}"
        for i, (g, e) in enumerate(zip(got, exp)):
            try:
                _compare(name, g, e, train_atol, info, rank)
            except AssertionError as ex:
                raise AssertionError(f"[{i}] {ex}") from None
    else:
        assert got == exp, f"{got!r:.300} != {exp!r:.300}"


def _tail(s: str, n: int = 40) -> str:
    lines = [ln for ln in s.splitlines() if not ln.startswith(("W0", "I0", "[Gloo]"))]
    return "\n".join(lines[-n:])


class LaunchError(AssertionError):
    def __init__(self, msg, tails, logs, codes, out_dir=None):
        super().__init__(f"{msg}\n{tails}")
        self.logs = logs
        self.codes = codes
        self.out_dir = out_dir

    def result(self, rank: int):
        """What rank ``rank`` saved before it failed (None if it saved nothing)."""
        path = os.path.join(self.out_dir or "", f"result{rank}.pt")
        return torch.load(path, weights_only=False) if os.path.exists(path) else None
