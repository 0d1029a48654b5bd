"""Choosing the baselines' knobs on the tuning windows, never on the evaluation's.

A knob chosen while looking at the days the results are reported on is tuned
on the test set. Each baseline knob is therefore chosen on
``windows.TUNING_WINDOWS`` (days that overlap no evaluation window), by the
objective the baseline itself pursues: Tiresias and Gandiva minimise average
JCT, at the comparison's top clock. On each tuning window every setting's
average JCT is divided by the best setting's on that window, so every window
weighs the same; the setting with the lowest mean of those is chosen.

    powerflow sweep tuning              # every grid on the four tuning windows
    powerflow sweep tuning --quick      # the first 2 h of each, 8 nodes

Zeus's ``eta_knob`` is not tuned here: it is its user's weight of energy against
time, not a setting with a best value for the baseline's own objective (by
average JCT alone it would be 0, every job at the top limit), so the comparison
sweeps it like a clock (``powerflow.lab.schedulers.ZEUS_ETA_KNOBS``) and compares
at equal energy along it; docs/baselines.md, "Zeus", gives the runs.

The chosen values are the baselines' defaults (``TIRESIAS_THRESHOLDS_GPU_S``,
``TIRESIAS_PROMOTE_KNOB``, ``TIRESIAS_SKEW_SLOWDOWN``,
``GandivaPolicy.max_jobs_per_gpu``), each naming
this command; docs/baselines.md holds the table it printed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from powerflow.lab.baselines.tiresias import TIRESIAS_PROMOTE_KNOB, TIRESIAS_THRESHOLDS_GPU_S
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import RunOutcome, RunSpec, TraceSpec
from powerflow.lab.sim.windows import TUNING_WINDOWS

CLOCK_MHZ = 1410.0
"""The comparison's top clock: the knobs decide when and where jobs run, not how fast."""


@dataclass(frozen=True)
class Setting:
    """One point of a baseline's grid: its policy options."""

    scheduler: str
    options: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_text(v)}" for k, v in self.options)


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(f"{v:g}" for v in value) + ")"
    return "none" if value is None else f"{value:g}"


THRESHOLDS: tuple[tuple[float, ...], ...] = (
    (3250.0, 7200.0),  # the Tiresias simulator's (dlas-gpu): three queues
    (3600.0,),  # two queues at one GPU-hour
    (32500.0, 72000.0),  # ten times the simulator's: these traces' jobs are long
    (32500.0, 72000.0, 180000.0),  # and one queue more
    (325000.0, 720000.0),  # a hundred times: hardly any demotion
)
PROMOTE_KNOBS: tuple[float | None, ...] = (None, 2.0, 8.0)
"""None: no promotion (``dlas-gpu``); the Tiresias simulator sweeps 0.5 to 1000."""
SKEW_SLOWDOWNS = (0.0, 0.03, 0.05, 0.1)
"""Tiresias' placement sensitivity (``skew_slowdown``), at the tuned thresholds: 0 makes
every job whose model slows when spread wait for a consolidated block, 0.1 hardly any."""
JOBS_PER_GPU = (1, 2, 3, 4)
"""Gandiva's time-slicing cap: 1 is no sharing."""

GRIDS: dict[str, tuple[Setting, ...]] = {
    "tiresias": tuple(
        Setting("tiresias", (("queue_thresholds_gpu_s", th), ("promote_knob", knob)))
        for th in THRESHOLDS
        for knob in PROMOTE_KNOBS
    ),
    "tiresias placement": tuple(
        Setting(
            "tiresias",
            (
                ("queue_thresholds_gpu_s", TIRESIAS_THRESHOLDS_GPU_S),
                ("promote_knob", TIRESIAS_PROMOTE_KNOB),
                ("skew_slowdown", skew),
            ),
        )
        for skew in SKEW_SLOWDOWNS
    ),
    "gandiva": tuple(Setting("gandiva", (("max_jobs_per_gpu", k),)) for k in JOBS_PER_GPU),
}


def tuning_specs(config: SimConfig, *, hours: float | None = None) -> list[RunSpec]:
    """Every grid point on every tuning window, tagged ``tune`` (so no comparison
    counts them)."""
    specs = []
    for window in TUNING_WINDOWS:
        trace = TraceSpec(window=window.name, hours=hours)
        for grid in GRIDS.values():
            specs += [
                RunSpec(s.scheduler, CLOCK_MHZ, trace, config, tag="tune", policy_options=s.options)
                for s in grid
            ]
    return specs


@dataclass(frozen=True)
class Scored:
    setting: Setting
    score: float
    """Mean over the windows of average JCT / the best setting's on that window."""
    jct_h: tuple[float, ...]
    """Average JCT per tuning window, hours."""


def score(outcomes: Sequence[RunOutcome]) -> dict[str, list[Scored]]:
    """Per baseline, its settings from best to worst."""
    jct: dict[tuple[str, tuple[tuple[str, Any], ...]], dict[str, float]] = {}
    for o in outcomes:
        key = (o.spec.scheduler, o.spec.policy_options)
        jct.setdefault(key, {})[o.spec.trace.window or ""] = float(o.metrics["avg_jct_s"])
    windows = [w.name for w in TUNING_WINDOWS if any(w.name in v for v in jct.values())]
    out: dict[str, list[Scored]] = {}
    for name, grid in GRIDS.items():
        mine = [s for s in grid if (s.scheduler, s.options) in jct]
        if not mine:
            continue
        best = {w: min(jct[(s.scheduler, s.options)][w] for s in mine) for w in windows}
        scored = [
            Scored(
                s,
                sum(jct[(s.scheduler, s.options)][w] / best[w] for w in windows) / len(windows),
                tuple(jct[(s.scheduler, s.options)][w] / 3600 for w in windows),
            )
            for s in mine
        ]
        out[name] = sorted(scored, key=lambda x: (x.score, x.setting.label))
    return out


def rows(result: Mapping[str, list[Scored]]) -> list[dict[str, Any]]:
    """One flat row per setting, for the CSV and JSON."""
    names = [w.name for w in TUNING_WINDOWS]
    return [
        {
            "scheduler": name,
            "setting": s.setting.label,
            "score": s.score,
            **{f"avg_jct_h_{w}": v for w, v in zip(names, s.jct_h, strict=False)},
            "chosen": k == 0,
        }
        for name, scored in result.items()
        for k, s in enumerate(scored)
    ]


def with_hours(specs: Sequence[RunSpec], hours: float) -> list[RunSpec]:
    """``specs`` on the first ``hours`` of their windows (``--quick``)."""
    return [replace(s, trace=replace(s.trace, hours=hours)) for s in specs]
