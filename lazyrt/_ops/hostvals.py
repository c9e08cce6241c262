"""Index values known on the host: an index whose storage still holds what the host wrote
(a transfer, ``zeros``/``ones``/``full``/``scalar_tensor`` of an integer dtype, and small
writes of such values into it, ``ind[-1] = 10``) is checked at the op (``bounds``), as on
the CPU, instead of on the device."""
from __future__ import annotations

import weakref

import numpy as np
import torch

from .._base.tensor import TpuTensor

_INTS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_SMALL = 1 << 16  # an index transferred with at most this many elements keeps its values


# Storage -> (its version when a host transfer wrote it, min, max, flat values or None)
_HOST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_transfer(t: TpuTensor, src: torch.Tensor) -> None:
    """``t``'s storage now holds the CPU tensor ``src`` as it is (``copy_``'s host
    transfer): remember its range (and its values, when small) while nothing rewrites it."""
    if src.dtype not in _INTS or src.numel() == 0:
        return
    lo, hi = torch.aminmax(src.reshape(-1))
    host = src.reshape(-1).numpy().copy() if src.numel() <= _SMALL else None
    _HOST[t._st] = (t._st.version, int(lo), int(hi), host)


def note_constant(t: TpuTensor, value) -> None:
    """``t`` was just made as ``full(value)`` (``zeros``, ``ones``, ``full`` of an integer
    dtype): its values are known on the host, as a transfer's."""
    if t.dtype not in _INTS or t.numel() == 0 or isinstance(value, (float, complex)):
        return
    v = int(value)
    host = np.full(t.numel(), v, dtype=np.int64) if t.numel() <= _SMALL else None
    _HOST[t._st] = (t._st.version, v, v, host)


def host_values(t) -> torch.Tensor | None:
    """``t``'s values when known on the host: a CPU tensor, or a tpu tensor that is the
    whole of a storage whose values are known (a small index, a scalar)."""
    if type(t) is not TpuTensor:
        return t if isinstance(t, torch.Tensor) and t.device.type == "cpu" else None
    known = _HOST.get(t._st)
    if known is None or known[0] != t._st.version or known[3] is None:
        return None
    if known[3].size == 1:  # a scalar: any view of it (``x[a:b] = 5`` expands one) is it
        return torch.from_numpy(known[3]).reshape(()).expand(t.shape)
    if t._chain is not None or known[3].size != t.numel():
        return None
    return torch.from_numpy(known[3]).reshape(t.shape)


def note_host_write(dst: TpuTensor, before: int, src) -> None:
    """``dst`` (a view of a 1-d storage whose values are known on the host as of version
    ``before``) was just overwritten with ``src``, whose values are known too
    (``ind[-1] = 10``): the host copy follows, so the index is still checked at the op."""
    st = dst._st
    known = _HOST.get(st)
    if known is None or known[0] != before or known[3] is None:
        return
    src = host_values(src)
    if src is None or src.dtype.is_complex:
        return
    host = known[3]
    if st.version == before or len(getattr(st.value, "shape", ())) != 1 or dst.numel() == 0:
        return
    pos = np.full((), dst.storage_offset(), dtype=np.int64)
    for n, k in zip(dst.shape, dst.stride()):
        pos = pos[..., None] + np.arange(n, dtype=np.int64) * k
    if pos.min() < 0 or pos.max() >= host.size:
        return
    new = host.copy()
    new[pos] = src.to(dst.dtype).expand(dst.shape).numpy()
    _HOST[st] = (st.version, int(new.min()), int(new.max()), new)


def _first_bad(a: np.ndarray, c):
    """The first out-of-range value of ``a`` for check ``c``, or None."""
    a = a.reshape(-1)
    bad = (a >= c.n) | (a < (-c.n if c.neg else 0))
    if c.ignore is not None:
        bad &= a != c.ignore
    k = int(np.argmax(bad)) if a.size else 0
    return int(a[k]) if a.size and bad[k] else None


UNKNOWN = object()


def on_host_value(c):
    """The first bad value of ``c``'s index known on the host (None: all in range), or
    ``UNKNOWN`` (a device value: checked on the device)."""
    t = c.index
    if type(t) is not TpuTensor:
        if type(t) is not torch.Tensor or t.device.type != "cpu":
            return None  # a tracer's tensor (the argument walk hands the op to it), a meta one
        return _first_bad(t.detach().numpy(), c)
    st = t._st
    known = _HOST.get(st)
    if known is None or known[0] != st.version:
        return UNKNOWN
    _, lo, hi, host = known
    if lo >= (-c.n if c.neg else 0) and hi < c.n:
        return None  # the storage's range is in range: so is any view of it
    if host is not None and (t._chain is None or (
            t.numel() == host.size and t.storage_offset() == 0 and t.is_contiguous())):
        return _first_bad(host, c)  # (a reshaped view of it reads the same values)
    return UNKNOWN
