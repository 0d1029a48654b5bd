"""Names shared by the operator, the scheduler extender and the node agent.

The three components never import each other; they agree only through these
Kubernetes names. Plain strings, so the core may hold them without importing a
Kubernetes client.
"""

from __future__ import annotations

from typing import Final

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
