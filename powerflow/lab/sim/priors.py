"""What a run's scheduler knows of its jobs before measuring them, and which
result rows make the main comparison.

A fitted run's jobs start from a prior and learn online (the 1-GPU pre-run,
then a profile at each new GPU count). The shipped priors are fitted to the
reference profiles the ground truth is built from, so a job that starts from
its own model's prior starts from what the evaluation's truth knows about it.
The default is therefore the held-out prior (``held_out_prior``: the other
models' median), as for a model the cluster never ran; starting from the own
model's prior is the recurring-job case, a real production case that is run
and reported apart, as are the runs with the ground truth itself (oracle).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HELD_OUT = "held-out"
"""Jobs start from priors that never saw their own model: a new model, the default."""
RECURRING = "recurring"
"""Jobs start from their own model's prior (``load_prior``): the same model ran before."""
PRIORS = (HELD_OUT, RECURRING)


def main_run(row: Mapping[str, Any]) -> bool:
    """Whether a result row belongs to the main comparison: models fitted from
    held-out priors (or a scheduler that fits none), not the ground truth, not a
    tagged study."""
    return not row.get("oracle") and not row.get("tag") and row.get("priors", HELD_OUT) == HELD_OUT


def run_name(row: Mapping[str, Any]) -> str:
    """The scheduler's name, marked where the run knew more than the main comparison's."""
    if row.get("oracle"):
        return f"{row['scheduler']} (oracle)"
    if row.get("priors") == RECURRING:
        return f"{row['scheduler']} (recurring)"
    return str(row["scheduler"])
