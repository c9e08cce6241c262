"""pytest plugin for ``perf.pytorch_suite``: a per-test time limit and a line per event.

Loaded with ``-p perf.pytorch_suite._plugin`` (before the test file is imported, so on tpu
lazyrt is installed before ``torch.testing._internal.common_device_type`` reads the
PrivateUse1 backend's name). Read from the environment:

- ``PT_SUITE_EVENTS``: the JSON-lines file this process appends to: ``collected`` (the test
  ids, after deselection), ``start`` (a test's id), ``report`` (its outcome, exception type
  and first message line, seconds);
- ``PT_SUITE_TIMEOUT``: seconds a test may run before ``SIGALRM`` fails it with
  ``SuiteTimeout`` (a ``BaseException``, so ``assertRaises(Exception)`` cannot swallow it);
- ``PT_SUITE_DONE``: a file of test ids already run (one a line), deselected here: the
  launcher restarts a process that died or hung, without the tests it finished;
- ``PT_SUITE_LAZYRT=1``: import lazyrt first (the tpu runs);
- ``PT_SUITE_SELECT``: a file of test keys (``perf.pytorch_suite.test_key``, one a line): only
  those tests run (the launcher's ``--sample``).
"""
from __future__ import annotations

import json
import os
import signal
import time

if os.environ.get("PT_SUITE_LAZYRT") == "1":
    import lazyrt  # noqa: F401

_EVENTS = os.environ.get("PT_SUITE_EVENTS")
_TIMEOUT = float(os.environ.get("PT_SUITE_TIMEOUT", "0") or 0)


class SuiteTimeout(BaseException):
    """A test ran past the suite's per-test limit."""


def _emit(**event) -> None:
    if not _EVENTS:
        return
    with open(_EVENTS, "a") as f:
        f.write(json.dumps(event) + "\n")
        f.flush()


def _test_id(nodeid: str) -> str:
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


import pytest  # noqa: E402


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    done_file = os.environ.get("PT_SUITE_DONE")
    done = set()
    if done_file and os.path.exists(done_file):
        with open(done_file) as f:
            done = {line.strip() for line in f if line.strip()}
    select = None
    select_file = os.environ.get("PT_SUITE_SELECT")
    if select_file:
        from perf.pytorch_suite import test_key

        with open(select_file) as f:
            select = {line.strip() for line in f if line.strip()}
    if done or select is not None:
        def wanted(it):
            tid = _test_id(it.nodeid)
            return tid not in done and (select is None or test_key(tid) in select)

        config.hook.pytest_deselected(items=[it for it in items if not wanted(it)])
        items[:] = [it for it in items if wanted(it)]


def pytest_collection_finish(session):
    _emit(kind="collected", ids=[_test_id(it.nodeid) for it in session.items])


def _on_alarm(signum, frame):
    raise SuiteTimeout(f"test ran past the suite's limit of {_TIMEOUT:g} s")


def _compiles() -> dict:
    """lazyrt's programs compiled so far, per op family (empty on CPU)."""
    if os.environ.get("PT_SUITE_LAZYRT") != "1":
        return {}
    from lazyrt._base.metrics import COMPILES_BY_OP

    return dict(COMPILES_BY_OP)


def pytest_runtest_protocol(item, nextitem):
    _emit(kind="start", id=_test_id(item.nodeid), t=time.time())
    _state.setdefault(_test_id(item.nodeid), {"outcome": "passed", "etype": "", "msg": "", "secs": 0.0,
                                              "_c0": _compiles()})
    return None


def pytest_runtest_call(item):
    if _TIMEOUT > 0:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, _TIMEOUT)


def pytest_runtest_teardown(item, nextitem):
    if _TIMEOUT > 0:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _crash_line(report) -> tuple[str, str]:
    """(exception type, first line of its message) of a failed report."""
    lr = report.longrepr
    crash = getattr(lr, "reprcrash", None)
    text = crash.message if crash is not None else str(lr)
    first = text.strip().splitlines()[0] if text.strip() else ""
    etype, sep, msg = first.partition(": ")
    if not sep or " " in etype.strip():
        # pytest's "Failed: ..." or a bare message: keep it whole
        return (etype.strip() if not sep else "Error"), first
    return etype.strip().split(".")[-1], msg


_state: dict = {}


def pytest_runtest_logreport(report):
    tid = _test_id(report.nodeid)
    st = _state.setdefault(tid, {"outcome": "passed", "etype": "", "msg": "", "secs": 0.0})
    st["secs"] += report.duration
    if report.when == "call" and hasattr(report, "wasxfail"):
        st["outcome"] = "xfailed" if report.skipped else "xpassed"
    elif report.skipped and st["outcome"] == "passed":
        st["outcome"] = "skipped"
        lr = report.longrepr
        st["msg"] = str(lr[2]) if isinstance(lr, tuple) and len(lr) == 3 else ""
    elif report.failed and st["outcome"] in ("passed", "skipped"):
        st["outcome"] = "failed" if report.when == "call" else f"error-{report.when}"
        st["etype"], st["msg"] = _crash_line(report)
        if "SuiteTimeout" in st["etype"] or "SuiteTimeout" in st["msg"]:
            st["outcome"] = "timeout"
    if report.when == "teardown":
        st = _state.pop(tid)
        c0, c1 = st.pop("_c0", {}), _compiles()
        st["compiles"] = {k: v - c0.get(k, 0) for k, v in c1.items() if v - c0.get(k, 0)}
        _emit(kind="report", id=tid, **st)
