"""The paper's baseline schedulers, each a ``Policy`` over the same snapshot.

Pure decision code like ``powerflow.core.policy``: a frozen dataclass configured by
its constructor, no clock, no I/O, no state kept between calls (everything is
derived from the snapshot: current placements, arrival order, attained
service). Each module's docstring says which simplifications of the published
algorithm it makes and why.
"""

from powerflow.lab.baselines.afs import AfsPolicy
from powerflow.lab.baselines.gandiva import GandivaPolicy
from powerflow.lab.baselines.tiresias import TiresiasPolicy
from powerflow.lab.baselines.zeus import ZeusPolicy, zeus_clock, zeus_power_limit

__all__ = [
    "AfsPolicy",
    "GandivaPolicy",
    "TiresiasPolicy",
    "ZeusPolicy",
    "zeus_clock",
    "zeus_power_limit",
]
