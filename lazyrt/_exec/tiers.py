"""The compile worker: one background thread that builds the optimized executables of
programs first compiled at a low optimization level, and writes executables to the
persistent cache, so neither waits in the thread that records ops or runs a flush.

Bounded: one thread and at most ``QUEUE_SIZE`` waiting jobs. A program compiled while the
queue is full is compiled at full optimization at once, as without tiering (``has_room``),
and a cache write that finds the queue full is dropped. A job's failure never reaches the
user's code: the program keeps the executable it has (``tier_failures`` counts them).

At interpreter exit the worker finishes the job in hand (a compile cannot be abandoned
half-way while JAX's backend is torn down), writes what is waiting to be written, and
skips the compiles still waiting (``tier_skipped``): their programs were stored at the
first tier already, so the next process starts warm all the same and upgrades them.
"""
from __future__ import annotations

import atexit
import queue
import threading
import warnings

from .._base.metrics import COUNTERS

QUEUE_SIZE = 1024
COMPILE, WRITE = "compile", "write"

_q: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
_state = {"thread": None, "closing": False, "warned": False}
_start_lock = threading.Lock()


def has_room() -> bool:
    """Whether a job submitted now will be taken (the queue is not full, not exiting)."""
    return not _state["closing"] and not _q.full()


def submit(kind: str, job) -> bool:
    """Run ``job()`` on the worker; False if it was not taken (queue full, or exiting)."""
    if _state["closing"]:
        return False
    if _state["thread"] is None:
        _start()
    try:
        _q.put_nowait((kind, job))
    except queue.Full:
        COUNTERS["tier_dropped"] += 1
        return False
    return True


def drain(timeout: float | None = None) -> bool:
    """Wait until every submitted job has run; False if ``timeout`` passed first."""
    if timeout is None:
        _q.join()
        return True
    done = threading.Event()

    def waiter():
        _q.join()
        done.set()

    threading.Thread(target=waiter, daemon=True).start()
    return done.wait(timeout)


def pending() -> int:
    return _q.unfinished_tasks


def _start() -> None:
    with _start_lock:
        if _state["thread"] is None:
            t = threading.Thread(target=_loop, name="lazyrt-compile", daemon=True)
            t.start()
            _state["thread"] = t


def _loop() -> None:
    while True:
        try:
            kind, job = _q.get(timeout=0.2)
        except queue.Empty:
            if _state["closing"]:
                return
            continue
        try:
            if _state["closing"] and kind == COMPILE:
                COUNTERS["tier_skipped"] += 1
            else:
                job()
        except Exception as e:  # reported, never raised into user code
            COUNTERS["tier_failures"] += 1
            if not _state["warned"]:
                _state["warned"] = True
                warnings.warn(_failure_message(kind, e), RuntimeWarning, stacklevel=1)
        finally:
            _q.task_done()


def _failure_message(kind: str, e: Exception) -> str:
    """What a failed job means for the user's program, and what they can do."""
    err = f"{type(e).__name__}: {e}"
    if kind == COMPILE:
        return (f"lazyrt: the background build of a program's optimized executable failed "
                f"({err}). The program keeps running correctly at its quick first-tier "
                "build, only slower; LAZYRT_COMPILE=full (the default) builds every program "
                "fully at once. Please report this error to lazyrt.")
    return (f"lazyrt: writing a compiled program to the compile cache failed ({err}). The "
            "program runs as compiled; a later process compiles it again. Check the cache "
            "directory (LAZYRT_CACHE_DIR names another one, LAZYRT_CACHE_DIR=off turns the "
            "cache off), and please report this error to lazyrt if it persists.")


@atexit.register
def _close() -> None:
    # NOTE: registered after JAX's own exit handlers (jax is imported first), so this runs
    # before them: the backend is still alive while the job in hand finishes.
    _state["closing"] = True
    t = _state["thread"]
    if t is not None:
        t.join()
