"""What one allocation pass wants done: the observed jobs in, ``Actions`` out, in the
order the API writes go (``Actions.writes``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from powerflow.operator.bodies import (
    DLJobBody,
    PodBody,
    ServiceBody,
)
from powerflow.operator.parking import NodeMark

from powerflow.core.policy.snapshot import Plan


@dataclass(frozen=True)
class Observed:
    """One DLJob and the pods labelled with its name."""

    body: DLJobBody
    pods: tuple[PodBody, ...] = ()


@dataclass(frozen=True)
class Event:
    namespace: str
    name: str
    uid: str
    type: str  # Normal | Warning
    reason: str
    message: str


Write = tuple[str, tuple[Any, ...]]
"""One API write: a verb (``status``, ``delete``, ``create``, ``annotate``, ``node``) and its
arguments."""


@dataclass
class Actions:
    """What one pass wants done; ``writes`` gives the order."""

    delete_pods: list[tuple[str, str, int]] = field(default_factory=list)
    create: list[PodBody | ServiceBody] = field(default_factory=list)
    annotate_pods: list[tuple[str, str, dict[str, str | None]]] = field(default_factory=list)
    """Pod annotation merge patches (``None`` removes the annotation) that may raise power."""
    annotate_first: list[tuple[str, str, dict[str, str | None]]] = field(default_factory=list)
    """Pod annotation patches that only lower power (``power_order.lowers``): written with
    the deletions, before anything that raises power."""
    status: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    status_first: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """Status patches of jobs that start, stop or finish a generation: written before any pod."""
    events: list[Event] = field(default_factory=list)
    wake_at_s: float | None = None
    plan: Plan | None = None
    phases: Counter[str] = field(default_factory=Counter)
    allocated_gpus: int = 0
    notes: list[str] = field(default_factory=list)
    anchors: dict[str, float] = field(default_factory=dict)
    """Progress anchors of the jobs whose workers run (see ``progress``)."""
    node_marks: list[NodeMark] = field(default_factory=list)
    """Nodes to mark or unmark as powered down: ``parking.node_marks`` of the pass's plan,
    added by the controller (the node bodies are not ``reconcile``'s input)."""

    def wake(self, at_s: float) -> None:
        self.wake_at_s = at_s if self.wake_at_s is None else min(self.wake_at_s, at_s)

    def writes(self) -> list[list[Write]]:
        """The pass's API writes as phases, each finished before the next begins.

        1. the status of jobs that start, stop or finish a generation: the
           generation and whether it is stopped are recorded before any of its pods is
           created or deleted, so an operator that dies anywhere later finds
           pods its status explains (it neither deletes pods it just made nor
           creates a name twice, nor counts one failure twice);
        2. deletions (old workers stop before new ones start), annotations that only
           lower power (a lower clock, a new or lower power cap, a sweep's end), and
           the powered-down marks of nodes the plan uses again (gone before their
           workers come): power goes down before anything raises it;
        3. creations: Services and pods together (a worker may exist before its
           headless Service; its DNS name resolves once the Service does and
           torchrun's rendezvous retries), each name once;
        4. annotations that may raise power (a higher clock, a higher or removed
           cap, a sweep's plan), then every other status patch;
        5. the powered-down marks of nodes the plan no longer uses (``parking``).

        ``Kube.apply`` carries them out; tests crash between any two of them.
        """
        unique = {(b["metadata"]["namespace"], b["kind"], b["metadata"]["name"]): b
                  for b in self.create}  # fmt: skip
        unmark = [("node", (m,)) for m in self.node_marks if not m.powered_down]
        return [
            [("status", args) for args in self.status_first],
            [("delete", args) for args in self.delete_pods]
            + [("annotate", args) for args in self.annotate_first]
            + unmark,
            [("create", (body,)) for body in unique.values()],
            [("annotate", args) for args in self.annotate_pods],
            [("status", args) for args in self.status],
            [("node", (m,)) for m in self.node_marks if m.powered_down],
        ]
