"""The shared-structure pod builder against a plain deep-copy reference.

``worker_pods`` shares template parts and env entries between pods for speed;
the reference below builds each pod the obvious way (deep copy of the
template, then set the fields), so any drift in names, env order, labels,
annotations or resources shows up as an inequality.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from typing import Any

import pytest
from powerflow.operator.jobs import JobRequest, parse_dljob
from powerflow.operator.workers import WorkerSet, planned_block_annotation, worker_pod, worker_pods

from powerflow.core import contract

ENV_KEYS = ["WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_BATCH_SIZE",
            "GLOBAL_BATCH_SIZE", "POWERFLOW_ITERATIONS", "POWERFLOW_FREQUENCY_MHZ",
            "POWERFLOW_JOB", "POWERFLOW_GENERATION", "POWERFLOW_AGENT_PORT",
            "POWERFLOW_GRACE_SECONDS"]  # fmt: skip
DOWNWARD = {"POWERFLOW_POD_NAME": "metadata.name",
            "POWERFLOW_POD_NAMESPACE": "metadata.namespace",
            "POWERFLOW_POD_UID": "metadata.uid",
            "POWERFLOW_AGENT_HOST": "status.hostIP"}  # fmt: skip


def reference_pod(job: JobRequest, ws: WorkerSet, index: int) -> dict[str, Any]:
    template = copy.deepcopy(job.template)
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    name = f"{job.name}-g{ws.generation}-w{index}"
    values = {
        "WORLD_SIZE": str(ws.gpus),
        "RANK": str(index),
        "MASTER_ADDR": f"{job.name}-g{ws.generation}-w0.{job.name}.{job.namespace}.svc",
        "MASTER_PORT": str(job.master_port),
        "LOCAL_BATCH_SIZE": str(ws.local_batch_size),
        "GLOBAL_BATCH_SIZE": str(job.global_batch_size),
        "POWERFLOW_ITERATIONS": str(job.iterations),
        "POWERFLOW_FREQUENCY_MHZ": str(ws.frequency_mhz),
        "POWERFLOW_JOB": job.name,
        "POWERFLOW_GENERATION": str(ws.generation),
        "POWERFLOW_AGENT_PORT": str(contract.AGENT_WORKER_PORT),
        "POWERFLOW_GRACE_SECONDS": str(job.grace_s),
    }
    assert list(values) == ENV_KEYS
    downward = [
        {"name": k, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": v}}}
        for k, v in DOWNWARD.items()
    ]
    for c in spec["containers"]:
        if c.get("name") == job.trainer:
            kept = [e for e in c.get("env") or [] if e["name"] not in values | DOWNWARD]
            c["env"] = kept + [{"name": k, "value": v} for k, v in values.items()] + downward
            res = c.get("resources") or {}
            for kind in ("limits", "requests"):
                res[kind] = {**(res.get(kind) or {}), contract.GPU_RESOURCE: "1"}
            c["resources"] = res
            break
    spec.update(
        schedulerName=contract.SCHEDULER_NAME,
        restartPolicy="Never",
        terminationGracePeriodSeconds=job.grace_s,
        hostname=name,
        subdomain=job.name,
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": {
                **(meta.get("labels") or {}),
                contract.JOB_LABEL: job.name,
                contract.WORKER_INDEX_LABEL: str(index),
            },
            "annotations": {
                **(meta.get("annotations") or {}),
                contract.WORKERS_ANNOTATION: str(ws.gpus),
                contract.FREQUENCY_ANNOTATION: str(ws.frequency_mhz),
                contract.GENERATION_ANNOTATION: str(ws.generation),
                **({contract.MODEL_ANNOTATION: job.model_name} if job.model_name else {}),
                **({contract.POWER_LIMIT_ANNOTATION: ws.power_cap} if ws.power_cap else {}),
                **(
                    {contract.PLANNED_BLOCK_ANNOTATION: json.dumps({"block": sorted(ws.planned)})}
                    if ws.planned
                    else {}
                ),
            },
            "ownerReferences": [
                {
                    "apiVersion": contract.API_VERSION,
                    "kind": contract.KIND,
                    "name": job.name,
                    "uid": job.uid,
                    "controller": True,
                }
            ],
        },
        "spec": spec,
    }


def random_job(rng: random.Random, i: int) -> JobRequest:
    trainer: dict[str, Any] = {"name": "trainer", "image": "img", "command": ["torchrun"]}
    if rng.random() < 0.7:  # user env, some of it overridden by the operator
        keys = rng.sample([*ENV_KEYS, *DOWNWARD, "NCCL_DEBUG", "HF_HOME", "OMP_NUM_THREADS"], 4)
        trainer["env"] = [{"name": k, "value": f"u{k}"} for k in keys]
    if rng.random() < 0.5:
        trainer["resources"] = {"limits": {"memory": "8Gi"}, "requests": {"cpu": "4"}}
    containers = [trainer]
    if rng.random() < 0.5:
        containers.insert(rng.randrange(2), {"name": "sidecar", "image": "log"})
    template: dict[str, Any] = {"spec": {"containers": containers, "volumes": [{"name": "ck"}]}}
    if rng.random() < 0.6:
        template["metadata"] = {"labels": {"team": "ml"}, "annotations": {"note": "x"}}
    spec: dict[str, Any] = {
        "globalBatchSize": 256,
        "iterations": rng.randrange(1, 10_000),
        "gpus": {"requested": 2, "min": 1, "max": 8},
        "masterPort": rng.randrange(20_000, 30_000),
        "terminationGracePeriodSeconds": rng.randrange(1, 120),
        "template": template,
    }
    if rng.random() < 0.5:
        spec["model"] = rng.choice(["bert", "resnet50"])
    meta = {"name": f"job{i}", "namespace": "ml", "uid": f"u{i}", "generation": 1}
    return parse_dljob({"metadata": meta, "spec": spec})  # type: ignore[typeddict-item]


@pytest.mark.parametrize("seed", range(5))
def test_worker_pods_equal_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    for i in range(40):
        job = random_job(rng, i)
        before = copy.deepcopy(job.template)
        gpus = rng.choice([1, 2, 4, 8, 16])
        cap = rng.choice([None, "250", "312.5"])
        planned = tuple(rng.sample([(f"n{k % 3}", k) for k in range(16)], gpus)) * rng.randrange(2)
        ws = WorkerSet(
            rng.randrange(1, 9),
            gpus,
            rng.choice([8, 32, 64]),
            rng.randrange(900, 1410),
            cap,
            planned,
        )
        indices = rng.sample(range(gpus), rng.randrange(1, gpus + 1))
        pods = worker_pods(job, ws)
        assert pods == [reference_pod(job, ws, k) for k in range(gpus)]
        # the same JSON too: key order is what the API server receives
        assert json.dumps(pods) == json.dumps([reference_pod(job, ws, k) for k in range(gpus)])
        assert worker_pods(job, ws, indices) == [reference_pod(job, ws, k) for k in indices]
        k = rng.randrange(gpus)
        assert worker_pod(job, ws, k) == reference_pod(job, ws, k)
        assert job.template == before  # the shared template is never written


def test_pods_do_not_share_per_worker_fields() -> None:
    job = random_job(random.Random(7), 0)
    a, b = worker_pods(job, WorkerSet(1, 2, 32, 1200))

    def rank(pod: dict[str, Any]) -> str:
        (trainer,) = (c for c in pod["spec"]["containers"] if c["name"] == job.trainer)
        return next(e["value"] for e in trainer["env"] if e["name"] == "RANK")

    assert (rank(a), rank(b)) == ("0", "1")  # a shared RANK entry would make these equal
    assert a["metadata"]["labels"] is not b["metadata"]["labels"]
    assert a["metadata"]["annotations"] is not b["metadata"]["annotations"]
    assert a["spec"] is not b["spec"]


@pytest.mark.parametrize(
    "slots",
    [
        [],
        [("n1", 3), ("n0", 7), ("n0", 1)],
        [('q"uote\\', 0), ("é\u2028\x00", 2), ("a", 10**30), ("a", -1)],
        [("n0", True), ("n0", 2.5)],  # not str/int: json.dumps's own text
        [("n2", 5), ("n2", 0), ("n2", 3)],  # one node: one join
        [("n2", 1), ("n2", True)],
        [("n2", 1), ("n2", 10**30), ("n2", -4)],
        [('q"é', 0), ('q"é', 1)],
        [("n", 1), ("n", 2.0)],
        [(3, 1), (3, 2)],
    ],
)
def test_planned_block_annotation_is_json_dumps(slots: list[tuple[Any, Any]]) -> None:
    block = [[node, index] for node, index in sorted(slots)]
    assert planned_block_annotation(slots) == json.dumps({"block": block})
    assert json.loads(planned_block_annotation(slots)) == {"block": block}


def test_workers_of_a_pool_are_pinned_to_its_gpu_product() -> None:
    """Where several pools are planned, each worker may only run on nodes of its pool's
    product label, in every one of the template's own required terms (terms are ORed)."""
    job = random_job(random.Random(3), 0)
    label = contract.GPU_PRODUCT_LABEL
    (pod,) = worker_pods(job, WorkerSet(1, 1, 32, 1200, pool_product="NVIDIA-H100-80GB-HBM3"))
    required = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    expression = {"key": label, "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
    assert required == {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
    # Without a pool (one pool planned): the template's spec as it is.
    (plain,) = worker_pods(job, WorkerSet(1, 1, 32, 1200))
    assert "affinity" not in plain["spec"]
    # The template's own terms keep their expressions and gain the pool's.
    own = {"key": "zone", "operator": "In", "values": ["z1"]}
    zone_b = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [own]}, zone_b]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
        },
        "podAntiAffinity": {"x": 1},
    }
    spec = {**job.template["spec"], "affinity": affinity}
    before = copy.deepcopy(affinity)
    pinned = dataclasses.replace(job, template={**job.template, "spec": spec})
    (pod,) = worker_pods(pinned, WorkerSet(1, 1, 32, 1200, pool_product=""))
    unlabelled = {"key": label, "operator": "DoesNotExist"}
    got = pod["spec"]["affinity"]
    assert got["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [own, unlabelled]},
            {**zone_b, "matchExpressions": [unlabelled]},
        ]
    }
    assert got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1}]
    assert got["podAntiAffinity"] == {"x": 1}
    assert affinity == before  # the template is never written
