"""Speed and accuracy targets: one ``<topic>_bench.py`` module per part, each with ``main()``.

``python -m benchmarks`` (or ``make bench``) runs them all; they are never unit tests.
"""

import os
import subprocess
import sys

_CHILD = "POWERFLOW_BENCH_PINNED_CHILD"


def pinned_child(module: str) -> bool:
    """Whether this process is the benchmark's pinned child.

    In the parent, runs ``python -m module`` with the same arguments in a child
    pinned to one core, with single-threaded BLAS (CPU times then measure one
    core's work on a shared machine), waits for it and returns False; in that
    child, returns True: the caller runs the benchmark.
    """
    if os.environ.get(_CHILD) == "1":
        return True
    threads = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    cpu = min(os.sched_getaffinity(0))
    subprocess.run(
        [sys.executable, "-m", module, *sys.argv[1:]],
        env={**os.environ, _CHILD: "1", **threads},
        check=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    return False
