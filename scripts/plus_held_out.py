"""A baseline's average JCT over PowerFlow+'s at equal energy on the evaluation windows,
with PowerFlow+'s policy options changed: the rows of ``powerflow simulate --held-out``
for a PowerFlow+ variant, for the baselines ``--rivals`` names (AFS by default).

Per evaluation window, each rival's clock sweep and PowerFlow+'s eta sweep (as ``--held-out``
runs them), and the ratio's mean over the energies both curves cover
(``compare.jct_ratios``), at equal total and at equal in-window energy; then each
run's average JCT, total and in-window energy and energy above the limit.
docs/policy.md, section "Short first", shows the command and its numbers.

    .venv/bin/python scripts/plus_held_out.py --option short_first=0.5 --workers 2
"""

from __future__ import annotations

import argparse
import json

from powerflow.lab.schedulers import DEFAULT_FREQUENCIES_MHZ, scheduler
from powerflow.lab.sim.compare import ENERGIES, jct_ratios
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import RunSpec, TraceSpec, run_many
from powerflow.lab.sim.windows import EVALUATION_WINDOWS

PLUS = "powerflow+"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--option", action="append", default=[], help="a PowerFlow+ option, name=value (JSON)"
    )
    parser.add_argument(
        "--rivals", default="afs", help="baselines, comma-separated, each with its clock sweep"
    )
    parser.add_argument("--workers", type=int, default=2, help="processes")
    args = parser.parse_args()
    options = tuple((k, json.loads(v)) for k, v in (o.split("=", 1) for o in args.option))
    rivals = [r.strip() for r in args.rivals.split(",") if r.strip()]
    config = SimConfig()
    specs = []
    for window in EVALUATION_WINDOWS:
        trace = TraceSpec(window=window.name)
        specs += [
            RunSpec(rival, float(f), trace, config)
            for rival in rivals
            for f in DEFAULT_FREQUENCIES_MHZ
        ]
        specs += [
            RunSpec(PLUS, eta, trace, config, policy_options=options)
            for eta in scheduler(PLUS).sweep
        ]
    outcomes = run_many(specs, workers=args.workers)
    for window in EVALUATION_WINDOWS:
        mine = [o for o in outcomes if o.spec.trace.window == window.name]
        rows = [o.row() for o in mine]
        found = {e: jct_ratios(rows, e, reference=PLUS) for e in ENERGIES}
        for rival in rivals:
            ratios = {e: found[e].get(rival, {}).get("mean") for e in ENERGIES}
            print(window.name, f"{rival} over PowerFlow+:", ratios, flush=True)
        for o in mine:
            m = o.metrics
            print(
                f"    {o.spec.label}: avg JCT {m['avg_jct_s'] / 3600:.3f} h,"
                f" {m['total_energy_j'] / 1e9:.2f} GJ total, {m['window_energy_j'] / 1e9:.2f}"
                f" GJ in the window, {m['energy_above_limit_j']:.0f} J above the limit"
            )


if __name__ == "__main__":
    main()
