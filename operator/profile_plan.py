"""The profiling plan the operator writes on a profiling job's pods, for the node agent.

While a job profiles (phase ``Profiling`` with its window started, see
``reconcile``), each of its workers carries ``contract.PROFILE_ANNOTATION``:
``{"clocksMhz": [...], "sliceSeconds": s, "untilS": t}``, the clocks the simulator
profiles with for the operator's scheduler (its ``Profiling.sweep`` on the pod's
GPU type, ``powerflow.core.profiling``: PowerFlow's every 4th supported clock from the
top, PowerFlow+'s every 8th down to half the top; ascending) and ``s`` = the profiling window
divided by their number, so the sweep fills the window as the simulator's
does, and ``t`` the window's end (Unix seconds, ``status.allocation.
profilingUntil``). The window starts once every worker runs, but a worker
iterates only after its framework starts (imports, rendezvous, data: often a
minute or two); the agent starts the sweep at the first iteration and fits
the clocks into the time left before ``t``, so a late start shortens every
slice instead of cutting off the top clocks. The node agent
(``nodeagent.pods.parse_profile``) locks each clock in turn at iteration
boundaries and tags each window with its clock. Once the
window ends the annotation goes, and the agent returns to ``frequency-mhz``.

The text is a pure function of the GPU type and the window, written compactly
and always the same way, so a pass (or a restarted operator) that finds it
already on a pod writes nothing.
"""

from __future__ import annotations

import functools
import json

from powerflow.core.gpus import GpuSpec
from powerflow.core.profiling import PAPER_SWEEP, ClockSweep


@functools.lru_cache(maxsize=64)
def plan_annotation(
    gpu: GpuSpec, window_s: float, until_s: float, sweep: ClockSweep = PAPER_SWEEP
) -> str:
    """``contract.PROFILE_ANNOTATION``'s value for ``gpu`` and a ``window_s`` window
    ending at ``until_s`` (Unix seconds, kept to the millisecond as status keeps it),
    sweeping ``sweep``'s clocks."""
    clocks = sweep.clocks_mhz(gpu)
    slice_s = round(window_s / len(clocks), 3) or 0.001  # the agent needs a positive slice
    plan = {"clocksMhz": list(clocks), "sliceSeconds": slice_s, "untilS": round(until_s, 3)}
    return json.dumps(plan, separators=(",", ":"))
