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
generation than the one kept is taken only if newer (a kept one the cluster no
longer shows is dropped: the job was deleted and created again); within a
generation the count only grows. A pass uses it only for the job's current
generation. A count at or past the job's ``iterations`` finishes the job once
a worker has exited or none runs, or a grace period after it arrived while they
all still do
(``lifecycle._done_by_count``): a trainer saves and evaluates after its last
step, and one hung in its teardown still ends.

Kept in memory by the leader (the ingest takes nothing on a follower): after a
failover the next post of each agent, a few seconds later, brings it back; a
pass before then estimates progress from the model, as it does for a trainer
that reports nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from powerflow.core.telemetry import JobProgress


class ReportedProgress:
    """Per job: the latest generation reported, the most iterations reported of it, and
    when that count first reached the job's ``spec.iterations`` (None: not yet)."""

    def __init__(self) -> None:
        self._best: dict[str, tuple[int, int, float | None]] = {}

    def report(
        self,
        progress: JobProgress,
        *,
        total: int | None = None,
        now_s: float = 0.0,
        generations: Collection[int] | None = None,
    ) -> None:
        """Keep ``progress`` if it is newer or further. ``generations``: the job's
        generations as the cluster shows them; a kept count of another one is a job
        deleted and created again under the same name, and is dropped."""
        key = f"{progress.namespace}/{progress.job}"
        kept = self._best.get(key)
        if kept is not None and generations is not None and kept[0] not in generations:
            kept = None
        if kept is not None and (progress.generation, progress.iterations) <= kept[:2]:
            return
        done_at = kept[2] if kept is not None and kept[0] == progress.generation else None
        if done_at is None and total is not None and progress.iterations >= total:
            done_at = now_s
        self._best[key] = (progress.generation, progress.iterations, done_at)

    def snapshot(self) -> Mapping[str, tuple[int, int, float | None]]:
        """Job key (``namespace/name``) -> (generation, iterations, when the count reached
        the job's iterations), a copy for one pass."""
        return dict(self._best)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget jobs no longer in the cluster (a deleted job's name may come back)."""
        alive = set(keys)
        for key in [k for k in self._best if k not in alive]:
            del self._best[key]
