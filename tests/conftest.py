import atexit
import multiprocessing.process
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# NOTE: the tests run with the persistent compile cache on, as users do, but never with the
# user's (or any shared) one: a fresh directory per test process, inherited by the
# subprocesses it starts and deleted at its exit. The cache's own tests give their
# processes a directory each (tests/test_compile_cache.py).
_CACHE = tempfile.mkdtemp(prefix="lazyrt-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ["LAZYRT_CACHE_DIR"] = _CACHE

import pytest  # noqa: E402

import lazyrt  # noqa: E402

# (also when lazyrt was imported before this file, e.g. by a plugin, and read another dir)
lazyrt.config.cache_dir = _CACHE

MODES = ["strict", "defer"]


# ---- every test that starts a Python process carries @pytest.mark.subprocess ----------------
# (the fast inner loop deselects them: -m "not slow and not subprocess"). A Python process
# started by a test (its fixtures included) without the marker fails it.

_running: list = []  # the item whose setup, call or teardown runs now
_PY_BIN = os.path.dirname(os.path.realpath(sys.executable))


def _is_python(exe) -> bool:
    """``exe`` is this interpreter, another Python, or a console script next to it
    (``torchrun``, ``lazyrt-mem``)."""
    exe = os.fsdecode(exe)
    path = os.path.realpath(shutil.which(exe) or exe)
    return "python" in os.path.basename(path) or os.path.dirname(path) == _PY_BIN


def _check_started(what, exe):
    item = _running[-1] if _running else None
    if item is not None and item.get_closest_marker("subprocess") is None and _is_python(exe):
        raise AssertionError(f"{item.nodeid} starts a Python process ({what}: {exe}) but is not "
                             "marked @pytest.mark.subprocess")


_execute_child = subprocess.Popen._execute_child


def _execute_child_checked(self, args, executable, *rest, **kwargs):
    first = executable or (args if isinstance(args, (str, bytes)) else args[0])
    if isinstance(first, (str, bytes)) and isinstance(args, (str, bytes)) and not executable:
        first = first.split()[0] if first.split() else first
    _check_started("subprocess", first)
    return _execute_child(self, args, executable, *rest, **kwargs)


subprocess.Popen._execute_child = _execute_child_checked


def _start_checked(start):
    def checked(self):
        _check_started("multiprocessing", sys.executable)
        return start(self)
    return checked


multiprocessing.process.BaseProcess.start = _start_checked(multiprocessing.process.BaseProcess.start)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


# ---- sampled sweeps: @pytest.mark.sweep(every=k) -----------------------------------------------
# The default run keeps about one case in k of a parametrized test, chosen by a stable hash of
# the case's id with its mode left out: a chosen case runs in one mode (also by the hash, so
# both modes run), of those the test does not already leave to -m slow; at least one case of
# each test. The other cases are marked slow: -m slow runs them, -m "" the whole sweep.


def _sweep_case(item):
    """(the case's id without its mode, its mode or None)"""
    cs = item.callspec
    mode = cs.params.get("mode")
    if mode not in MODES:
        return cs.id, None
    parts = cs.id.split("-")
    parts.remove(mode)
    return "-".join(parts), mode


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    tests: dict = {}  # test function -> {case id without the mode: [its items]}
    for item in items:
        mark = item.get_closest_marker("sweep")
        if mark is None or getattr(item, "callspec", None) is None:
            continue
        every = mark.kwargs.get("every", mark.args[0] if mark.args else 1)
        key, _ = _sweep_case(item)
        cases = tests.setdefault((item.path, item.cls, item.originalname, every), {})
        cases.setdefault(key, []).append(item)
    for (*_, every), cases in tests.items():
        kept = []
        for key, group in cases.items():
            runnable = [it for it in group if it.get_closest_marker("slow") is None]
            h = zlib.crc32(key.encode())  # uniform in [0, 2**32)
            # (a larger k keeps a subset of what a smaller one keeps)
            if runnable and h * every < len(runnable) << 32:
                kept.append(runnable[h % len(runnable)])
        if not kept:  # the first case not already slow
            kept = [it for group in cases.values() for it in group
                    if it.get_closest_marker("slow") is None][:1]
        for group in cases.values():
            for it in group:
                if it not in kept:
                    it.add_marker(pytest.mark.slow)


@pytest.fixture(params=MODES)
def mode(request):
    with lazyrt.set_mode(request.param):
        yield request.param
    lazyrt.sync()


@pytest.fixture(autouse=True)
def _no_fallback_and_clean():
    prev = lazyrt.config.cpu_fallback
    lazyrt.config.cpu_fallback = False
    yield
    lazyrt.config.cpu_fallback = prev


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches empty before and after the test (modules of compile tests use it for
    every test: ``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``)."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def compile_at_first_run(monkeypatch):
    """Every program compiled at its first run (no host runs of cold programs on the CPU
    platform, ``lazyrt._exec.consts``, and every defer flush one compiled program, none
    run op by op, ``lazyrt._exec.coldflush``; subprocesses too): for tests that count
    compiles per shape or per value, which those would move to a program's 5th call, and
    for tests of what a flush's one program does (donation, its memory, its log record).
    Starts from no compiled program (plans dropped, ``invalidate_compiled``): a count of
    compiles does not hang on what an earlier test in the process compiled."""
    from lazyrt._exec import consts
    from lazyrt._ops import control

    monkeypatch.setattr(consts, "COLD_ENABLED", False)
    monkeypatch.setenv("LAZYRT_HOST_EVAL", "0")
    control.invalidate_compiled()


@pytest.fixture
def defer_mode():
    """The test runs in defer mode; what it left pending is flushed at its end."""
    with lazyrt.set_mode("defer"):
        yield
        lazyrt.sync()
