"""lazyrt microbenchmarks: defer vs strict vs PyTorch CPU eager, side by side.

    python -m perf                       # every workload, modes strict,defer,cpu
    python -m perf --quick               # a few steps of each (smoke test)
    python -m perf --only ew_chain,mlp_train --modes strict,defer --json out.json
    python -m perf --list

Each (workload, mode) runs in a fresh subprocess (``python -m perf._worker``); see
``perf/suite.py`` for what is reported and ``perf/workloads.py`` for the workloads.
``python -m perf.bench_kernels`` (Pallas kernels vs XLA) is a separate script.
"""
