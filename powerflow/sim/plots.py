"""Figures of the paper's evaluation, as PNG files (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from powerflow.sim.runner import RunOutcome

GJ = 1e9
HOUR = 3600.0
STYLE = {
    "powerflow": ("tab:red", "o", "-"),
    "powerflow+": ("tab:orange", "P", "-"),
    "gandiva": ("tab:blue", "s", "-"),
    "tiresias": ("tab:green", "^", "-"),
    "afs": ("tab:purple", "D", "-"),
    "gandiva+zeus": ("tab:blue", "*", ""),
    "tiresias+zeus": ("tab:green", "*", ""),
}


def _style(name: str) -> tuple[str, str, str]:
    return STYLE.get(name, ("tab:gray", "x", "-"))


def jct_vs_energy(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Fig. 8: average JCT against total energy, one curve per scheduler."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["scheduler"] for r in rows):
        pts = sorted(
            (r["total_energy_j"] / GJ, r["avg_jct_s"] / HOUR)
            for r in rows
            if r["scheduler"] == name and not r.get("oracle") and not r.get("tag")
        )
        if not pts:
            continue
        color, marker, line = _style(name)
        x, y = zip(*pts, strict=True)
        ax.plot(x, y, marker=marker, linestyle=line, color=color, label=name, markersize=8)
    ax.set_xlabel("total energy (GJ)")
    ax.set_ylabel("average JCT (h)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def allocation_and_power(outcomes: Sequence[RunOutcome], path: Path) -> Path:
    """Fig. 9: GPUs computing and cluster power over time, one run per scheduler."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for o in outcomes:
        color, _, _ = _style(o.spec.scheduler)
        t = (o.series.t_s - o.series.t_s[0]) / HOUR
        top.step(t, o.series.busy_gpus, where="post", color=color, label=o.spec.label, lw=1)
        bottom.step(t, o.series.power_w / 1e3, where="post", color=color, lw=1)
    top.set_ylabel("GPUs computing")
    bottom.set_ylabel("cluster power (kW)")
    bottom.set_xlabel("time (h)")
    top.legend(fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return _save(fig, path)


def fitted_vs_oracle(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Fig. 10: PowerFlow (and PowerFlow+, dashed) with fitted models against the ground
    truth ("pre-profiled")."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, line in (("powerflow", "-"), ("powerflow+", "--")):
        for oracle, label, color in ((False, "fitted models", "tab:red"), (True, "oracle", "k")):
            pts = sorted(
                (r["total_energy_j"] / GJ, r["avg_jct_s"] / HOUR)
                for r in rows
                if r["scheduler"] == name and bool(r.get("oracle")) == oracle
            )
            if pts:
                x, y = zip(*pts, strict=True)
                ax.plot(x, y, marker="o", linestyle=line, color=color, label=f"{name}, {label}")
    ax.set_xlabel("total energy (GJ)")
    ax.set_ylabel("average JCT (h)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def sensitivity(
    studies: Mapping[str, Sequence[Mapping[str, Any]]], axis_labels: Mapping[str, str], path: Path
) -> Path:
    """Fig. 11: average JCT along each sensitivity axis, one line per scheduler."""
    fig, axes = plt.subplots(1, len(studies), figsize=(5 * len(studies), 4), squeeze=False)
    for ax, (study, rows) in zip(axes[0], studies.items(), strict=True):
        for name in dict.fromkeys(r["scheduler"] for r in rows):
            pts = sorted((r["x"], r["avg_jct_s"] / HOUR) for r in rows if r["scheduler"] == name)
            color, marker, line = _style(name)
            x, y = zip(*pts, strict=True)
            ax.plot(x, y, marker=marker, linestyle=line or "--", color=color, label=name)
        ax.set_xlabel(axis_labels.get(study, study))
        ax.set_ylabel("average JCT (h)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["allocation_and_power", "fitted_vs_oracle", "jct_vs_energy", "sensitivity"]
