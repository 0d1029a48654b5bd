"""A pass's writes pinned, byte for byte but floats to 9 digits, on seeded clusters of 1,024 jobs.

The allocation pass is tuned for speed (``benchmarks.operator_bench``): pod bodies
put together from shared parts, requests parsed once, bodies built from prepared
pieces. None of that may change what the pass writes. Each case below runs
``reconcile`` on a seeded cluster with varied DLJobs (template labels,
annotations, env the operator overrides, resources, sidecars, models, grace
periods, a few invalid specs) and compares the SHA-256 of everything the pass
decided, serialized as JSON in the order the API server receives it (key order
included): the writes (``Actions.writes``: status patches, deletions, annotation
patches, created pods and Services), the events, the plan, the phase counts, the
progress anchors and the wake-up time. A digest that changes is a behaviour
change: intended ones update the digest (``pytest ... -k NAME`` prints the new
one in its failure message) in the commit that makes them.

The policy is the product's (``PowerFlowPolicy``, ``FleetPolicy`` for two pools)
on the synthetic models, so the plans are real ones; both are deterministic.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any

import pytest
from powerflow.operator.actions import Actions, Observed
from powerflow.operator.budget import parse_budget
from powerflow.operator.jobs import JobRequest, RequestCache
from powerflow.operator.pass_inputs import PassMemory, PassSettings
from powerflow.operator.reconcile import reconcile

from powerflow.core import contract
from powerflow.core.gpus import A100, GPU_SPECS
from powerflow.core.policy.fleet import FleetPolicy
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.core.policy.snapshot import Node
from powerflow.lab.synthetic import SyntheticModel, synthetic_zoo

NOW = 1.7e9
OURS = ["WORLD_SIZE", "RANK", "MASTER_ADDR", "POWERFLOW_JOB", "POWERFLOW_POD_UID"]


def dljob(rng: random.Random, i: int) -> dict[str, Any]:
    """A seeded DLJob: most valid and varied, about 2% invalid."""
    name = f"j{i}"
    trainer: dict[str, Any] = {"name": "trainer", "image": "img", "command": ["torchrun"]}
    if rng.random() < 0.4:
        keys = rng.sample([*OURS, "NCCL_DEBUG", "HF_HOME"], 3)
        trainer["env"] = [{"name": k, "value": f"u{k}"} for k in keys]
    if rng.random() < 0.3:
        trainer["resources"] = {"limits": {"memory": "8Gi"}, "requests": {"cpu": "4"}}
    containers = [trainer]
    if rng.random() < 0.2:
        containers.insert(rng.randrange(2), {"name": "sidecar", "image": "log"})
    template: dict[str, Any] = {"spec": {"containers": containers}}
    if rng.random() < 0.3:
        template["spec"]["volumes"] = [{"name": "ck", "emptyDir": {}}]
    if rng.random() < 0.3:
        template["metadata"] = {"labels": {"team": f"t{i % 3}"}, "annotations": {"n": "x"}}
    spec: dict[str, Any] = {
        "globalBatchSize": 256,
        "iterations": 1000 + 100 * i,
        "gpus": {"requested": rng.choice([1, 2, 4]), "min": 1, "max": 8},
        "template": template,
    }
    if rng.random() < 0.3:
        spec["model"] = rng.choice(["bert", "resnet50"])
    if rng.random() < 0.2:
        spec["masterPort"] = rng.randrange(20_000, 30_000)
        spec["terminationGracePeriodSeconds"] = rng.randrange(1, 120)
    if rng.random() < 0.02:  # invalid: refused with a reason, its status says so
        spec["globalBatchSize"] = 255
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ml" if i % 4 else "team-b",
        "uid": f"u-{name}",
        "generation": 1 + i % 2,
    }
    if i % 3:
        meta["creationTimestamp"] = "2023-11-14T22:00:00Z"
    return {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "metadata": meta,
            "spec": spec}  # fmt: skip


def cluster(jobs: int, seed: int) -> tuple[list[Observed], Any]:
    rng = random.Random(seed)
    zoo = synthetic_zoo(8, seed=0)
    observed = [Observed(dljob(rng, i)) for i in range(jobs)]

    def model(job: JobRequest) -> SyntheticModel:
        return zoo[int(job.name[1:]) % len(zoo)]

    return observed, model


def settled(observed: list[Observed], actions: Actions) -> list[Observed]:
    """The cluster once the pass was carried out: status written, pods created, bound
    where the plan put them and running."""
    patches = {name: patch for _, name, patch in [*actions.status_first, *actions.status]}
    blocks = {jp.job_id.split("/")[1]: jp.placement for jp in (actions.plan or ()).jobs}  # type: ignore[union-attr]
    pods: dict[str, list[Any]] = {}
    for b in actions.create:
        if b["kind"] != "Pod":
            continue
        job = b["metadata"]["labels"][contract.JOB_LABEL]
        block = [list(slot) for slot in blocks[job]]
        placement = json.dumps({"node": block[0][0], "block": block})
        annotations = {**b["metadata"]["annotations"], contract.PLACEMENT_ANNOTATION: placement}
        meta = dict(b["metadata"], annotations=annotations)
        pods.setdefault(job, []).append(dict(b, metadata=meta, status={"phase": "Running"}))
    out = []
    for o in observed:
        name = o.body["metadata"]["name"]
        status = dict(patches.get(name, {}))
        body = dict(o.body, status=status)
        out.append(Observed(body, tuple(pods.get(name, ()))))
    return out


FLOAT = re.compile(r"(?<![\w.])\d+\.\d+(?:e[-+]?\d+)?")


def digest(actions: Actions) -> str:
    decided = {
        "writes": actions.writes(),
        "events": [repr(e) for e in actions.events],
        "plan": repr(actions.plan),
        "phases": sorted(actions.phases.items()),
        "anchors": actions.anchors,
        "wake_at_s": actions.wake_at_s,
        "allocated_gpus": actions.allocated_gpus,
        "notes": actions.notes,
    }
    text = json.dumps(decided, default=repr)
    # Floats to 9 significant digits: numpy's and the compiled kernels' last bits may
    # differ on another CPU (its SIMD width changes a sum's order); a decision does not.
    text = FLOAT.sub(lambda m: f"{float(m.group()):.9g}", text)
    return hashlib.sha256(text.encode()).hexdigest()


def one_pool() -> tuple[Node, ...]:
    return tuple(Node(f"n{i:03d}", 8, A100) for i in range(512))


def test_writes_of_a_cold_then_steady_pass_on_one_pool() -> None:
    observed, model = cluster(1024, seed=0)
    budget = parse_budget({"eta": "0.7"})
    nodes = one_pool()
    cold = reconcile(
        observed, nodes, budget, NOW, PowerFlowPolicy(), model, PassMemory(requests=RequestCache())
    )
    pods = sum(b["kind"] == "Pod" for b in cold.create)
    assert pods > 1000 and cold.status_first and cold.events  # the case covers the builders
    assert digest(cold) == "6f8380ec8fe58cf4fcc99dd12dfc2c30acc4e674c8985a4a6762d4b4e2d00324", (
        digest(cold)
    )
    steady = reconcile(
        settled(observed, cold),
        nodes,
        budget,
        NOW + 60,
        PowerFlowPolicy(),
        model,
        PassMemory(anchors=cold.anchors, requests=RequestCache()),
    )
    assert digest(steady) == "93d1d4b3fcbfe798feb22346b9fb361901e8bb47168de2c175339ad22c90b8c4", (
        digest(steady)
    )


def test_writes_of_a_cold_pass_on_two_pools() -> None:
    observed, model = cluster(1024, seed=1)
    h100 = GPU_SPECS["H100-SXM"]
    nodes = (
        *(Node(f"a{i:03d}", 8, A100) for i in range(64)),
        *(Node(f"h{i:03d}", 8, h100) for i in range(64)),
    )
    labels = {n.name: ("NVIDIA-A100" if n.name[0] == "a" else "NVIDIA-H100") for n in nodes}
    actions = reconcile(
        observed,
        nodes,
        parse_budget({"eta": "0.6"}),
        NOW,
        FleetPolicy(PowerFlowPolicy),
        model,
        PassMemory(requests=RequestCache()),
        PassSettings(pool_labels=labels),
    )
    assert any("affinity" in b["spec"] for b in actions.create if b["kind"] == "Pod")
    assert digest(actions) == "6588f86b2d4fc3a555d8152eb8b6d7bca29568d27ac547b147a57190169ed662", (
        digest(actions)
    )


@pytest.mark.parametrize("seed", [2])
def test_a_cold_pass_is_the_same_from_a_warm_request_cache(seed: int) -> None:
    """Parsing memoised across passes gives the pass the same requests: a second cold
    pass from a cache that parsed every job decides the same, byte for byte."""
    observed, model = cluster(256, seed)
    nodes = one_pool()[:64]
    budget = parse_budget({"eta": "0.7"})
    cache = RequestCache()
    first = reconcile(
        observed, nodes, budget, NOW, PowerFlowPolicy(), model, PassMemory(requests=cache)
    )
    again = reconcile(
        observed, nodes, budget, NOW, PowerFlowPolicy(), model, PassMemory(requests=cache)
    )
    fresh = reconcile(observed, nodes, budget, NOW, PowerFlowPolicy(), model)
    assert len(cache) == 256
    assert digest(first) == digest(again) == digest(fresh)
