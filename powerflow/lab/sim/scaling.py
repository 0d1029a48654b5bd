"""A trace's arrival rate scaled ``k`` times, for simulating a cluster ``k`` times larger.

``superpose(jobs, k)`` lays ``k`` copies of the trace over the same period: copy
0 is the trace itself, copy ``c`` is the trace shifted later by an offset drawn
(seeded) uniformly from ``[0, spread_s)``, and the jobs a shift carries past the
end of the trace's period wrap round to its start. Every job keeps its GPUs,
model, batch, iterations and duration; the scaled trace covers the same period
with ``k`` times the jobs, so its arrival rate, and the work it offers per
second, are ``k`` times the trace's. The bundled ITP trace, which contends on
64 x 8 GPUs, loads ``k x 64`` nodes the same way.

Why copies and not shorter gaps: dividing every inter-arrival time by ``k``
also raises the rate ``k`` times, but squeezes the trace's day of submissions
into ``24 / k`` hours (45 minutes at ``k = 32``) while every job still runs
for hours or days: a burst, then days of draining, on a cluster that holds
the same total work as the small one, so it is never loaded for long. A
cluster ``k`` times larger serves ``k`` times the users, and their
submissions add up: superposing ``k`` streams is that. Why shifted: unshifted
copies would submit ``k`` identical jobs at the same second. Why a bounded
shift (an hour by default) rather than any offset in the period: the ITP
trace's day has a shape (nine tenths of its submissions in 15 hours, almost
none in the evening), and copies shifted by up to an hour keep it at the
scale of hours, where offsets anywhere in the day would flatten it.

Job ids: copy 0 keeps the trace's; copy ``c`` appends ``~c``. Within each copy
the jobs keep their order and their gaps, except across the wrap. A trace
whose jobs are all submitted at once has no period: its copies are not
shifted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from powerflow.core.errors import DataError
from powerflow.lab.sim.trace import TraceJob

SPREAD_S = 3600.0
"""Default largest shift of a copy (see the module docstring)."""


def trace_period_s(jobs: Sequence[TraceJob]) -> float:
    """The period a trace of ``n`` jobs covers: from its first submission to its last,
    plus one mean gap between submissions (``span x n / (n - 1)``), so that the
    trace repeated end to end keeps its mean gap at the seam; 0 for one job or
    for jobs all submitted at once."""
    submits = [j.submit_s for j in jobs]
    span = max(submits) - min(submits)
    return span * len(submits) / (len(submits) - 1) if span > 0 else 0.0


def superpose(
    jobs: Sequence[TraceJob], k: int, *, seed: int = 0, spread_s: float = SPREAD_S
) -> tuple[TraceJob, ...]:
    """``k`` shifted copies of ``jobs`` over the trace's period (``trace_period_s``),
    sorted by submission time then id as the trace loaders return jobs; ``k = 1``
    gives the trace back. Seeded: the same ``seed`` gives the same trace."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DataError(f"the number of copies must be a positive integer, got {k!r}")
    if not spread_s >= 0 or not np.isfinite(spread_s):
        raise DataError(f"the spread must be a finite number of seconds >= 0, got {spread_s}")
    if not jobs:
        raise DataError("no jobs to scale")
    start = min(j.submit_s for j in jobs)
    period = trace_period_s(jobs)
    offsets = np.random.default_rng(seed).uniform(0.0, spread_s, size=k)
    offsets[0] = 0.0
    out = list(jobs)
    for c in range(1, k):
        shift = float(offsets[c])
        for job in jobs:
            t = (job.submit_s - start + shift) % period if period > 0 else job.submit_s - start
            out.append(replace(job, job_id=f"{job.job_id}~{c}", submit_s=start + t))
    if len({j.job_id for j in out}) != len(out):
        raise DataError("a copy's job id repeats a job id of the trace")
    return tuple(sorted(out, key=lambda j: (j.submit_s, j.job_id)))
