"""The project's error hierarchy: one root, one subclass per domain.

Callers catch ``PowerFlowError`` to handle anything PowerFlow raises on bad
input; the subclasses say which layer refused it.
"""


class PowerFlowError(Exception):
    """Root of every error PowerFlow raises on purpose."""


class DataError(PowerFlowError):
    """Bad input data: a malformed profile, samples file or trace."""


class ModelError(PowerFlowError):
    """A performance model cannot be fitted or predicts nonsense."""


class SnapshotError(PowerFlowError):
    """A policy snapshot is inconsistent (bad job, bad budget, bad cluster)."""


class BudgetError(PowerFlowError):
    """A power budget or budget schedule is malformed (a file, a ConfigMap's data)."""


class PlacementError(PowerFlowError):
    """GPUs cannot be placed as requested."""


class SimulationError(PowerFlowError):
    """The simulator was configured or driven inconsistently."""


class ResourceError(PowerFlowError):
    """A Kubernetes object (DLJob, budget ConfigMap, Node) cannot be used as written.

    ``reason`` is the CamelCase reason the operator puts on the object's
    condition and Kubernetes event.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
