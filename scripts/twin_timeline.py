"""The twin's mini trace with every DLJob status change timed, beside ``simulate``.

Runs what ``tests/test_twin.py`` runs (the first N jobs of the default trace at
``TimeScale(f)`` on 2 x 8 GPUs, every component) and the simulator's run of the
same jobs, then prints, job by job, both JCTs and both restart counts (the twin's
from the worker generations), and with ``--changes`` each change of the job's
phase, message and allocation with its time. It found the operator's churn that
docs/twin.md ("Churn") describes; it reads nothing but the API, so the same
file runs against older commits (copy it into a checkout of one).

    .venv/bin/python scripts/twin_timeline.py [--jobs 20] [--scale 0.01] [--changes]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from powerflow.core import contract
from powerflow.lab.twin.compare import agreement, simulate_mini
from powerflow.lab.twin.harness import Twin
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import NAMESPACE, mini_trace

DLJOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.PLURAL}"
"""Spelt out here, not imported, so that the file runs in older checkouts too."""

VOLATILE = ("conditions", "progress", "model", "energy", "observedGeneration")
"""Status fields that change without a decision (counters, the refit's model)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--changes", action="store_true", help="print every status change")
    args = parser.parse_args()
    scale = TimeScale(args.scale)
    jobs = mini_trace(args.jobs, scale)
    sim = simulate_mini(jobs, nodes=2, gpus_per_node=8, scale=scale)
    changes: dict[str, list[tuple[float, str]]] = {}
    generations: dict[str, int] = {}
    with (
        tempfile.TemporaryDirectory() as folder,
        Twin(Path(folder), nodes=2, gpus_per_node=8, scale=scale) as twin,
    ):
        start = time.monotonic() - min(j.job.submit_s for j in jobs)
        # What ``Twin.run`` polls: ``states`` (``phases`` in commits before it); answered
        # from the same list, so that watching adds no request to the run it times.
        polled = "states" if hasattr(twin, "states") else "phases"

        def watched() -> Any:
            assert twin.client is not None
            now = time.monotonic() - start
            answer: dict[str, Any] = {}
            for item in twin.client.get(DLJOBS).json()["items"]:
                name = item["metadata"]["name"]
                status: dict[str, Any] = {
                    k: v for k, v in (item.get("status") or {}).items() if k not in VOLATILE
                }
                generation = (status.get("allocation") or {}).get("generation", 0)
                generations[name] = max(generations.get(name, 0), int(generation))
                text = json.dumps(status, sort_keys=True)
                seen = changes.setdefault(name, [])
                if not seen or seen[-1][1] != text:
                    seen.append((now, text))
                phase = str(status.get("phase", ""))
                answer[name] = (phase, int(generation)) if polled == "states" else phase
            return answer

        setattr(twin, polled, watched)
        result = twin.run(jobs, timeout_s=900)
    print(agreement(result, sim).describe())
    by_id = {r.job_id: r for r in sim.jobs}
    print(f"{'job':16} {'JCT twin':>9} {'simulate':>9} {'restarts twin':>14} {'simulate':>9}")
    total = 0
    for outcome in result.jobs:
        record = by_id[outcome.name]
        restarts = max(generations.get(outcome.name, 1) - 1, 0)
        total += restarts
        print(
            f"{outcome.name:16} {outcome.jct_s:9.1f} {record.jct_s:9.1f} "
            f"{restarts:14d} {record.restarts:9d}"
        )
        if args.changes:
            for at, text in changes.get(outcome.name, []):
                print(f"    {at:7.2f} {text}")
    print(f"restarts: twin {total}, simulate {sum(r.restarts for r in sim.jobs)}")


if __name__ == "__main__":
    main()
