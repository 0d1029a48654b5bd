"""The kopf operator (``powerflow.operator``): DLJobs and the budget in, pods and status out.

A thin adapter: it turns cluster state into the core's snapshot, calls the
core policy and carries out the plan. No policy logic lives here, and it never
imports ``powerflow.extender`` or ``powerflow.nodeagent``.
"""
