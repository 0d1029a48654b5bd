"""A frozen copy of ``powerflow.baselines`` as of commit ce4de93, before its speed work.

The reference that ``test_baselines_equivalence.py`` and
``benchmarks/baselines_bench.py --replay`` hold the optimised baselines to:
same plans, field for field, from the same snapshots in the same order. Only
the imports differ from that commit. Do not optimise or fix this copy.
"""

from baselines_ref.afs import AfsPolicy
from baselines_ref.gandiva import GandivaPolicy
from baselines_ref.tiresias import TiresiasPolicy
from baselines_ref.zeus import ZeusPolicy

__all__ = ["AfsPolicy", "GandivaPolicy", "TiresiasPolicy", "ZeusPolicy"]
