"""Which watch events are scheduling events: the rest must not wake the allocation loop.

A pass re-reads everything (level-triggered), so an event only has to say
"something that a pass decides on may have changed". Most events say nothing
of the kind: the operator's own status patches come back as DLJob MODIFIED
events, progress annotations change pods every few seconds, and kubelets
renew Node heartbeats every 10 s on every node. Each watched object's
*fingerprint* holds only the fields a pass decides on; an event triggers a
pass when the fingerprint differs from the last one seen for that object
(or the object is new or deleted). What an event leaves out is still read at
the next pass, which comes at least every ``schedulingIntervalSeconds``.

- DLJob: ``metadata.generation`` (the spec), ``deletionTimestamp`` and
  labels. Status is the operator's own output and annotations are not read.
- Pod: ``status.phase``, ``spec.nodeName``, ``deletionTimestamp``, and
  whether the progress annotation has reached the pod's
  ``POWERFLOW_ITERATIONS``: reconcile completes a job on that report, and a
  trainer that reports and then hangs in its teardown would otherwise wait
  for the periodic pass. Only that crossing is news; the other progress
  writes (every few seconds) are read at the next pass.
- Node: allocatable GPUs, ``spec.unschedulable``, taints, the Ready
  condition's status and the GPU product label; not heartbeats.
- The budget ConfigMap: its ``data``. An edge of its schedule (a window
  starting or ending) is no watch event: the controller wakes at it
  (``BudgetConfig.next_edge_s``).
- A foreign GPU pod arriving or leaving (``foreign_pods``, which calls the
  loop's ``trigger`` itself): not other pods' changes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from powerflow.core import contract

Body = Mapping[str, Any]


def _meta(body: Body) -> Mapping[str, Any]:
    meta = body.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _get(body: Body, *path: str) -> Any:
    cur: Any = body
    for part in path:
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return cur


def dljob_fingerprint(body: Body) -> str:
    meta = _meta(body)
    return _dump([meta.get("generation"), meta.get("deletionTimestamp"), meta.get("labels")])


def pod_fingerprint(body: Body) -> str:
    meta = _meta(body)
    phase = _get(body, "status", "phase")
    node = _get(body, "spec", "nodeName")
    return _dump([phase, node, meta.get("deletionTimestamp"), _reported_all(body)])


_DIGITS = 18  # below 2**63, as reconcile's counts; junk reads as absent


def _number(value: Any) -> int | None:
    ok = isinstance(value, str) and 0 < len(value) <= _DIGITS and value.isascii()
    return int(value) if ok and value.isdigit() else None


def _reported_all(body: Body) -> bool:
    """Whether the trainer reported all its iterations (``POWERFLOW_ITERATIONS``)."""
    annotations = _meta(body).get("annotations")
    if not isinstance(annotations, Mapping):
        return False
    reported = _number(annotations.get(contract.PROGRESS_ANNOTATION))
    if reported is None:
        return False
    containers = _get(body, "spec", "containers")
    for container in containers if isinstance(containers, list) else []:
        env = container.get("env") if isinstance(container, Mapping) else None
        for var in env if isinstance(env, list) else []:
            if isinstance(var, Mapping) and var.get("name") == "POWERFLOW_ITERATIONS":
                total = _number(var.get("value"))
                if total is not None and reported >= total:
                    return True
    return False


def node_fingerprint(body: Body) -> str:
    conditions = _get(body, "status", "conditions")
    ready = [
        c.get("status")
        for c in (conditions if isinstance(conditions, list) else [])
        if isinstance(c, Mapping) and c.get("type") == "Ready"
    ]
    labels = _meta(body).get("labels")
    product = labels.get(contract.GPU_PRODUCT_LABEL) if isinstance(labels, Mapping) else None
    return _dump(
        [
            _get(body, "status", "allocatable", contract.GPU_RESOURCE),
            _get(body, "spec", "unschedulable"),
            _get(body, "spec", "taints"),
            ready,
            product,
        ]
    )


def configmap_fingerprint(body: Body) -> str:
    return _dump([body.get("data")])


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class Seen:
    """The last fingerprint of each watched object: ``changed`` says whether an event
    is news. Keys are (kind, namespace, name); memory is one short string per object."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str, str], str] = {}

    def changed(self, kind: str, event_type: str | None, body: Body, fingerprint: str) -> bool:
        meta = _meta(body)
        key = (kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if event_type == "DELETED":
            self._last.pop(key, None)
            return True
        before = self._last.get(key)
        self._last[key] = fingerprint
        return before != fingerprint
