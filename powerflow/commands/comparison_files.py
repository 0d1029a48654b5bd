"""The comparison's files: its CSV, its JSON and its three figures.

Fig. 8 (average JCT against energy) is the slowest to draw: its labels are placed
one by one, about 3.5 s of CPU on the default comparison. With more than one
worker it is not drawn after the last run but beside the runs (``FiguresAhead``):
Fig. 8 and Fig. 9 show every run except those whose jobs start from their own
model's prior (the recurring runs, which only Fig. 10 shows), so the workers take
those runs last, and once every other run is done both figures are drawn in a
process of their own while the workers finish the recurring runs. Only Fig. 10, the
CSV and the JSON are left for after the last run. The figures are the same bytes
either way: each is drawn from the same rows, in the same order, as without.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from powerflow.lab.sim import output
from powerflow.lab.sim.compare import zeus_energy
from powerflow.lab.sim.priors import RECURRING, main_run
from powerflow.lab.sim.runner import RunOutcome, RunSpec, start_order

FIG8 = "jct_vs_energy.png"
FIG9 = "allocation_power.png"
FIG10 = "fitted_vs_oracle.png"


def only_in_fig10(spec: RunSpec) -> bool:
    """Whether Fig. 10 is the only figure that shows the run: its jobs start from their
    own model's prior (Fig. 8 draws the fitted and oracle runs, Fig. 9 the main ones)."""
    return spec.fits_models and spec.priors == RECURRING


class FiguresAhead:
    """Draws Fig. 8 and Fig. 9 in a process of its own as soon as every run they show
    has ended (``done``, called as each run ends), while the recurring runs, which
    ``order`` hands to the workers last, still run."""

    def __init__(self, specs: Sequence[RunSpec], out: Path, title: str) -> None:
        self._specs = list(specs)
        self._out = out
        self._title = title
        self._shown = [i for i, spec in enumerate(self._specs) if not only_in_fig10(spec)]
        self._ended: dict[int, RunOutcome] = {}
        self._pool: ProcessPoolExecutor | None = None
        self.drawn: tuple[Future[Path], Future[Path]] | None = None
        """Fig. 8's and Fig. 9's drawing, once started."""

    def order(self) -> list[int]:
        """The runs the two figures show, longest first (``start_order``), then the rest."""
        first = [i for i in start_order(self._specs) if not only_in_fig10(self._specs[i])]
        return [*first, *(i for i in start_order(self._specs) if only_in_fig10(self._specs[i]))]

    def done(self, index: int, outcome: RunOutcome) -> None:
        self._ended[index] = outcome
        if self.drawn is not None or any(i not in self._ended for i in self._shown):
            return
        # Imported before the drawing process is forked from this one, which then has
        # matplotlib already; not before the runs, which would wait for it.
        from powerflow.lab.sim import plots

        shown = [self._ended[i] for i in self._shown]  # in the specs' order, as at the end
        self._pool = ProcessPoolExecutor(max_workers=1)
        self.drawn = (
            self._pool.submit(
                plots.jct_vs_energy, [o.row() for o in shown], self._out / FIG8, self._title
            ),
            self._pool.submit(
                plots.allocation_and_power, pick_for_timeline(shown), self._out / FIG9
            ),
        )

    def __enter__(self) -> FiguresAhead:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=error is not None)


def write_outputs(
    out: Path,
    outcomes: list[RunOutcome],
    ratios: dict[str, Any],
    title: str,
    plus: dict[str, Any] | None = None,
    *,
    workers: int = 1,
    ahead: FiguresAhead | None = None,
) -> list[Path]:
    """The CSV, the JSON and the figures (Fig. 8, 9 and 10, in that order in the list).

    Fig. 8 and Fig. 9 come from ``ahead`` where it drew them. Otherwise, with
    ``workers`` above 1, Fig. 8 is drawn in a process of its own while this one draws
    the others: about a fifth off the time after the last run (4.75-5.06 s to
    3.56-4.28 s on 2 cores: this function on the default comparison's outcomes,
    ``run_many(comparison(TraceSpec(), SimConfig()))``, timed with workers 1 and 2,
    alternated, twice each, in two runs)."""
    # Matplotlib only where plots are drawn: it is a third of a single run's start-up.
    from powerflow.lab.sim import plots

    rows = [o.row() for o in outcomes]
    files = [
        output.write_csv(rows, out / "runs.csv"),
        output.write_json(
            {"title": title, "runs": rows, "jct_ratio_at_equal_energy": ratios, **(plus or {})},
            out / "results.json",
        ),
    ]
    with contextlib.ExitStack() as stack:
        fig8: Future[Path] | Path
        fig9: Future[Path] | Path
        if ahead is not None and ahead.drawn is not None:
            fig8, fig9 = ahead.drawn
        else:
            fig8_args = (rows, out / FIG8, title)
            if workers > 1:
                pool = stack.enter_context(ProcessPoolExecutor(max_workers=1))
                fig8 = pool.submit(plots.jct_vs_energy, *fig8_args)
            else:
                fig8 = plots.jct_vs_energy(*fig8_args)
            fig9 = plots.allocation_and_power(pick_for_timeline(outcomes), out / FIG9)
        fig10 = []
        if any(o.spec.oracle for o in outcomes):
            fig10.append(plots.fitted_vs_oracle(rows, out / FIG10))
        drawn = [f if isinstance(f, Path) else f.result() for f in (fig8, fig9)]
    return [*files, *drawn, *fig10]


def pick_for_timeline(outcomes: Sequence[RunOutcome]) -> list[RunOutcome]:
    """Fig. 9's choice: per scheduler, the run whose energy is closest to Gandiva+Zeus's
    at Zeus's default ``eta_knob`` (``compare.zeus_energy``), among the runs the
    comparison compares: a budget below every GPU at its lowest power cap
    (``RunOutcome.below_cap_floor``) queues jobs by design, so such a run stands for
    its scheduler only where it has no other."""
    fitted = [o for o in outcomes if main_run(o.row())]
    target = zeus_energy([o.row() for o in fitted], "gandiva+zeus")
    compared = {o.spec.scheduler for o in fitted if not o.below_cap_floor}
    chosen: dict[str, RunOutcome] = {}
    for o in fitted:
        if o.below_cap_floor and o.spec.scheduler in compared:
            continue
        best = chosen.get(o.spec.scheduler)
        if target is None:
            if best is None:
                chosen[o.spec.scheduler] = o
            continue
        gap = abs(o.metrics["total_energy_j"] - target)
        if best is None or gap < abs(best.metrics["total_energy_j"] - target):
            chosen[o.spec.scheduler] = o
    return list(chosen.values())
