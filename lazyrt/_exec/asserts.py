"""Asynchronous asserts (``torch._assert_async``): the condition stays on the device and
is read at the next sync point, as CUDA reports a failed device assert at a later sync.

``add`` keeps the condition's value (a ``Pending`` in defer mode: a storage held here,
so the next flush makes it one of its outputs, as any live tensor's) and ``check`` reads
the ones that are computed and raises for the first that is false:

  defer   at the end of every flush but a fusion window's segment (``_defer.flush``), for
          the conditions computed by then: a flush does not wait for its program (the one
          at the end of ``optimizer.step()`` stays asynchronous); the rest at the next host
          read, ``lazyrt.sync()`` or flush
  strict  at the next host read (``to_host``: ``.item()``, ``.cpu()``, ``print``) and at
          ``torch.tpu.synchronize()`` / ``lazyrt.sync()``; no op blocks on its own
  debug   at once, at the op

The error is PyTorch's own (``RuntimeError`` with the op's message), followed by the op and
the user's line that made the assert. An assert made by lazyrt itself (an index bounds
check, ``_ops.bounds``) gives a ``judge`` instead of a message: called with the condition's
host value, it returns None or the exception PyTorch raises (type and message). A check is
read once: after it raised, the asserts read with it are gone (how many more failed is in
the message). Checks still unread when the process exits are read then (``at_exit``,
registered by ``_exec.values``), and a failure is printed, never dropped.
"""
from __future__ import annotations

import sys

import jax
import numpy as np

from .._base.ir import Pending

# (storage holding the condition, PyTorch's message or a judge, what made the assert), in
# op order
_checks: list = []


# unread checks past which ``add`` reads the computed ones (a loop that never syncs, as a
# strict training loop without ``.item()``, would otherwise hold them all)
_DRAIN = 1024


def add(st, message, where: str) -> None:
    """Check ``st``'s value at the next sync point: a one-element condition with PyTorch's
    ``message``, or any value that ``message(host value)`` (a judge) turns into None or
    the exception to raise."""
    _checks.append((st, message, where))
    if len(_checks) >= _DRAIN:
        check(wait=False)


def count() -> int:
    return len(_checks)


def _verdict(v, message):
    """None if the check passed, else the exception PyTorch raises."""
    if type(message) is str:
        return None if bool(np.asarray(v).reshape(-1)[0]) else RuntimeError(message)
    return message(np.asarray(v))


def _error(err: Exception, where: str, more: int, when: str = "at a sync point") -> Exception:
    extra = f"; {more} more asynchronous assert(s) failed" if more else ""
    return type(err)(f"{err.args[0]}\n  (lazyrt: an asynchronous assert, {where}, checked "
                     f"{when}{extra})")


def check_now(v, message, where: str) -> None:
    """Debug mode: read the condition at once."""
    err = _verdict(v, message)
    if err is not None:
        raise _error(err, where, 0, "at once (debug mode)")


def check(wait: bool = True) -> None:
    """Read every computed condition (``wait=False``: every one whose program has finished);
    raise for the first false one."""
    if not _checks:
        return
    ready, waiting = [], []
    for c in _checks:
        v = c[0].value
        (waiting if type(v) is Pending or not (wait or v.is_ready()) else ready).append(c)
    if not ready:
        return
    _checks[:] = waiting
    # NOTE: one batched device-to-host read for all of them (each alone waits for its own
    # transfer)
    host = jax.device_get([st.value for st, _, _ in ready])
    bad = []
    for v, (_, m, w) in zip(host, ready):
        err = _verdict(v, m)
        if err is not None:
            bad.append((err, w))
    if bad:
        raise _error(bad[0][0], bad[0][1], len(bad) - 1)


def at_exit(materialize) -> None:
    """Read what no sync point read, ``materialize`` (``_defer``'s) computing what is still
    pending; a failure is printed (an exit handler cannot raise to the program)."""
    if not _checks:
        return
    try:
        for st, _, _ in _checks:
            if type(st.value) is Pending:
                st.value = materialize(st.value)
        check()
    except Exception as e:
        print(f"lazyrt: at exit: {type(e).__name__}: {e}", file=sys.stderr)
