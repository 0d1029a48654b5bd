"""Time the operator: reaction in the emulator and one allocation pass at scale.

Targets (issue 5): a DLJob created -> its worker pods created in under 1 s
against the emulated API server (``tests/support/kube_emulator.py``, real
HTTP, kopf in its own thread); one allocation pass (snapshot build + policy +
plan translation, ``reconcile``) under 50 ms for 256 jobs on 512 GPUs
(64 nodes of 8 A100s, PowerFlowPolicy, synthetic models, budget eta 0.7).

    python -m benchmarks.operator_bench [--repeat 20] [--reactions 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from powerflow.operator.budget import parse_budget
from powerflow.operator.reconcile import Observed, reconcile
from rich.console import Console
from rich.table import Table

from powerflow import contract
from powerflow.gpus import A100
from powerflow.policy.powerflow import PowerFlowPolicy
from powerflow.policy.snapshot import Node
from powerflow.policy.synthetic import synthetic_zoo

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
    """The cluster after the first pass was carried out: status written, pods created."""
    patches = {name: patch for _, name, patch in actions.status}
    pods: dict[str, list[Any]] = {}
    for b in actions.create:
        if b["kind"] == "Pod":
            b["status"] = {"phase": "Running"}
            pods.setdefault(b["metadata"]["labels"][contract.JOB_LABEL], []).append(b)
    out = []
    for o in observed:
        name = o.body["metadata"]["name"]
        body = dict(o.body, status=patches.get(name, {}))
        out.append(Observed(body, tuple(pods.get(name, ()))))  # type: ignore[arg-type]
    return out


def loop_times(repeat: int) -> tuple[list[float], list[float]]:
    nodes = tuple(Node(f"n{i:02d}", 8, A100) for i in range(64))
    zoo = synthetic_zoo(8, seed=0)
    rng = np.random.default_rng(0)
    observed = [Observed(dljob(f"j{i}", int(rng.choice([1, 2, 4])), i)) for i in range(256)]
    models = {f"j{i}": zoo[i % len(zoo)] for i in range(256)}
    budget = parse_budget({"eta": "0.7"})
    policy = PowerFlowPolicy()
    first, again = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        actions = reconcile(observed, nodes, budget, 1e6, policy, lambda job: models[job.name])
        first.append(time.perf_counter() - t0)
    assert actions.plan is not None and actions.allocated_gpus > 0
    running = steady(observed, actions)
    for i in range(repeat):
        t0 = time.perf_counter()
        reconcile(running, nodes, budget, 1e6 + 60 * (i + 1), policy, lambda j: models[j.name])
        again.append(time.perf_counter() - t0)
    return first, again


async def reaction_times(count: int) -> list[float]:
    sys.path.insert(0, str(TESTS))
    import httpx
    from kmock._internal import apps
    from powerflow.operator.controller import OperatorConfig
    from support.kube_emulator import KubeEmulator
    from support.operator_harness import OperatorThread

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
            config = OperatorConfig(debounce_s=0.02)
            models = synthetic_zoo(1)[0]
            op = OperatorThread(str(emulator.url), PowerFlowPolicy(), lambda j: models, config)
            async with op:
                for i in range(count):
                    t0 = time.perf_counter()
                    await api.post(jobs, json=dljob(f"r{i}", 2, i))
                    selector = {"labelSelector": f"{contract.JOB_LABEL}=r{i}"}
                    while not (await api.get("/api/v1/namespaces/ml/pods", params=selector)).json()[
                        "items"
                    ]:
                        await asyncio.sleep(0.005)
                    out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--reactions", type=int, default=5)
    args = parser.parse_args(argv)
    first, again = loop_times(args.repeat)
    reactions = asyncio.run(reaction_times(args.reactions))
    table = Table(title="operator")
    for col in ("measure", "n", "median ms", "max ms", "target ms"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    for label, xs, target in (
        ("allocation pass, 256 new jobs / 512 GPUs", first, 50),
        ("allocation pass, 256 running jobs / 512 GPUs", again, 50),
        ("DLJob created -> worker pods (emulator)", reactions, 1000),
    ):
        ms = np.asarray(xs) * 1e3
        table.add_row(label, str(len(xs)), f"{np.median(ms):.1f}", f"{ms.max():.1f}", str(target))
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
