"""The lab: what evaluates PowerFlow without a cluster.

The ground truth, the simulator and its reports, the paper's baselines, the
simulated GPUs and the twin (the components run as processes against an
emulated API server). It may use the core and the components; nothing deployed
imports it (``.importlinter``), and the components' image leaves out what only
it needs (``docs/image.md``).
"""
