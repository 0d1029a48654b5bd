"""The cyclic garbage collector held off during an allocation pass.

A pass (``reconcile``) allocates tens of thousands of containers (pod bodies,
status patches) and makes no reference cycles (only a job step that raises
does, through its traceback): its temporaries are freed by reference counting
as they go. With the collector on, those allocations trigger collections all
through the pass, none of which finds anything to free, and those of the
older generations walk the whole heap (the operator's modules, the cluster's
bodies): at 1,024 new jobs, half or more of the pass's CPU. ``paused`` holds
the collector off for the pass.

At the end it moves every tracked object to the oldest generation
(``gc.freeze`` then ``gc.unfreeze``, as both are documented: all into the
permanent generation, then all of it back into the oldest) instead of
collecting the youngest: the pass's output (its pod bodies, Services and
status patches, about six containers per pod) lives until the writes are
done and is then freed by reference counting, so a young collection walks
all of it to find nothing, and promotes it on to be walked again by the
middle generation's. Moved as a whole, it costs nothing, and the young
generation's counter starts again from 0 as after a collection. What was
young before the pass (another thread's objects) goes to the oldest
generation with it: garbage cycles among those wait for the next full
collection instead of a young one, which still come as the process promotes
objects; nothing is left uncollected. The operator freezes nothing else (an
object frozen on purpose would be unfrozen here).

Measured on the 2-core dev machine (``python -m benchmarks operator``, CPU
time of the pass, collector time from ``gc.callbacks``): at 1,024 new jobs on
4,096 GPUs (4,096 pods, 1,024 Services) the collector takes 90 to 150 ms of
the pass when left on (a full collection, about 11 of the middle
generation, about 120 young ones, all finding nothing); held off, a young
collection at the end takes 13 to 15 ms (about 38,000 containers), and the
promotion none. Over cycles of the pass and its writes (each body through
the Kubernetes client's ``sanitize_for_serialization`` and ``json.dumps``:
``python -m benchmarks.operator_gc_bench --cycles 20``), the collector's
time is 14 to 20 ms a cycle with the young collection and 0 with the
promotion, and the cycle's CPU 5 to 15 ms less (medians of two runs, about
320 to 340 ms a cycle): the collection is saved, not moved. A pass decides
the same either way (``tests/test_operator_gc_pause.py``).
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
    """Hold off automatic garbage collection for the block, then move every tracked
    object to the oldest generation (module docstring) and turn it back on, unless it
    was off before the (outermost) block. Nests and may be entered from several
    threads at once: the collector resumes when the last one leaves."""
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
                gc.freeze()  # everything to the permanent generation,
                gc.unfreeze()  # and all of that to the oldest: nothing walked
                gc.enable()
