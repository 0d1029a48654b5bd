"""``reconcile``'s inputs from flat keywords, for tests that set a few of them."""

from __future__ import annotations

import dataclasses
from typing import Any

from powerflow.operator.pass_inputs import PassMemory, PassSettings


def pass_inputs(**kw: Any) -> dict[str, Any]:
    """``reconcile``'s keywords: the fields of ``PassMemory`` and ``PassSettings``
    gathered into ``memory`` and ``settings``, any other keyword as it is."""
    groups = {}
    for name, cls in (("memory", PassMemory), ("settings", PassSettings)):
        fields = {f.name for f in dataclasses.fields(cls)}
        groups[name] = cls(**{k: kw.pop(k) for k in list(kw) if k in fields})
    return {**kw, **groups}


def dljob_body(name: str, status: dict[str, Any], *, gpus: int, batch: int) -> dict[str, Any]:
    """A DLJob in namespace ``ml`` of exactly ``gpus`` GPUs (requested, least and most),
    global batch ``batch``, 100,000 iterations and one trainer container, with ``status``."""
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "generation": 1},
        "spec": {
            "globalBatchSize": batch,
            "iterations": 100_000,
            "gpus": {"requested": gpus, "min": gpus, "max": gpus},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
        "status": status,
    }
