"""The core: GPU specs, performance models, the policy and placement, and the names
the components agree on.

Pure: it imports no Kubernetes, web, NVML or plotting library, nothing of the
components and nothing of the lab (``.importlinter``), so the operator, the
simulator and a benchmark run the very same decisions.
"""
