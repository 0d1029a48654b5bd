"""What the engine needs of the GPU type a job runs on (``OnType``, a job's ``on``).

Its own module so that a job (``jobs.SimJob``) can name its type without importing
the mixed cluster's state (``mixed``), which imports jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from powerflow.core.gpus import GpuSpec
from powerflow.core.learning import Learner
from powerflow.lab.sim.rates import TruthRates
from powerflow.lab.sim.world import World


@dataclass(frozen=True)
class OnType:
    """What the engine needs of the GPU type a job runs on."""

    gpu: GpuSpec
    world: World
    rates: TruthRates
    learner: Learner
    clocks: frozenset[int]
    """The clocks a plan may set on this type."""
    profile_clocks: tuple[int, ...]
    """The ladder a profiling sweep runs on this type."""
