"""The mini trace: the first jobs of the default trace, their iterations scaled down.

The same jobs go to the twin (as DLJobs) and to ``powerflow simulate`` (as a
trace CSV), so the two runs differ only in how they run them.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from powerflow.core import contract
from powerflow.lab.sim.trace import ITP_TRACE, TraceJob, bundled_trace, load_itp
from powerflow.lab.sim.world import default_world
from powerflow.lab.twin.timescale import DEFAULT, TimeScale

NAMESPACE = "ml"


@dataclass(frozen=True)
class MiniJob:
    """One job of the mini trace; ``name`` is its DLJob's."""

    name: str
    job: TraceJob


def mini_trace(
    jobs: int = 24,
    scale: TimeScale = DEFAULT,
    *,
    first: int = 0,
    max_duration_s: float | None = None,
) -> tuple[MiniJob, ...]:
    """Jobs ``first`` .. ``first + jobs - 1`` of the bundled ITP trace in submission order,
    each with ``ceil(iterations * scale)`` iterations (at least one), submitted at
    ``scale`` times its submission time (``timescale``: a smaller trace, same shape).
    ``max_duration_s``: only jobs the trace says took at most this long (so that a short
    run holds more jobs; submission times keep their place in the trace)."""
    if jobs < 1:
        raise ValueError("a mini trace needs at least one job")
    trace = sorted(
        load_itp(bundled_trace(ITP_TRACE), default_world().model_names),
        key=lambda j: (j.submit_s, j.job_id),
    )
    if max_duration_s is not None:
        trace = [j for j in trace if j.duration_s is not None and j.duration_s <= max_duration_s]
    chosen = trace[first : first + jobs]
    out = []
    for i, tj in enumerate(chosen):
        iterations = max(1, math.ceil(scale(tj.iterations)))
        small = replace(tj, iterations=iterations, submit_s=scale(tj.submit_s))
        out.append(MiniJob(f"j{i:02d}-{tj.model_name}", small))
    return tuple(out)


def write_csv(jobs: tuple[MiniJob, ...], path: Path) -> Path:
    """The jobs as a trace CSV ``powerflow simulate --trace`` reads (ITP columns)."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["job_id", "submit_time", "num_gpu", "model_name", "global_batch_size", "num_iteration"]
        )
        for m in jobs:
            j = m.job
            w.writerow(
                [
                    m.name,
                    f"{j.submit_s:g}",
                    j.num_gpu,
                    j.model_name,
                    j.global_batch_size,
                    int(j.iterations),
                ]
            )
    return path


def dljob(m: MiniJob, cluster_gpus: int) -> dict[str, Any]:
    """The DLJob a user would apply for ``m``: its model, batch and iterations, the
    GPUs the simulator lets the policy give it (1 .. min(cluster, batch), a power of two),
    and a trainer container (the twin's kubelet runs it as a simulated worker)."""
    j = m.job
    top = 1 << (min(cluster_gpus, j.global_batch_size).bit_length() - 1)
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": m.name, "namespace": NAMESPACE},
        "spec": {
            "model": j.model_name,
            "globalBatchSize": j.global_batch_size,
            "iterations": int(j.iterations),
            "gpus": {"requested": j.num_gpu, "min": 1, "max": max(top, j.num_gpu)},
            "template": {
                "spec": {"containers": [{"name": "trainer", "image": "powerflow/lab/twin-worker"}]}
            },
        },
    }
