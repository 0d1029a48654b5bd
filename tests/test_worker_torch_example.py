"""The PyTorch example under torchrun (gloo, CPU, two workers) reporting to the agent.

The two worker pods are built by the operator's own pod builder and "bound"
as the extender and the API server would (node, UID, placement); each worker
process gets exactly the env its pod would have, with the downward API's
fields resolved. One torchrun per pod, as the operator runs them (``--nnodes
WORLD_SIZE --node-rank RANK``), and the node agent's telemetry (on simulated
GPUs) behind its real worker endpoint receives the iteration reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from powerflow.nodeagent.iterations import IterationReport, worker_app
from powerflow.nodeagent.pods import pod_view
from powerflow.nodeagent.sender import IngestConnection, SampleSender
from powerflow.nodeagent.telemetry import Telemetry
from powerflow.operator.jobs import parse_dljob
from powerflow.operator.workers import WorkerSet, worker_pods
from support.agent_endpoint import serve_in_thread
from support.operator_harness import free_port

from powerflow.core import contract
from powerflow.core.devices import Workload
from powerflow.lab.simulated_gpus import SimulatedGpus

ROOT = Path(__file__).resolve().parent.parent
NODE = "node-a"
ITERATIONS = 120


def bound_pods() -> list[dict[str, Any]]:
    """The job's two worker pods as they stand on the node, running."""
    job = parse_dljob(
        {
            "metadata": {"name": "tiny", "namespace": "ml", "uid": "j1", "generation": 1},
            "spec": {
                "model": "resnet50",
                "globalBatchSize": 16,
                "iterations": ITERATIONS,
                "gpus": {"requested": 2},
                "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
            },
        }  # type: ignore[typeddict-item]
    )
    pods: list[dict[str, Any]] = json.loads(json.dumps(worker_pods(job, WorkerSet(1, 2, 8, 1200))))
    for i, pod in enumerate(pods):
        pod["metadata"]["uid"] = str(uuid.uuid4())
        pod["metadata"]["annotations"][contract.PLACEMENT_ANNOTATION] = json.dumps(
            {"node": NODE, "block": [[NODE, 0], [NODE, 1]]}
        )
        pod["spec"]["nodeName"] = NODE
        pod["status"] = {"phase": "Running", "hostIP": "127.0.0.1", "podIP": f"10.0.0.{i}"}
    return pods


def resolved_env(pod: dict[str, Any]) -> dict[str, str]:
    """The trainer's env as the kubelet gives it (downward API fields resolved)."""
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "status.hostIP": pod["status"]["hostIP"],
    }
    (trainer,) = pod["spec"]["containers"]
    return {
        e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in trainer["env"]
    }


def test_the_ddp_example_reports_iterations_to_the_agent(tmp_path: Path) -> None:
    assert torch.distributed.is_gloo_available()
    pods = bound_pods()
    views = {(p["metadata"]["namespace"], p["metadata"]["name"]): pod_view(p) for p in pods}
    gpus = SimulatedGpus(2, node=NODE, seed=1, clock=time.time)
    for g, view in enumerate(views.values()):
        assert view.n and view.gpus_per_node and view.local_batch_size and view.model_name
        gpus.assign(g, Workload(view.model_name, view.n, view.gpus_per_node, 8.0))
    locked = {0: 1200, 1: 1200}
    telemetry = Telemetry(
        node=NODE,
        devices=gpus,
        clock=time.time,
        window_s=0.05,
        sender=SampleSender(IngestConnection("http://127.0.0.1:9"), NODE),
        locked_clock_of=locked.get,
    )
    telemetry.sync(views, {key: (g,) for g, key in enumerate(views)})
    received: list[tuple[IterationReport, str | None]] = []
    lock = threading.Lock()

    def handler(r: IterationReport) -> str | None:
        answer = telemetry.report(r)
        with lock:
            received.append((r, answer))
        return answer

    master_port = free_port()
    with serve_in_thread(lambda: worker_app(handler)) as url:
        procs = []
        for pod in pods:
            env = resolved_env(pod)
            env.update(
                POWERFLOW_AGENT_PORT=url.rsplit(":", 1)[1],  # the test agent's port
                MASTER_ADDR="127.0.0.1",  # no cluster DNS here
                MASTER_PORT=str(master_port),
                OMP_NUM_THREADS="1",
            )
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={env['WORLD_SIZE']}",
                f"--node-rank={env['RANK']}",
                "--nproc-per-node=1",
                f"--master-addr={env['MASTER_ADDR']}",
                f"--master-port={env['MASTER_PORT']}",
                str(ROOT / "examples" / "torch_ddp" / "train.py"),
                "--checkpoint",
                str(tmp_path / "ckpt.pt"),
            ]
            base = {k: v for k, v in os.environ.items() if not k.startswith("POWERFLOW_")}
            # Output to files, not pipes: a pipe nobody reads while the test waits on
            # the other rank fills up, blocks that torchrun, and torchrun's exit
            # barrier then holds the other one too.
            log = tmp_path / f"rank{env['RANK']}.log"
            with log.open("w") as out:
                proc = subprocess.Popen(
                    cmd, env={**base, **env}, stdout=out, stderr=subprocess.STDOUT, text=True
                )
            procs.append((proc, log))
        outputs = []
        try:
            for proc, log in procs:
                proc.wait(timeout=100)
                outputs.append(log.read_text())
                assert proc.returncode == 0, outputs[-1]
        finally:
            for proc, log in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    print(f"{log.name}:\n{log.read_text()[-3000:]}")
    assert [f"rank {i}: {ITERATIONS} iterations" in out for i, out in enumerate(outputs)] == [
        True,
        True,
    ]
    # every report was accepted: the env the operator sets names the pod the agent knows
    assert received and all(answer is None for _, answer in received)
    by_pod: dict[str, list[int]] = {}
    for r, _ in received:
        by_pod.setdefault(r.pod, []).append(r.iterations)
    assert sorted(by_pod) == ["tiny-g1-w0", "tiny-g1-w1"]
    for counts in by_pod.values():
        assert counts[0] >= 1 and counts == sorted(counts) and counts[-1] <= ITERATIONS
    assert {r.uid for r, _ in received} == {p["metadata"]["uid"] for p in pods}
    state = torch.load(tmp_path / "ckpt.pt")
    assert state["iteration"] == ITERATIONS  # rank 0's final checkpoint
