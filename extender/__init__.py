"""The kube-scheduler extender (``powerflow.extender``): filter, prioritize, bind.

A thin FastAPI adapter over the core's placement module; it never imports
``powerflow.operator`` or ``powerflow.nodeagent``.
"""
