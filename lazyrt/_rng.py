"""RNG state of the tpu device.

The state is (seed, offset): every random op takes the next offset and passes a
64-bit mix of the two as a *runtime* scalar to its computation, where it becomes
a ``jax.random.PRNGKey``. So ``torch.manual_seed`` makes random ops reproducible,
and a loop that draws random numbers every step compiles once (the seed is an
input of the computation, never a constant).
"""
from __future__ import annotations

import threading

import torch

_MASK64 = (1 << 64) - 1
_seed = 0
_offset = 0
# Threads drawing at once each get their own offset (the += below is not atomic).
_LOCK = threading.Lock()


def manual_seed(seed: int) -> None:
    global _seed, _offset
    _seed = int(seed) & _MASK64
    _offset = 0


def initial_seed() -> int:
    return _seed


def next_seed() -> int:
    """A fresh 63-bit seed for one random op (splitmix64 of seed and offset)."""
    global _offset
    with _LOCK:
        _offset += 1
        offset = _offset
    z = (_seed + offset * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def get_state() -> torch.Tensor:
    return torch.tensor([_seed, _offset], dtype=torch.uint64).view(torch.uint8)


def set_state(state: torch.Tensor) -> None:
    global _seed, _offset
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        raise RuntimeError("RNG state must be a torch.ByteTensor of 16 bytes from torch.tpu.get_rng_state()")
    s, o = state.cpu().contiguous().view(torch.uint64).tolist()
    _seed, _offset = int(s), int(o)
