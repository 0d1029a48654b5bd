"""Progress and energy of the jobs whose workers run, written at most every
``progress_interval_s`` per job (``_account_all``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from powerflow.operator.actions import Actions
from powerflow.operator.job_view import _View
from powerflow.operator.progress import Running, account
from powerflow.operator.status import merge_diff

from powerflow.core.models.protocol import PerfModel
from powerflow.core.policy.snapshot import JobPlan
from powerflow.core.timefmt import format_time

DEFAULT_PROGRESS_INTERVAL_S = 30.0
_format_eta = format_time.__wrapped__
"""``format_time`` without its memo: each job's completion estimate is its own instant,
so the memo of the pass's few instants would only miss and evict for it."""
_new_tuple = tuple.__new__
"""A named tuple built from a tuple of every field, in order: what its generated
``__new__`` does, without that Python frame (``progress``' tuples, one per job)."""


def _account_all(
    actions: Actions,
    held: Sequence[tuple[_View, JobPlan]],
    models: Mapping[str, PerfModel],
    gpn: int,
    now_s: float,
    anchors: Mapping[str, float],
    interval_s: float = 0.0,
    written: Mapping[str, float] | None = None,
) -> None:
    """Progress and energy of every job holding GPUs (see ``progress``).

    Written at most every ``interval_s`` per job (``written``: when it last
    was), unless the job's status changes anyway or its spec did: an idle
    cluster then rests. A skipped write keeps the job's old anchor, so the
    iterations not written are counted at the next write.
    """
    jobs = []
    for v, jp in held:
        assert v.req is not None
        progress = v.status.get("progress") or {}
        jobs.append(
            _new_tuple(  # ``Running(...)`` without its ``__new__``'s frame: per job per pass
                Running,
                (
                    v.key,
                    models[v.key],
                    jp.gpus,
                    jp.local_batch_size,
                    jp.frequency_mhz,
                    v.req.iterations,
                    int(progress.get("iterations", 0)),
                    float((v.status.get("energy") or {}).get("joules", 0.0)),
                    v.reported,
                    v.running,
                ),
            )
        )
    accounts = account(jobs, gpn, now_s, anchors)
    written = written or {}
    for (v, _), job, acc in zip(held, jobs, accounts, strict=True):
        if acc is None:
            continue
        last = written.get(v.key)
        spec_seen = v.status.get("observedGeneration") == int(v.meta.get("generation", 1))
        recent = last is not None and now_s - last < interval_s
        if recent and spec_seen and not merge_diff(v.status, v.new):  # no write now
            if acc.anchor_s is not None:
                actions.anchors[v.key] = anchors.get(v.key, acc.anchor_s)
            continue
        total = job.iterations_total
        v.new["progress"] = {
            **(v.status.get("progress") or {}),
            "iterations": acc.iterations,
            "throughput": round(acc.throughput, 6),
            "estimatedCompletion": _format_eta(acc.eta_s),
            "summary": f"{acc.iterations}/{total}",
        }
        v.new["energy"] = {
            **(v.status.get("energy") or {}),
            "joules": round(acc.joules, 3),
            "watts": round(acc.watts, 3),
        }
        if acc.anchor_s is not None:
            actions.anchors[v.key] = acc.anchor_s


def _account_one(*args: Any) -> bool:
    """``_account_all`` for one job, under the guard (which wants a bool)."""
    _account_all(*args)
    return True
