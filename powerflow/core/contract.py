"""Names shared by the operator, the scheduler extender and the node agent.

The three components never import each other; they agree only through these
Kubernetes names. Plain strings, so the core may hold them without importing a
Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

GROUP: Final = "powerflow.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DLJob"
PLURAL: Final = "dljobs"
SHORT_NAME: Final = "dlj"

SCHEDULER_NAME: Final = "powerflow-scheduler"
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"

# On every worker pod the operator creates.
JOB_LABEL: Final = f"{GROUP}/job"
"""Pod label: the owning DLJob's name. Pods without it are not PowerFlow's."""
WORKER_INDEX_LABEL: Final = f"{GROUP}/worker-index"
WORKERS_ANNOTATION: Final = f"{GROUP}/workers"
"""Pod annotation: the job's worker count (the gang size the extender reserves)."""
FREQUENCY_ANNOTATION: Final = f"{GROUP}/frequency-mhz"
"""Pod annotation: the GPU core clock the node agent should lock, in MHz."""
GENERATION_ANNOTATION: Final = f"{GROUP}/allocation-generation"
"""Pod annotation: which allocation (rescale count) the pod belongs to."""
PLANNED_BLOCK_ANNOTATION: Final = f"{GROUP}/planned-block"
"""Pod annotation: JSON ``{"block": [[node, gpu_index], ...]}``, the GPUs the
policy's plan placed the gang on. The extender takes that block when it is a
block of the gang's size (aligned within one node, or whole nodes) whose GPUs
are free, else chooses its own, so
that the next plan finds the gang where it put it (otherwise it may move other
jobs again to make room: docs/twin.md, "Churn")."""
MODEL_ANNOTATION: Final = f"{GROUP}/model"
"""Pod annotation: the DLJob's ``model`` hint (absent without one); the node
agent's ``--simulate`` mode runs that model's ground truth on the pod's GPU."""

# Written by the extender at bind time.
PLACEMENT_ANNOTATION: Final = f"{GROUP}/placement"
"""Pod annotation: JSON ``{"node": str, "block": [[node, gpu_index], ...]}``,
the buddy block reserved for the pod's gang, so a restarted extender can
rebuild its reservations from bound pods."""

# The admin's budget.
BUDGET_CONFIGMAP: Final = "powerflow-budget"

# Written by the trainer (worker 0) or the node agent, read by the operator.
PROGRESS_ANNOTATION: Final = f"{GROUP}/iterations"
"""Pod annotation: training iterations completed so far (an integer). Without
it the operator estimates progress from the performance model."""

# The telemetry loop: operator -> node agent -> operator.
PROFILE_ANNOTATION: Final = f"{GROUP}/profile"
"""Pod annotation written by the operator while a job profiles: JSON
``{"clocksMhz": [int, ...], "sliceSeconds": float, "untilS": float}``. The node
agent locks each clock in turn (ascending order as written) for
``sliceSeconds``, or less when the first iteration comes so late that the
clocks would not fit before ``untilS`` (the window's end, Unix seconds;
optional), stepping only at iteration boundaries on a schedule from the
sweep's start (clock k from the first boundary at or after ``k * slice``),
tags every sample with its clock, and goes back to ``frequency-mhz`` after the
last slice or as soon as the annotation goes."""
POWER_LIMIT_ANNOTATION: Final = f"{GROUP}/power-limit-watts"
"""Pod annotation: a board power limit (W, per GPU) the node agent sets on the
pod's GPUs: the budget's backstop. The operator writes the plan's
``JobPlan.power_cap_w`` here (``operator/power_order.py``), when the plan leaves
little of the limit free. Absent: the GPU's default limit."""
POWERED_DOWN_ANNOTATION: Final = f"{GROUP}/powered-down"
"""Node annotation written by the operator on nodes its plan powers down (value:
when, RFC 3339). The node agent parks the GPUs of such a node that no container
holds (lowest clock, minimum power limit) until the mark goes."""
GPU_REPORT_ANNOTATION: Final = f"{GROUP}/gpu-report"
"""Node annotation written by the operator: the node agent's last accepted GPU report
(JSON ``{"reportedAt": RFC 3339, "report": <a GPUS_PATH body>}``), so that a restarted
operator plans the node's type at once. Anyone who may patch the node can edit it: its
readers validate it as they validate a report (``powerflow.core.gpu_facts``)."""
POWERED_DOWN_TAINT: Final = f"{GROUP}/powered-down"
"""Node taint key, effect ``PreferNoSchedule``, beside the annotation: steers
other pods away so an empty node stays empty (and cluster-autoscaler can take
it) without cordoning anything."""

# The worker library (in the training container) and its node's agent.
AGENT_WORKER_PORT: Final = 9402
"""The node agent's HTTP port for the worker library (a hostPort on the node:
workers reach it at the ``status.hostIP`` the downward API gives them)."""
AGENT_METRICS_PORT: Final = 9401
"""The node agent's Prometheus port."""
ITERATIONS_PATH: Final = "/v1/iterations"
"""Worker -> agent: POST JSON ``{"namespace": str, "pod": str, "uid": str,
"iterations": int, "gpuUuids": [str, ...]}`` (``gpuUuids`` optional: the
fallback mapping when the kubelet's PodResources socket is absent)."""
SAMPLES_PATH: Final = "/v1/samples"
"""Agent -> operator: POST ``powerflow.core.telemetry`` batches, bearer token of the
agent's projected ServiceAccount token (audience ``INGEST_AUDIENCE``)."""
INGEST_AUDIENCE: Final = "powerflow-ingest"
INGEST_PORT: Final = 9443
"""The operator's ingest port (Service ``powerflow-ingest``)."""

AGENT_ACCOUNT: Final = "system:serviceaccount:powerflow-system:powerflow-nodeagent"
"""The node agents' service account as the chart installs it (release namespace
``powerflow-system``): the operator accepts samples from it alone by default."""
GPUS_PATH: Final = "/v1/gpus"
"""Agent -> operator: POST a ``powerflow.core.gpu_facts`` report of the node's GPUs (what
NVML says of them), with the same token as ``SAMPLES_PATH``."""


def dljob_controller(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A pod's controller ``ownerReference`` (``metadata`` given) when it is a DLJob, as
    the operator creates its workers; else None. The job label alone is anyone's to
    write; the owner is the API server's truth: its garbage collector deletes a pod
    whose owner does not exist, or lives in another namespace. Untrusted shapes are
    read as no owner."""
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("kind") == KIND:
            return ref
    return None
