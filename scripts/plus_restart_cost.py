"""PowerFlow+'s settings scored on the tuning windows when a checkpoint-restart costs more.

``powerflow sweep plus-tuning`` scores with the simulator's 30 s restart, the lower middle
of published costs (Pollux: 15-120 s). A setting that restarts jobs more often (the
short-first factor does) might win only because restarts are cheap there. This runs
settings of the short-first grid (``plus_tuning.SHORT_FIRST_GRID``: by default the
factor off, as the knobs grid chose, and PowerFlow+ as it runs) with ``--restart-s``
seconds per restart, on the cluster and in PowerFlow+'s own estimate
(``rescale_cost_s``, set by ``runner.with_restart_estimate``), with AFS's clock sweep
at the same cost, and scores them as the sweep does (``plus_tuning.score``).
docs/policy.md, section "Short first", shows the command and its numbers.

    .venv/bin/python scripts/plus_restart_cost.py --restart-s 120 --workers 2
"""

from __future__ import annotations

import argparse

from powerflow.lab.sim import plus_tuning
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import run_many


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restart-s", type=float, default=120.0, help="seconds per restart")
    parser.add_argument(
        "--settings",
        default="0,3",
        help="positions in plus_tuning.SHORT_FIRST_GRID (default 0,3: the factor off, and on)",
    )
    parser.add_argument("--workers", type=int, default=2, help="processes")
    args = parser.parse_args()
    grid = tuple(plus_tuning.SHORT_FIRST_GRID[int(k)] for k in args.settings.split(","))
    specs = plus_tuning.specs(SimConfig(restart_s=args.restart_s), grid=grid)
    outcomes = run_many(specs, workers=args.workers)
    print(f"restart {args.restart_s:g} s: AFS's average JCT over PowerFlow+'s at equal energy")
    for s in plus_tuning.score(outcomes, grid):
        cells = ", ".join("n/a" if r is None else f"{r:.2f}" for r in s.ratios)
        score = "n/a" if s.score is None else f"{s.score:.3f}"
        print(f"  {s.setting.label}: score {score}, {s.restarts:,} restarts; {cells}")
    names = ", ".join(f"{w.name} {e}" for w in plus_tuning.WINDOWS for e in ("total", "window"))
    print(f"  (ratios per window and energy: {names})")


if __name__ == "__main__":
    main()
