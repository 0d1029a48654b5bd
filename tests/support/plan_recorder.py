"""A policy wrapper for simulator tests: the real policy decides, its plans are kept."""

from __future__ import annotations

from dataclasses import dataclass, field

from powerflow.core.policy.snapshot import Plan, Policy, Snapshot


@dataclass
class Recorder:
    """The real policy, its plans kept."""

    inner: Policy
    plans: list[Plan] = field(default_factory=list)

    def plan(self, snapshot: Snapshot) -> Plan:
        plan = self.inner.plan(snapshot)
        self.plans.append(plan)
        return plan
