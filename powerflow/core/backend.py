"""The one seam between a scheduling policy and the cluster it drives.

The simulator and the operator both implement ``Backend``: one builds the
snapshot from simulated state and applies the plan to it, the other reads the
Kubernetes API and patches it. Either way ``schedule_once`` is the code that
calls the policy (the only other caller is ``powerflow plan``, which shows one
decision and applies nothing), so the policy and how it is called are shared,
never copied: the decisions the simulator measures are the ones the operator
makes.
"""

from __future__ import annotations

from typing import Protocol

from powerflow.core.policy.snapshot import Plan, Policy, Snapshot


class Backend(Protocol):
    """Where a policy's input comes from and where its decision goes."""

    def snapshot(self) -> Snapshot:
        """The cluster, active jobs, budget and time as of now."""
        ...

    def apply(self, plan: Plan) -> None:
        """Make the cluster follow ``plan`` (allocations, clocks, power-downs)."""
        ...


def schedule_once(policy: Policy, backend: Backend) -> Plan:
    """One scheduling event: snapshot, decide, apply."""
    plan = policy.plan(backend.snapshot())
    backend.apply(plan)
    return plan
