"""The cyclic garbage collector held off during an allocation pass.

A pass (``reconcile``) allocates tens of thousands of containers (pod bodies,
status patches) and makes no reference cycles (only a job step that raises
does, through its traceback): its temporaries are freed by reference counting
as they go. With the collector on, those allocations trigger collections all
through the pass, none of which finds anything to free, and those of the
older generations walk the whole heap (the operator's modules, the cluster's
bodies): at 1,024 new jobs, half or more of the pass's CPU. ``paused`` holds
the collector off for the pass, then collects the youngest generation once
(what the next allocation would start anyway): the pass's output is walked
once, the collector's counters move on as after any young collection, and
the older generations get their turns outside passes.

Measured on the 2-core dev machine (``python -m benchmarks operator``, CPU
time of the pass, collector time from ``gc.callbacks``): at 1,024 new jobs on
4,096 GPUs (4,096 pods, 1,024 Services) the collector took 90 to 150 ms of
the pass (a full collection, about 11 of the middle generation, about 120
young ones, all finding nothing), and takes about 15 ms held off (the one
young collection at the end); at 256 new jobs on 512 GPUs, where a full
collection comes every few passes, the operator's mean CPU a pass went from
about 27 to 15 ms. The saving is not moved elsewhere: over a cycle of
reading the cluster (its bodies parsed from JSON), the pass, and writing
(each body serialized), the process's collector time went from about 320 to
about 220 ms a cycle at 1,024 new jobs (most of the rest is the read's). A
pass decides the same either way (``tests/test_operator_gc_pause.py``).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.RLock()  # a gc callback entering ``paused`` on this thread nests
_depth = 0
_resume = False


@contextmanager
def paused() -> Iterator[None]:
    """Hold off automatic garbage collection for the block, then collect generation 0
    and turn it back on, unless it was off before the (outermost) block. Nests and may
    be entered from several threads at once: the collector resumes when the last one
    leaves."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.collect(0)
                gc.enable()
