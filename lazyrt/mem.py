"""``lazyrt-mem``: where a script's device memory (HBM) peak comes from.

    lazyrt-mem run [--mode strict|debug|defer] [--top N] [--json FILE] [--trace FILE]
                   [--plot FILE] SCRIPT [ARGS...]
    lazyrt-mem compare SCRIPT [ARGS...]
    lazyrt-mem read [--top N] TRACE

``run`` runs SCRIPT as ``python SCRIPT ARGS`` would (``__name__ == "__main__"``, its
``sys.argv``, its exit status) with every computation lazyrt runs logged (defer
flushes and strict per-op executions), then prints the top computations by HBM
peak and a summary. ``compare`` runs SCRIPT in strict and in defer mode (one
process each) and prints the two side by side. ``read`` prints the same report from a
``torch.profiler`` trace of tpu work (a ``.json``/``.json.gz`` file, or the folder
``tensorboard_trace_handler`` wrote). Also ``python -m lazyrt.mem``.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback

from ._memcli import export, profiler_trace, report

PROG = "lazyrt-mem"
MODES = ("strict", "debug", "defer")


def _err(msg: str) -> None:
    sys.stderr.write(f"{PROG}: error: {msg}\n")
    sys.stderr.flush()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Memory (HBM) profiler for scripts on lazyrt's tpu device.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", required=True)
    r = sub.add_parser("run", help="run a script and report its computations' HBM peaks",
                       description="Run SCRIPT as `python SCRIPT ARGS` would and report the "
                                   "HBM peak of every computation lazyrt ran.")
    r.add_argument("--mode", choices=MODES, default=None,
                   help="execution mode (default: TORCH_TPU_MODE, else strict)")
    r.add_argument("--top", type=int, default=10, metavar="N",
                   help="rows in the table of computations by HBM peak (default 10)")
    r.add_argument("--json", metavar="FILE", help="write every record and the summary as JSON")
    r.add_argument("--trace", metavar="FILE",
                   help="write a Chrome trace / Perfetto JSON (open in ui.perfetto.dev)")
    r.add_argument("--plot", metavar="FILE",
                   help="write a PNG timeline (needs matplotlib: pip install 'lazyrt[plot]')")
    r.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    r.add_argument("script", metavar="SCRIPT")
    r.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    c = sub.add_parser("compare", help="run a script in strict and in defer mode, side by side",
                       description="Run SCRIPT in strict and in defer mode (separate processes) "
                                   "and compare peaks, times and flush counts.")
    c.add_argument("script", metavar="SCRIPT")
    c.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    rd = sub.add_parser("read", help="report the computations in a torch.profiler trace",
                        description="Print the HBM report of a torch.profiler trace recorded "
                                    "around tpu work (a file, or a folder of traces).")
    rd.add_argument("--top", type=int, default=10, metavar="N",
                    help="rows in the table of computations by HBM peak (default 10)")
    rd.add_argument("trace", metavar="TRACE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "read":
        return _read(args)
    if not os.path.exists(args.script):
        _err(f"script not found: {args.script}")
        return 2
    if args.cmd == "run":
        return _run(args)
    return _compare(args)


# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------


class _Progress:
    """One updating line on stderr (only when it is a terminal)."""

    def __init__(self):
        self.n = 0
        self.last = 0.0
        self.shown = False

    def __call__(self, rec) -> None:
        self.n += 1
        now = time.monotonic()
        if now - self.last < 0.1:
            return
        self.last = now
        from ._base import memory

        sys.stderr.write(f"\r{PROG}: {self.n} computations, peak "
                         f"{report.fmt_bytes(memory._state['peak'])}\033[K")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _exit_status(e: SystemExit) -> tuple[int, str | None]:
    code = e.code
    if code is None:
        return 0, None
    if isinstance(code, int):
        return code, (f"sys.exit({code})" if code else None)
    sys.stderr.write(f"{code}\n")
    return 1, f"sys.exit({code!r})"


def _print_script_traceback(e: BaseException, script: str) -> None:
    """The script's traceback, without the frames of lazyrt-mem and runpy."""
    target = os.path.abspath(script)
    tb = e.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)
    sys.stderr.flush()


def _run_script(script: str, argv: list[str]) -> tuple[int, str | None, float]:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *argv]
    sys.path[0:1] = [os.path.dirname(os.path.abspath(script))]
    status, error = 0, None
    t0 = time.perf_counter()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        status, error = _exit_status(e)
    except KeyboardInterrupt as e:
        _print_script_traceback(e, script)
        status, error = 130, "KeyboardInterrupt"
    except BaseException as e:
        _print_script_traceback(e, script)
        status, error = 1, f"{type(e).__name__}: {e}".splitlines()[0][:200]
    finally:
        wall = time.perf_counter() - t0
        sys.argv = saved_argv
        sys.path[:] = saved_path
    return status, error, wall


def _run(args) -> int:
    if args.top < 1:
        _err("--top must be at least 1")
        return 2
    try:
        for path, what in ((args.json, "--json"), (args.trace, "--trace"), (args.plot, "--plot")):
            if path:
                export.check_writable(path, what)
    except export.OutputError as e:
        _err(str(e))
        return 2
    if args.plot and not export.plot_available():
        _err(export.PLOT_HINT)
        return 2
    if args.mode:
        # For lazyrt in subprocesses the script starts, and for this one below.
        os.environ["TORCH_TPU_MODE"] = args.mode

    import lazyrt

    from ._base import memory

    if args.mode:
        lazyrt.set_mode(args.mode)
    mode = lazyrt.get_mode()
    memory.LOG_STRICT[0] = True
    memory.clear_log()
    memory.reset_peak_memory_stats()
    progress = _Progress()
    if sys.stderr.isatty():
        memory.add_listener(progress)

    status, error, wall = _run_script(args.script, args.args)

    progress.clear()
    memory.LOG_STRICT[0] = False
    gc.collect()
    records = [r.as_dict() for r in memory.flush_log()]
    summary = report.summarize(records, mode=mode, script=args.script, argv=args.args,
                               exit_status=status, error=error, wall_seconds=wall)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    if not args.quiet:
        bar = "=" * 72
        print(f"\n{bar}\n{PROG}: {args.script} ({mode} mode)\n{bar}")
        print(report.table(records, args.top))
        print()
        print(report.summary_text(summary))
        sys.stdout.flush()
    rc = status
    for path, write in ((args.json, export.write_json), (args.trace, export.write_trace),
                        (args.plot, export.write_plot)):
        if not path:
            continue
        try:
            write(path, summary, records)
        except export.OutputError as e:
            _err(str(e))
            rc = rc or 2
            continue
        if not args.quiet:
            print(f"{PROG}: wrote {path}")
    return rc


def _read(args) -> int:
    try:
        summary, records = profiler_trace.load(args.trace)
    except profiler_trace.TraceError as e:
        _err(str(e))
        return 2
    print(f"{PROG}: {summary['script']} (torch.profiler trace)")
    print(report.table(records, max(args.top, 1)))
    print()
    print(report.summary_text(summary))
    return 0


# ---------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------


def _compare(args) -> int:
    results, rc = {}, 0
    with tempfile.TemporaryDirectory(prefix="lazyrt-mem-") as d:
        for mode in ("strict", "defer"):
            out = os.path.join(d, f"{mode}.json")
            cmd = [sys.executable, "-m", "lazyrt.mem", "run", "--quiet", "--mode", mode,
                   "--json", out, args.script, *args.args]
            env = dict(os.environ, TORCH_TPU_MODE=mode)
            sys.stderr.write(f"{PROG}: running {args.script} in {mode} mode ...\n")
            sys.stderr.flush()
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            try:
                with open(out) as f:
                    results[mode] = json.load(f)["summary"]
            except (OSError, ValueError, KeyError):
                results[mode] = None
            if p.returncode != 0:
                rc = 1
                tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
                _err(f"the {mode} run exited with status {p.returncode}:\n{tail}")
    print(f"{PROG} compare: {args.script} {' '.join(args.args)}".rstrip())
    print(report.compare_text(results))
    return rc


if __name__ == "__main__":
    sys.exit(main())
