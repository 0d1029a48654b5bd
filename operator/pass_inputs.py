"""What a pass takes besides the cluster: the controller's memory between passes and
the operator's settings (``reconcile``'s last two arguments)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerflow.operator.jobs import RequestCache
from powerflow.operator.learning import MeasuredPower
from powerflow.operator.refusals import Refusal

from powerflow.core.profiling import PAPER_SWEEP, ClockSweep

DEFAULT_PROFILING_WINDOW_S = 240.0


@dataclass(frozen=True)
class PassSettings:
    """The operator's settings a pass follows (its command line)."""

    profiling_window_s: float = DEFAULT_PROFILING_WINDOW_S
    """A job profiles a GPU count it has not run on for this long."""
    profile_sweep: ClockSweep = PAPER_SWEEP
    """The clocks its workers sweep meanwhile (``job_controller.converge``)."""
    progress_interval_s: float = 0.0
    """Progress and energy are written at most this often per job (``_account_all``)."""
    pool_labels: Mapping[str, str] | None = None
    """Not from the command line but from the cluster, this pass: each planned node's GPU
    product label where the pass plans several pools (``nodes.fleet_nodes``), which new
    workers are pinned to (``job_controller.converge``); None with one pool."""


@dataclass(frozen=True)
class PassMemory:
    """What the controller carries from one pass to the next. All of it may be empty
    (a restarted operator has none): status and pods say the rest."""

    anchors: Mapping[str, float] | None = None
    """The previous pass's ``Actions.anchors``."""
    requests: RequestCache | None = None
    """Memoises DLJob parsing across passes."""
    refused: Mapping[str, Sequence[Refusal]] | None = None
    """The previous pass's refused writes by job key (``Kube.apply``'s answer,
    ``refusals``)."""
    progress_written: Mapping[str, float] | None = None
    """When each job's progress was last written (``_account_all``)."""
    learned: Mapping[str, Mapping[str, Any]] | None = None
    """The online refit's ``status.model`` fields by job key (``_learned_model``)."""
    measured: Mapping[str, MeasuredPower] | None = None
    """Each job's latest measured power (``build_snapshot``)."""
    power_ratio: float = 1.0
    """The recent measured / planned power of the jobs running as planned
    (``Snapshot.power_ratio``)."""
    agent_progress: Mapping[str, tuple[int, int, float | None]] | None = None
    """Job key -> (generation, iterations, when they reached the job's total) the node
    agents reported (``reported_progress``); with the workers' progress annotations,
    the most iterations of the current generation count (``_View``,
    ``_done_by_count``)."""


NO_MEMORY = PassMemory()
"""A first pass's memory: nothing carried over."""
DEFAULT_SETTINGS = PassSettings()
