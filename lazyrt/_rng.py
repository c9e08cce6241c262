"""RNG state of the tpu device.

The state is (seed, offset): every random op takes the next offset and passes a
64-bit mix of the two as a *runtime* scalar to its computation, where it becomes
a ``jax.random.PRNGKey``. So ``torch.manual_seed`` makes random ops reproducible,
and a loop that draws random numbers every step compiles once (the seed is an
input of the computation, never a constant).
"""
from __future__ import annotations

import os
import threading
import weakref

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


def _mix(seed: int, offset: int) -> int:
    """A 52-bit seed for one random op: splitmix64 of seed and offset. (52 bits: a defer
    flush passes its runtime scalars as one float64 array, exact up to 2**53, so strict
    and defer draw the same values.)"""
    z = (seed + offset * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 12


def next_seed() -> int:
    """A fresh seed for one random op from the device's default stream."""
    global _offset
    with _LOCK:
        _offset += 1
        offset = _offset
    return _mix(_seed, offset)


def seed_for(generator) -> int:
    """The seed of one random op called with ``generator=``: drawn from that generator,
    which must be a tpu one (PyTorch's error otherwise, as for a CPU generator on CUDA)."""
    if generator is None:
        return next_seed()
    if type(generator) is not Generator:
        # NOTE: a generator that went through a C++ kernel argument (factory ops) comes
        # back as a new torch._C.Generator around the same C++ generator; the tpu one is
        # found by the id it set as that generator's seed.
        ref = _BY_ID.get(torch._C.Generator.initial_seed(generator))
        found = ref() if ref is not None else None
        if found is None:
            raise RuntimeError(f"Expected a 'tpu' device type for generator but found "
                               f"'{generator.device.type}'")
        generator = found
    return generator._next_seed()


def _pack(seed: int, offset: int) -> torch.Tensor:
    return torch.tensor([seed, offset], dtype=torch.uint64).view(torch.uint8)


def _unpack(state) -> tuple[int, int]:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        raise RuntimeError("RNG state must be a torch.ByteTensor of 16 bytes from "
                           "torch.tpu.get_rng_state() or a tpu Generator's get_state()")
    s, o = state.cpu().contiguous().view(torch.uint64).tolist()
    return int(s), int(o)


def get_state() -> torch.Tensor:
    return _pack(_seed, _offset)


def set_state(state: torch.Tensor) -> None:
    global _seed, _offset
    _seed, _offset = _unpack(state)


# tpu generators by the id each sets as the seed of the CPU generator underneath
_ID_BASE = 0x7F5A_7075_0000_0000
_IDS: list = []
_BY_ID: dict = {}
# PyTorch's default seed of a new generator (c10/core/GeneratorImpl.h).
_DEFAULT_SEED = 67280421310721


class Generator(torch._C.Generator):
    """``torch.Generator(device="tpu")``: a stream of its own, (seed, offset) as the
    device's default one, for random ops called with ``generator=``. PyTorch's Python
    hooks for a PrivateUse1 backend cannot create device generators, so
    ``_patches._tpu_generators`` routes ``torch.Generator("tpu")`` here. Underneath it is
    a CPU generator object (unused), so PyTorch's argument parsing takes it."""

    def __init__(self, device=None):
        super().__init__()
        with _LOCK:
            uid = _ID_BASE + len(_IDS)
            _IDS.append(uid)
        torch._C.Generator.manual_seed(self, uid)
        _BY_ID[uid] = weakref.ref(self)
        self._gseed = _DEFAULT_SEED
        self._goffset = 0
        self._glock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return torch.device("tpu", 0)

    def manual_seed(self, seed) -> Generator:
        with self._glock:
            self._gseed = int(seed) & _MASK64
            self._goffset = 0
        return self

    def seed(self) -> int:
        s = int.from_bytes(os.urandom(8), "little") >> 1
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._gseed

    def get_state(self) -> torch.Tensor:
        return _pack(self._gseed, self._goffset)

    def set_state(self, state) -> Generator:
        s, o = _unpack(state)
        with self._glock:
            self._gseed, self._goffset = s, o
        return self

    def _next_seed(self) -> int:
        with self._glock:
            self._goffset += 1
            return _mix(self._gseed, self._goffset)

    def __repr__(self) -> str:
        return f"<lazyrt tpu Generator seed={self._gseed} offset={self._goffset}>"
