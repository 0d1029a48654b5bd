"""An in-memory cluster for the operator's pure tests: ``reconcile`` passes against it.

It carries out ``Actions.writes`` as the API server would (status merge
patches, graceful pod deletion, creates that answer AlreadyExists, annotation
patches), optionally only a prefix of them (an operator that dies mid-pass),
and plays the extender and the kubelet: a gang whose pods all exist is bound
to the plan's block (``contract.PLANNED_BLOCK_ANNOTATION``) when it is free, else to
the block ``reserve_block`` chooses among the GPUs pods hold (the extender's
own rules, ``extender/placing.py``), and bound pods run. Every pod creation and deletion is
recorded, so tests can count churn. No HTTP: the emulator tests cover the wire.
"""

from __future__ import annotations

import copy
import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from powerflow.extender.objects import parse_block
from powerflow.extender.placing import planned_block
from powerflow.operator.actions import Actions, Observed
from powerflow.operator.reconcile import reconcile

from powerflow.core import contract
from powerflow.core.policy.placement import reserve_block
from powerflow.core.policy.snapshot import Node
from powerflow.core.timefmt import format_time
from support.operator_pass import pass_inputs

Obj = dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@dataclass
class FakeCluster:
    nodes: tuple[Node, ...]
    jobs: dict[str, Obj] = field(default_factory=dict)
    pods: dict[str, Obj] = field(default_factory=dict)
    created: Counter[str] = field(default_factory=Counter)
    deleted: Counter[str] = field(default_factory=Counter)
    now_s: float = 1000.0
    stuck_nodes: set[str] = field(default_factory=set)
    """Nodes that stopped answering: their deleted pods stay terminating."""

    def submit(self, body: Obj) -> None:
        body = copy.deepcopy(body)
        body["metadata"].setdefault("creationTimestamp", format_time(self.now_s))
        self.jobs[body["metadata"]["name"]] = body

    def observed(self) -> list[Observed]:
        by_job: dict[str, list[Obj]] = defaultdict(list)
        for pod in self.pods.values():
            by_job[pod["metadata"]["labels"][contract.JOB_LABEL]].append(copy.deepcopy(pod))
        return [
            Observed(copy.deepcopy(body), tuple(by_job.get(name, ())))  # type: ignore[arg-type]
            for name, body in self.jobs.items()
        ]

    # -- the API server ------------------------------------------------------------------

    def write(self, verb: str, args: tuple[Any, ...]) -> None:
        if verb == "status":
            _, name, patch = args
            if name in self.jobs:
                job = self.jobs[name]
                job["status"] = merge_patch(job.get("status") or {}, patch)
        elif verb == "delete":
            _, name, grace_s = args
            pod = self.pods.get(name)
            if pod is None:
                return
            self.deleted[name] += 1
            meta = pod["metadata"]
            meta.setdefault("deletionTimestamp", format_time(self.now_s + grace_s))
        elif verb == "create":
            (body,) = args
            if body["kind"] != "Pod" or body["metadata"]["name"] in self.pods:
                return  # Services are not tracked; an existing name is AlreadyExists
            pod = copy.deepcopy(body)
            pod["status"] = {"phase": "Pending"}
            self.pods[pod["metadata"]["name"]] = pod
            self.created[pod["metadata"]["name"]] += 1
        elif verb == "annotate":
            _, name, annotations = args
            if name in self.pods:
                self.pods[name]["metadata"].setdefault("annotations", {}).update(annotations)
        else:  # pragma: no cover
            raise AssertionError(verb)

    def apply(self, actions: Actions, limit: int | None = None) -> int:
        """Carry out the first ``limit`` writes (all by default); returns how many there were."""
        flat = [w for phase in actions.writes() for w in phase]
        for verb, args in flat[:limit]:
            self.write(verb, args)
        return len(flat)

    # -- kubelet and extender ------------------------------------------------------------

    def settle(self) -> None:
        """Terminating pods finish (except on stuck nodes); whole gangs get bound and run."""
        for name, pod in list(self.pods.items()):
            if pod["metadata"].get("deletionTimestamp") and (
                pod.get("spec", {}).get("nodeName") not in self.stuck_nodes
            ):
                del self.pods[name]
        gangs: dict[tuple[str, str], list[Obj]] = defaultdict(list)
        for pod in sorted(self.pods.values(), key=lambda p: p["metadata"]["name"]):
            meta = pod["metadata"]
            if pod.get("spec", {}).get("nodeName") or meta.get("deletionTimestamp"):
                continue
            gen = meta["annotations"][contract.GENERATION_ANNOTATION]
            gangs[meta["labels"][contract.JOB_LABEL], gen].append(pod)
        for members in gangs.values():
            size = int(members[0]["metadata"]["annotations"][contract.WORKERS_ANNOTATION])
            if len(members) != size:
                continue  # the extender waits for the whole gang
            occupied = self._occupied()
            raw = members[0]["metadata"]["annotations"].get(contract.PLANNED_BLOCK_ANNOTATION)
            block = planned_block(self.nodes, occupied, parse_block(raw), size)
            block = block or reserve_block(self.nodes, occupied, size)
            if block is None:
                continue
            node = block[0][0]
            placement = json.dumps({"node": node, "block": [list(s) for s in block]})
            for pod, (slot_node, _) in zip(members, block, strict=True):
                pod["spec"]["nodeName"] = slot_node
                pod["metadata"]["annotations"][contract.PLACEMENT_ANNOTATION] = placement
                pod["status"] = {"phase": "Running"}

    def _occupied(self) -> Mapping[str, set[int]]:
        used: dict[str, set[int]] = defaultdict(set)
        for pod in self.pods.values():
            raw = pod["metadata"].get("annotations", {}).get(contract.PLACEMENT_ANNOTATION)
            if raw:
                for node, index in json.loads(raw)["block"]:
                    used[node].add(index)
        return used

    def pending_gangs(self) -> list[str]:
        """Pods that exist, not terminating, and are not bound."""
        return sorted(
            name
            for name, pod in self.pods.items()
            if not pod.get("spec", {}).get("nodeName")
            and not pod["metadata"].get("deletionTimestamp")
        )

    # -- the operator --------------------------------------------------------------------

    def one_pass(self, limit: int | None = None, **kw: Any) -> tuple[Actions, int]:
        """One reconcile pass at ``now_s``, its writes carried out up to ``limit``."""
        kw.setdefault("profiling_window_s", 0.0)
        actions = reconcile(self.observed(), self.nodes, now_s=self.now_s, **pass_inputs(**kw))
        return actions, self.apply(actions, limit)
