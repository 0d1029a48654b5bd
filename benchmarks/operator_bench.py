"""Time the operator: reaction in the emulator and one allocation pass at scale.

Targets: a DLJob created -> its worker pods created in under 1 s against the
emulated API server (``powerflow.lab.twin.emulator``, real HTTP, kopf in its own
thread); one allocation pass (snapshot build + policy + plan translation,
``reconcile``) under 50 ms of the operator's own CPU for 256 jobs on 512 GPUs
and 1,024 jobs on 4,096 GPUs (nodes of 8 A100s, PowerFlowPolicy, synthetic
models, budget eta 0.7), both cold (every job new: each is parsed, every pod
and Service built) and steady (the jobs running, their requests parsed).

How a pass's CPU is split, per pass: ``CPU`` is this thread's CPU time
(``time.thread_time``) over the pass as the controller runs it
(``reconcile`` inside ``gc_pause.paused``, what it does at the end
included; what it leaves to the collector after the pass:
``operator_gc_bench``); ``policy`` is the thread's CPU time inside every ``plan`` call
that pass made, summed (``TimedPolicy``: a pass may call it once, or not at
all); ``operator`` is that pass's ``CPU`` less its own ``policy``. The plan
calls run on the same thread inside the same interval (checked), so
``policy`` <= ``CPU`` and no column can go negative; the table shows the
median over the repeats of each column, so ``operator`` is the median of the
per-pass differences, not the difference of the medians.

    python -m benchmarks.operator_bench [--repeat 20] [--reactions 5]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from powerflow.operator import gc_pause
from powerflow.operator.actions import Actions, Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.jobs import JobRequest, RequestCache
from powerflow.operator.pass_inputs import PassMemory
from powerflow.operator.reconcile import reconcile
from rich.console import Console
from rich.table import Table

from powerflow.core import contract
from powerflow.core.gpus import A100
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Node, Plan, Snapshot
from powerflow.lab.synthetic import SyntheticModel, synthetic_zoo

TESTS = Path(__file__).resolve().parent.parent / "tests"


def dljob(name: str, requested: int, seed: int) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "generation": 1},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 1000 + 100 * seed,
            "gpus": {"requested": requested, "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }


def steady(observed: list[Observed], actions: Any) -> list[Observed]:
    """The cluster after the first pass was carried out and the jobs settled: status
    written, pods created, bound by the extender (placement annotation) and running,
    each job's GPU count profiled."""
    patches = {name: patch for _, name, patch in actions.status}
    blocks = {jp.job_id.split("/")[1]: jp.placement for jp in actions.plan.jobs}
    pods: dict[str, list[Any]] = {}
    for b in actions.create:
        if b["kind"] == "Pod":
            job = b["metadata"]["labels"][contract.JOB_LABEL]
            block = [list(slot) for slot in blocks[job]]
            placement = json.dumps({"node": block[0][0], "block": block})
            b = dict(b, status={"phase": "Running"})
            b["metadata"] = dict(
                b["metadata"],
                annotations={
                    **b["metadata"]["annotations"],
                    contract.PLACEMENT_ANNOTATION: placement,
                },
            )
            pods.setdefault(job, []).append(b)
    out = []
    for o in observed:
        name = o.body["metadata"]["name"]
        status = dict(patches.get(name, {}))
        if status.get("phase") == "Profiling":
            gpus = status["allocation"]["gpus"]
            status.update(phase="Running", model={"profiledGpuCounts": [gpus]})
        body = dict(o.body, status=status)
        out.append(Observed(body, tuple(pods.get(name, ()))))  # type: ignore[arg-type]
    return out


@dataclass
class TimedPolicy:
    """The policy, with the CPU time spent in ``plan`` (the rest of a pass is the
    operator's). ``take`` is the time since the last ``take``: a pass may call ``plan``
    more than once, or not at all, so each pass's share is summed, never paired with
    one call. Every call must come from ``thread`` (the one whose CPU time the pass is
    measured by): another thread's time would not be inside the pass's."""

    policy: PowerFlowPolicy
    thread: int = field(default_factory=threading.get_ident)
    _seconds: float = 0.0

    def plan(self, snapshot: Snapshot) -> Plan:
        assert threading.get_ident() == self.thread, "plan called off the timed thread"
        t0 = time.thread_time()
        try:
            return self.policy.plan(snapshot)
        finally:
            self._seconds += time.thread_time() - t0

    def take(self) -> float:
        spent, self._seconds = self._seconds, 0.0
        return spent


def _timed(fn: Any, policy: TimedPolicy) -> tuple[Any, float, float, float]:
    """``fn()`` under ``gc_pause.paused`` (as the controller runs a pass), its wall
    time, its CPU time (this thread, what ``paused`` does at the end included) and the
    policy's share of that CPU time (every ``plan`` call inside it), in seconds.

    CPU time is the figure to compare on a shared machine: other processes'
    load inflates wall time, not this thread's CPU time.
    """
    policy.take()
    w0, c0 = time.perf_counter(), time.thread_time()
    with gc_pause.paused():  # as ``Controller.run_once`` runs a pass
        out = fn()
    wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
    plan = policy.take()
    assert 0 <= plan <= cpu, (plan, cpu)
    return out, wall, cpu, plan


Times = tuple[list[float], list[float], list[float]]
SCALES = ((256, 64), (1024, 512))
"""(jobs, nodes of 8 A100s) of the allocation-pass rows."""


def scenario(
    jobs: int, node_count: int
) -> tuple[tuple[Node, ...], list[Observed], dict[str, SyntheticModel], Any]:
    """The pass's input: ``node_count`` nodes of 8 A100s, ``jobs`` DLJobs of 1, 2 or 4
    GPUs (seeded), a synthetic model each, the budget at eta 0.7."""
    nodes = tuple(Node(f"n{i:03d}", 8, A100) for i in range(node_count))
    zoo = synthetic_zoo(8, seed=0)
    rng = np.random.default_rng(0)
    observed = [Observed(dljob(f"j{i}", int(rng.choice([1, 2, 4])), i)) for i in range(jobs)]
    models = {f"j{i}": zoo[i % len(zoo)] for i in range(jobs)}
    return nodes, observed, models, parse_budget({"eta": "0.7"})


def loop_times(repeat: int, jobs: int = 256, node_count: int = 64) -> dict[str, Times]:
    """Per scenario: wall, CPU and policy-CPU seconds of each repeat."""
    nodes, observed, models, budget = scenario(jobs, node_count)
    policy = TimedPolicy(PowerFlowPolicy())
    out: dict[str, Times] = {}
    times: Times = ([], [], [])

    def model(job: JobRequest) -> SyntheticModel:
        return models[job.name]

    def cold() -> Actions:
        return reconcile(
            observed, nodes, budget, 1e6, policy, model, PassMemory(requests=RequestCache())
        )

    for _ in range(repeat):  # a cold operator: nothing parsed yet, every pod built
        actions, *measured = _timed(cold, policy)
        for column, value in zip(times, measured, strict=True):
            column.append(value)
    out[f"{jobs} new jobs"] = times
    assert actions.plan is not None and actions.allocated_gpus > 0
    running = steady(observed, actions)
    cache = RequestCache()
    anchors: dict[str, float] = {}
    times = ([], [], [])
    for i in range(repeat + 1):  # the periodic pass of a warm operator
        now = 1e6 + 60 * (i + 1)
        step, *measured = _timed(
            functools.partial(
                reconcile, running, nodes, budget, now, policy, model, PassMemory(anchors, cache)
            ),
            policy,
        )
        if i:  # the first warms the request cache
            for column, value in zip(times, measured, strict=True):
                column.append(value)
        anchors = step.anchors
    assert not [b for b in step.create if b["kind"] == "Pod"]
    out[f"{jobs} running jobs"] = times
    return out


async def reaction_times(count: int) -> list[float]:
    sys.path.insert(0, str(TESTS))
    import tempfile

    import httpx
    from kmock._internal import apps
    from support.kube_emulator import KubeEmulator
    from support.operator_harness import Operator, operator_args, write_kubeconfig

    jobs = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/ml/{contract.PLURAL}"
    out = []
    async with KubeEmulator() as emulator, apps.Server(emulator):
        emulator.load_builtins()
        emulator.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
        async with httpx.AsyncClient(base_url=str(emulator.url)) as api:
            for i in range(8):
                labels = {contract.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}
                await api.post(
                    "/api/v1/nodes",
                    json={
                        "metadata": {"name": f"n{i}", "labels": labels},
                        "status": {"allocatable": {contract.GPU_RESOURCE: "8"}},
                    },
                )
            models = synthetic_zoo(1)[0]
            tmp = tempfile.mkdtemp()
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", str(emulator.url))
            args = operator_args(kubeconfig, "--debounce", "0.02")
            op = Operator(args, PowerFlowPolicy(), lambda j: models)
            async with op:
                for i in range(count):
                    await asyncio.sleep(0.5)  # from an idle operator: the last job's passes done
                    t0 = time.perf_counter()
                    await api.post(jobs, json=dljob(f"r{i}", 2, i))
                    selector = {"labelSelector": f"{contract.JOB_LABEL}=r{i}"}
                    while not (await api.get("/api/v1/namespaces/ml/pods", params=selector)).json()[
                        "items"
                    ]:
                        await asyncio.sleep(0.02)
                    out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--reactions", type=int, default=5)
    args = parser.parse_args(argv)
    passes: dict[tuple[str, int], Times] = {}
    for jobs, node_count in SCALES:
        for label, times in loop_times(args.repeat, jobs, node_count).items():
            passes[label, 8 * node_count] = times
    reactions = asyncio.run(reaction_times(args.reactions)) if args.reactions else []
    table = Table(
        title="operator: median ms per column; CPU = this thread's CPU time over a pass, "
        "policy = every PowerFlowPolicy.plan call of that pass, operator = CPU - policy "
        "of the same pass"
    )
    for col in ("measure", "n", "wall", "CPU", "policy", "operator", "max wall", "target"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    for (label, gpus), (wall, cpu, plan) in passes.items():
        wall_ms, cpu_ms, plan_ms = (np.asarray(x) * 1e3 for x in (wall, cpu, plan))
        table.add_row(
            f"allocation pass, {label} / {gpus:,} GPUs",
            str(len(wall_ms)),
            f"{np.median(wall_ms):.1f}",
            f"{np.median(cpu_ms):.1f}",
            f"{np.median(plan_ms):.1f}",
            f"{np.median(cpu_ms - plan_ms):.1f}",
            f"{wall_ms.max():.1f}",
            "50",
        )
    if reactions:
        ms = np.asarray(reactions) * 1e3
        row = f"{np.median(ms):.1f}", "", "", "", f"{ms.max():.1f}", "1000"
        table.add_row("DLJob created -> worker pods (emulator)", str(len(ms)), *row)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
