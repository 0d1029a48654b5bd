"""The kube-scheduler extender (``powerflow.extender``): filter, prioritize, bind.

A thin FastAPI adapter over the core's placement module; it never imports
``powerflow.operator`` or ``powerflow.nodeagent``. ``wire`` speaks
kube-scheduler's extender/v1 JSON, ``state`` holds the cluster cache and the
gang reservations (no I/O), ``mirror`` keeps it in step with the API server,
``service`` answers the verbs and ``app`` serves them.
"""

from .app import create_app

__all__ = ["create_app"]
