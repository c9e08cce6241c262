"""RNG state of the tpu device.

The state is (seed, offset): every random op takes the next offset and passes a
52-bit mix of the two as a *runtime* scalar to its computation, where it becomes
a ``jax.random.PRNGKey``. So ``torch.manual_seed`` makes random ops reproducible,
and a loop that draws random numbers every step compiles once (the seed is an
input of the computation, never a constant).
"""
from __future__ import annotations

import itertools
import os
import threading
import weakref

import torch

_MASK64 = (1 << 64) - 1
# PyTorch's default seed of a new generator (c10/core/GeneratorImpl.h).
_DEFAULT_SEED = 67280421310721


def _mix(seed: int, offset: int) -> int:
    """A 52-bit seed for one random op: splitmix64 of seed and offset. (52 bits: a defer
    flush passes its runtime scalars as one float64 array, exact up to 2**53, so strict
    and defer draw the same values.)"""
    z = (seed + offset * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 12


class _Stream:
    """One (seed, offset) stream: the device's default one, or a tpu Generator's."""

    __slots__ = ("seed", "offset", "lock")

    def __init__(self, seed: int):
        self.seed = seed
        self.offset = 0
        # Threads drawing at once each get their own offset (+= is not atomic).
        self.lock = threading.Lock()

    def manual_seed(self, seed) -> None:
        with self.lock:
            self.seed = int(seed) & _MASK64
            self.offset = 0

    def next_seed(self) -> int:
        with self.lock:
            self.offset += 1
            offset = self.offset
        return _mix(self.seed, offset)

    def get_state(self) -> torch.Tensor:
        return torch.tensor([self.seed, self.offset], dtype=torch.uint64).view(torch.uint8)

    def set_state(self, state) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
            raise RuntimeError("RNG state must be a torch.ByteTensor of 16 bytes from "
                               "torch.tpu.get_rng_state() or a tpu Generator's get_state()")
        s, o = state.cpu().contiguous().view(torch.uint64).tolist()
        with self.lock:
            self.seed, self.offset = int(s), int(o)


_DEFAULT = _Stream(0)
manual_seed = _DEFAULT.manual_seed
next_seed = _DEFAULT.next_seed
get_state = _DEFAULT.get_state
set_state = _DEFAULT.set_state


def initial_seed() -> int:
    return _DEFAULT.seed


def seed_for(generator) -> int:
    """The seed of one random op called with ``generator=``: drawn from that generator,
    which must be a tpu one (PyTorch's error otherwise, as for a CPU generator on CUDA)."""
    if generator is None:
        return next_seed()
    if type(generator) is not Generator:
        # NOTE: a generator that went through a C++ kernel argument (factory ops) comes
        # back as a new torch._C.Generator around the same C++ generator; the tpu one is
        # found by the id it set as that generator's seed.
        found = _BY_ID.get(torch._C.Generator.initial_seed(generator))
        if found is None:
            raise RuntimeError(f"Expected a 'tpu' device type for generator but found "
                               f"'{generator.device.type}'")
        generator = found
    return generator._stream.next_seed()


# tpu generators by the id each sets as the seed of the CPU generator underneath
_IDS = itertools.count(0x7F5A_7075_0000_0000)
_BY_ID: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class Generator(torch._C.Generator):
    """``torch.Generator(device="tpu")``: a stream of its own for random ops called with
    ``generator=``. PyTorch's Python hooks for a PrivateUse1 backend cannot create device
    generators, so ``_patches._tpu_generators`` routes ``torch.Generator("tpu")`` here.
    Underneath it is a CPU generator object (unused), so PyTorch's argument parsing
    takes it."""

    def __init__(self, device=None):
        super().__init__()
        uid = next(_IDS)
        torch._C.Generator.manual_seed(self, uid)
        _BY_ID[uid] = self
        self._stream = _Stream(_DEFAULT_SEED)

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", 0)

    def manual_seed(self, seed) -> Generator:
        self._stream.manual_seed(seed)
        return self

    def seed(self) -> int:
        s = int.from_bytes(os.urandom(8), "little") >> 1
        self._stream.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._stream.seed

    def get_state(self) -> torch.Tensor:
        return self._stream.get_state()

    def set_state(self, state) -> Generator:
        self._stream.set_state(state)
        return self

    def __repr__(self) -> str:
        return f"<lazyrt tpu Generator seed={self._stream.seed} offset={self._stream.offset}>"
