"""Progress and energy of running jobs from their performance models (pure).

Without reports from the trainer, the operator estimates iterations done by
integrating the model's step time over the time all workers ran, and energy
as iterations times the model's energy per iteration. Whole iterations only:
the time that did not make a whole iteration stays in the job's anchor (the
instant its counted iterations reach), so frequent passes never round
progress away. Anchors live in the controller's memory; after a restart
counting resumes from the restart (an estimate; trainer reports win where they
are higher: the progress shown never goes back).

The model calls are batched: one broadcast call per distinct model object
(jobs sharing a prior share it), not two scalar calls per job. Named tuples,
not dataclasses: hundreds are built per pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from powerflow.core.models.protocol import PerfModel

_new_tuple = tuple.__new__


class Running(NamedTuple):
    """One job that holds GPUs after this pass."""

    key: str
    model: PerfModel
    gpus: int
    local_batch_size: int
    frequency_mhz: int
    iterations_total: int
    iterations_done: int
    joules: float
    reported: int | None
    workers_running: bool


class Account(NamedTuple):
    """What goes into the job's status: progress, energy, and its next anchor."""

    iterations: int
    throughput: float
    eta_s: float
    joules: float
    watts: float
    anchor_s: float | None


def predict(jobs: Sequence[Running], gpus_per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """Step time (s) and energy per iteration (J) of each job, one call per model."""
    t = np.full(len(jobs), np.nan)
    e = np.full(len(jobs), np.nan)
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(id(job.model), []).append(i)
    for idx in groups.values():
        model = jobs[idx[0]].model
        n = np.asarray([jobs[i].gpus for i in idx], dtype=np.float64)
        r = np.minimum(n, gpus_per_node)
        bs = np.asarray([jobs[i].local_batch_size for i in idx], dtype=np.float64)
        f = np.asarray([jobs[i].frequency_mhz for i in idx], dtype=np.float64)
        shape = (len(idx),)
        t[idx] = np.broadcast_to(np.asarray(model.step_time_s(n, r, bs, f), float), shape)
        e[idx] = np.broadcast_to(np.asarray(model.energy_per_iter_j(n, r, bs, f), float), shape)
    return t, e


def account(
    jobs: Sequence[Running],
    gpus_per_node: int,
    now_s: float,
    anchors: Mapping[str, float],
) -> list[Account | None]:
    """Each job's account, ``None`` where its model gives no finite positive step time."""
    t_all, e_all = predict(jobs, gpus_per_node)
    out: list[Account | None] = []
    for job, t, e in zip(jobs, t_all.tolist(), e_all.tolist(), strict=True):
        if not (math.isfinite(t) and math.isfinite(e) and t > 0):
            out.append(None)
            continue
        # ``max(a, b)`` written as ``b if b > a else a`` (what ``max`` returns for two
        # numbers, NaN included), ``min`` alike: a builtin call per bound cost more than
        # the arithmetic, for every job of every pass.
        done = job.iterations_done
        anchor: float | None = None
        if job.reported is not None:
            # Progress shown never goes back: a count below what the status holds is a
            # report that lags an estimate (an operator restarted before the agents'
            # next post) or a resumed run redoing iterations done once already.
            reported = job.reported
            done, anchor = (done if done > reported else reported), now_s
        elif job.workers_running:
            anchor = anchors.get(job.key, now_s)
            waited = now_s - anchor
            whole = int((0.0 if waited < 0.0 else waited) // t)
            # Never estimate the job to completion: only the trainer or its pods finish it.
            left = job.iterations_total - 1 - done
            whole = left if left < whole else whole
            done += 0 if whole < 0 else whole
            anchor += (0 if whole < 0 else whole) * t
        gained = done - job.iterations_done
        remaining = job.iterations_total - done
        out.append(
            _new_tuple(  # ``Account(...)`` without its ``__new__``'s frame: per job per pass
                Account,
                (
                    0 if done < 0 else done,  # iterations
                    1.0 / t,  # throughput
                    now_s + (0 if remaining < 0 else remaining) * t,  # eta_s
                    job.joules + (0 if gained < 0 else gained) * e,  # joules
                    e / t if job.workers_running else 0.0,  # watts
                    anchor if job.workers_running else None,  # anchor_s
                ),
            )
        )
    return out
