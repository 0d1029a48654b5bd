"""PowerFlow: energy-aware scheduling of deep-learning training jobs.

The core (``powerflow.core.models``, ``powerflow.core.policy``, ``powerflow.lab.sim`` and the
ground truth) is pure Python over numpy and scipy: no Kubernetes client, no
kopf, no FastAPI and no NVML may be imported here or below, so that the
simulator and the operator run exactly the same policy code. The Kubernetes
adapters live in ``powerflow.operator``, ``powerflow.extender`` and
``powerflow.nodeagent`` and import the core, never each other.
"""

__version__ = "0.1.0"
