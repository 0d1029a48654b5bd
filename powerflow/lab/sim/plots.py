"""Figures of the paper's evaluation, as PNG files (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from powerflow.lab.schedulers import SCHEDULERS
from powerflow.lab.sim.output import knob_text
from powerflow.lab.sim.priors import HELD_OUT, RECURRING, main_run
from powerflow.lab.sim.runner import RunOutcome

GJ = 1e9
HOUR = 3600.0
STYLE = {
    "powerflow": ("tab:red", "o", "-"),
    "powerflow+": ("tab:orange", "P", "-"),
    "gandiva": ("tab:blue", "s", "-"),
    "tiresias": ("tab:green", "^", "-"),
    "afs": ("tab:purple", "D", "-"),
    "gandiva+zeus": ("tab:cyan", "*", "--"),
    "tiresias+zeus": ("tab:olive", "X", "--"),
}
"""Colour, marker and line per scheduler: no two share a colour or a marker."""
SPARE = (("tab:brown", "v"), ("tab:pink", "<"), ("tab:gray", ">"), ("black", "h"))
"""For schedulers not in ``STYLE``, handed out in order of appearance."""


def _styles(names: Iterable[str]) -> dict[str, tuple[str, str, str]]:
    """Every name its ``STYLE``, and the unknown ones a spare pair none of the others has."""
    out: dict[str, tuple[str, str, str]] = {}
    spare = iter(SPARE)
    for name in dict.fromkeys(names):
        if name in STYLE:
            out[name] = STYLE[name]
        else:
            color, marker = next(spare, ("tab:gray", "x"))
            out[name] = (color, marker, "-")
    return out


def point_label(row: Mapping[str, Any]) -> str:
    """What a point of Fig. 8 is: ``eta 0.6``, ``1410 MHz``, ``eta_knob 0.5`` (Zeus),
    or ``own clock`` (a row that records no setting)."""
    text = knob_text(row)
    return "own clock" if text == "-" else text


def jct_vs_energy_figure(rows: Sequence[Mapping[str, Any]], title: str) -> Figure:
    """Fig. 8: average JCT against total energy, one curve per scheduler, every point
    labelled with its setting (fitted, untagged runs; the oracle runs are Fig. 10's)."""
    fig, ax = plt.subplots(figsize=(9, 6))
    fitted = [r for r in rows if main_run(r)]
    styles = _styles(r["scheduler"] for r in fitted)
    for i, (name, (color, marker, line)) in enumerate(styles.items()):
        mine = sorted(
            (r for r in fitted if r["scheduler"] == name), key=lambda r: r["total_energy_j"]
        )
        x = [r["total_energy_j"] / GJ for r in mine]
        y = [r["avg_jct_s"] / HOUR for r in mine]
        ax.plot(x, y, marker=marker, linestyle=line, color=color, label=name, markersize=8)
        for r, xi, yi in zip(mine, x, y, strict=True):
            ax.annotate(
                point_label(r),
                (xi, yi),
                xytext=(5, 5) if i % 2 == 0 else (5, -11),  # neighbours' labels apart
                textcoords="offset points",
                fontsize=7,
                color=color,
            )
    ax.set_xlabel("total energy (GJ)")
    ax.set_ylabel("average JCT (h)")
    ax.set_title(f"Average JCT against total energy: {title}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="scheduler (points: eta, GPU clock or eta_knob)", fontsize=8, title_fontsize=8)
    return fig


def jct_vs_energy(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """``jct_vs_energy_figure`` as a PNG."""
    return _save(jct_vs_energy_figure(rows, title), path)


def allocation_and_power_figure(outcomes: Sequence[RunOutcome]) -> Figure:
    """Fig. 9: GPUs computing and cluster power over time, one run per scheduler, with
    each power limit as a dashed line: PowerFlow's budget per run, and the baselines'
    one limit (every GPU at full power) once."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    styles = _styles(o.spec.scheduler for o in outcomes)
    baseline_limit = False
    window_h = max((o.metrics.get("window_s") or 0.0 for o in outcomes), default=0.0) / HOUR
    if window_h > 0:
        for ax in (top, bottom):
            ax.axvspan(0.0, window_h, color="0.92", zorder=0)
        top.text(window_h, 0, " submissions end", fontsize=7, va="bottom", color="0.4")
    for o in outcomes:
        color, _, _ = styles[o.spec.scheduler]
        t = (o.series.t_s - o.series.t_s[0]) / HOUR
        top.step(t, o.series.busy_gpus, where="post", color=color, label=o.spec.label, lw=1)
        bottom.step(t, o.series.power_w / 1e3, where="post", color=color, lw=1)
        limit = o.series.limit_w
        if not np.isfinite(limit).any():
            continue
        spec = SCHEDULERS.get(o.spec.scheduler)
        if spec is None or spec.is_baseline:
            if baseline_limit:
                continue
            baseline_limit = True
            color, label = "tab:gray", "baselines' limit (all GPUs at full power)"
        else:
            watts = float(np.min(limit))
            label = f"{o.spec.label} budget ({watts:,.0f} W)"
        bottom.step(t, limit / 1e3, where="post", color=color, linestyle="--", lw=1.5, label=label)
    top.set_ylabel("GPUs computing")
    top.set_title("GPUs computing", fontsize=9)
    bottom.set_ylabel("cluster power (kW)")
    bottom.set_title(
        "cluster power (colours as above) and the power limits (dashed);"
        " grey: the submission window",
        fontsize=9,
    )
    bottom.set_xlabel("time since the first submission (h)")
    top.legend(fontsize=7, title="scheduler (run)", title_fontsize=7)
    bottom.legend(fontsize=7, title="power limits", title_fontsize=7)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.suptitle(
        "GPU allocation and cluster power over time\n"
        "(per scheduler, its run whose energy is closest to Gandiva+Zeus's at eta_knob 0.5)",
        fontsize=10,
    )
    return fig


def allocation_and_power(outcomes: Sequence[RunOutcome], path: Path) -> Path:
    """``allocation_and_power_figure`` as a PNG."""
    return _save(allocation_and_power_figure(outcomes), path)


def fitted_vs_oracle_figure(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Fig. 10: PowerFlow (and PowerFlow+, dashed) with fitted models against the ground
    truth ("pre-profiled"), every point labelled with its eta."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, line in (("powerflow", "-"), ("powerflow+", "--")):
        for oracle, priors, label, color, marker in (
            (False, HELD_OUT, "fitted, held-out priors", "tab:red", "o"),
            (False, RECURRING, "fitted, own model's prior", "tab:blue", "^"),
            (True, HELD_OUT, "oracle", "k", "s"),
        ):
            mine = sorted(
                (
                    r
                    for r in rows
                    if r["scheduler"] == name
                    and bool(r.get("oracle")) == oracle
                    and not r.get("tag")
                    and (oracle or r.get("priors", HELD_OUT) == priors)
                ),
                key=lambda r: r["total_energy_j"],
            )
            if not mine:
                continue
            x = [r["total_energy_j"] / GJ for r in mine]
            y = [r["avg_jct_s"] / HOUR for r in mine]
            ax.plot(x, y, marker=marker, linestyle=line, color=color, label=f"{name}, {label}")
            for r, xi, yi in zip(mine, x, y, strict=True):
                ax.annotate(
                    point_label(r), (xi, yi), xytext=(4, 4), textcoords="offset points", fontsize=7
                )
    ax.set_xlabel("total energy (GJ)")
    ax.set_ylabel("average JCT (h)")
    ax.set_title(
        "PowerFlow (solid) and PowerFlow+ (dashed): fitted models against the ground truth",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def fitted_vs_oracle(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """``fitted_vs_oracle_figure`` as a PNG."""
    return _save(fitted_vs_oracle_figure(rows), path)


def sensitivity_figure(
    studies: Mapping[str, Sequence[Mapping[str, Any]]], axis_labels: Mapping[str, str]
) -> Figure:
    """Fig. 11: average JCT along each sensitivity axis, one line per scheduler."""
    fig, axes = plt.subplots(1, len(studies), figsize=(5 * len(studies), 4.3), squeeze=False)
    for ax, (study, rows) in zip(axes[0], studies.items(), strict=True):
        styles = _styles(r["scheduler"] for r in rows)
        for name, (color, marker, line) in styles.items():
            pts = sorted((r["x"], r["avg_jct_s"] / HOUR) for r in rows if r["scheduler"] == name)
            x, y = zip(*pts, strict=True)
            ax.plot(x, y, marker=marker, linestyle=line or "--", color=color, label=name)
        label = axis_labels.get(study, study)
        ax.set_xlabel(label)
        ax.set_ylabel("average JCT (h)")
        ax.set_title(f"by {label}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        "Sensitivity: average JCT on 100-job synthetic traces (PowerFlow at eta 0.6,"
        " the baselines at 1410 MHz, the Zeus variants at eta_knob 0.5)",
        fontsize=10,
    )
    return fig


def sensitivity(
    studies: Mapping[str, Sequence[Mapping[str, Any]]], axis_labels: Mapping[str, str], path: Path
) -> Path:
    """``sensitivity_figure`` as a PNG."""
    return _save(sensitivity_figure(studies, axis_labels), path)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = [
    "allocation_and_power",
    "allocation_and_power_figure",
    "fitted_vs_oracle",
    "fitted_vs_oracle_figure",
    "jct_vs_energy",
    "jct_vs_energy_figure",
    "sensitivity",
    "sensitivity_figure",
]
