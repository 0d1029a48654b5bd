"""Jobs' progress as the node agents report it: the ingest writes, each pass reads.

The worker library reports its cumulative iteration count to its node's agent
(``powerflow.worker``), which passes each job's latest on with every post to
the ingest (``telemetry.JobProgress``). Progress so travels with the agent's
ServiceAccount token, checked like its samples, and no training pod needs any
right on the API server: a pod that could patch pods could rewrite another
job's clock and power-limit annotations.

What one report can move: the ingest takes a job's progress only from an agent
whose node holds a worker of that generation (``sample_checks.judge_progress``),
the agent that already sets that job's clocks there; a count for another
generation than the one kept is taken only if newer; within a generation the
count only grows. A pass uses it only for the job's current generation, and a
count at or past the job's ``iterations`` finishes the job, as its workers'
exit would.

Kept in memory by the leader (the ingest takes nothing on a follower): after a
failover the next post of each agent, a few seconds later, brings it back; a
pass before then estimates progress from the model, as it does for a trainer
that reports nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from powerflow.telemetry import JobProgress


class ReportedProgress:
    """The latest generation and the most iterations reported of it, per job."""

    def __init__(self) -> None:
        self._best: dict[str, tuple[int, int]] = {}

    def report(self, progress: JobProgress) -> None:
        key = f"{progress.namespace}/{progress.job}"
        kept = self._best.get(key)
        new = (progress.generation, progress.iterations)
        if kept is None or new > kept:
            self._best[key] = new

    def snapshot(self) -> Mapping[str, tuple[int, int]]:
        """Job key (``namespace/name``) -> (generation, iterations), a copy for one pass."""
        return dict(self._best)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget jobs no longer in the cluster (a deleted job's name may come back)."""
        alive = set(keys)
        for key in [k for k in self._best if k not in alive]:
            del self._best[key]
