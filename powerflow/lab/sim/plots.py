"""Figures of the paper's evaluation, as PNG files (matplotlib, Agg backend)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from adjustText import adjust_text
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from powerflow.lab.schedulers import SCHEDULERS
from powerflow.lab.sim.output import knob_text
from powerflow.lab.sim.priors import RECURRING
from powerflow.lab.sim.runner import RunOutcome

GJ = 1e9
HOUR = 3600.0
STYLE = {
    "powerflow": ("tab:red", "o", "-"),
    "powerflow+": ("tab:orange", "P", "-"),
    "gandiva": ("tab:blue", "s", "-"),
    "tiresias": ("tab:green", "^", "-"),
    "afs": ("tab:purple", "D", "-"),
    "gandiva+zeus": ("tab:cyan", "*", "-"),
    "tiresias+zeus": ("tab:olive", "X", "-"),
    "gandiva+zeus-clock": ("tab:brown", "v", "-"),
    "tiresias+zeus-clock": ("tab:pink", "<", "-"),
    "afs+zeus": ("navy", "p", "-"),
    "afs+job-clocks": ("darkgoldenrod", "8", "-"),
}
"""Colour, marker and line of every scheduler the lab runs, the same in every figure:
no two share a colour or a marker (line styles say what a run knew: ``KINDS``)."""
SPARE = (("tab:gray", ">"), ("black", "h"))
"""For names ``STYLE`` lacks (none the lab runs), handed out in order of appearance."""
KINDS = {
    "fitted": ("-", "full", "fitted, held-out priors"),
    "recurring": (":", "full", "fitted, own model's prior"),
    "oracle": ("--", "none", "oracle (ground truth)"),
}
"""Line, marker fill and legend words of each kind of run (``_kind``): the scheduler's
colour and marker say who ran, these what it knew of the jobs."""
RING: dict[str, Any] = {
    "marker": "o",
    "markersize": 17,
    "fillstyle": "none",
    "color": "red",
    "mew": 1.5,
}
"""The mark around a run that spent time above its power limit (``_over``)."""
MARKER_SIZE = 8.0
DPI = 110
"""Pixels per inch, of the figures as made and as saved: labels are placed in pixels, and
text does not scale quite in step with the rest when the resolution changes."""
GAP = 2.0
"""Pixels kept between labels and inside the axes' frame, against rounding."""
LABEL_ITERATIONS = 2000
"""adjustText's iterations: a fixed count, since its default is a time limit, which
would draw a figure differently on a busy machine. It stops sooner only once no label,
widened a little, touches another or a marker, which crowded figures seldom reach;
``_place`` settles what it leaves."""
BACKING = {"boxstyle": "square,pad=0.05", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
"""Behind each point label: a line that runs under it does not cross its text out."""


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


def _kind(row: Mapping[str, Any]) -> str | None:
    """Which of ``KINDS`` a result row is; None for a tagged study's run."""
    if row.get("tag"):
        return None
    if row.get("oracle"):
        return "oracle"
    return "recurring" if row.get("priors") == RECURRING else "fitted"


def _over(row: Mapping[str, Any]) -> bool:
    """Whether the run spent time above its power limit (the run table's "over h")."""
    return (row.get("time_above_limit_s") or 0.0) > 0


def point_label(row: Mapping[str, Any]) -> str:
    """What a point of Fig. 8 is: ``eta 0.6``, ``1410 MHz``, ``eta_knob 0.5`` (Zeus),
    or ``own clock`` (a row that records no setting)."""
    text = knob_text(row)
    return "own clock" if text == "-" else text


def _curves(ax: Axes, rows: Sequence[Mapping[str, Any]], kinds: Sequence[str]) -> None:
    """Average JCT against total energy: one curve per scheduler and kind of run in
    ``kinds``, each point labelled with its setting and ringed in red where the run
    spent time above its power limit; the legend, outside the axes, says what colours,
    lines and rings mean. Call it last: the labels are placed for the final layout."""
    chosen = [r for r in rows if _kind(r) in kinds]
    styles = _styles(r["scheduler"] for r in chosen)
    texts: list[Text] = []
    marks: list[tuple[float, float, float]] = []
    for name, (color, marker, line) in styles.items():
        for k in kinds:
            mine = sorted(
                (r for r in chosen if r["scheduler"] == name and _kind(r) == k),
                key=lambda r: r["total_energy_j"],
            )
            if not mine:
                continue
            x = [r["total_energy_j"] / GJ for r in mine]
            y = [r["avg_jct_s"] / HOUR for r in mine]
            dash, fill, words = KINDS[k]
            ax.plot(
                x,
                y,
                marker=marker,
                ls=line and dash,
                fillstyle=fill,
                color=color,
                ms=MARKER_SIZE,
                label=f"{name}, {words}",
            )
            for r, xi, yi in zip(mine, x, y, strict=True):
                texts.append(ax.text(xi, yi, point_label(r), fontsize=7, color=color, bbox=BACKING))
                marks.append((xi, yi, MARKER_SIZE))
                if _over(r):
                    ax.plot([xi], [yi], **RING)
                    marks.append((xi, yi, float(RING["markersize"])))
    used = [k for k in kinds if any(_kind(r) == k for r in chosen)]
    used = [] if used == ["fitted"] else used  # a key to line styles where they differ
    handles = [
        *(Line2D([], [], color=c, marker=m, ls=ln, label=n) for n, (c, m, ln) in styles.items()),
        *(Line2D([], [], color="0.4", ls=KINDS[k][0], label=KINDS[k][2]) for k in used),
    ]
    if any(_over(r) for r in chosen):
        handles.append(Line2D([], [], ls="", label="time above its power limit", **RING))
    ax.set_xlabel("total energy (GJ)")
    ax.set_ylabel("average JCT (h)")
    ax.grid(alpha=0.3)
    ax.legend(
        handles=handles,
        title="scheduler; points: eta, GPU clock or eta_knob",
        fontsize=8,
        title_fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    _place(ax, texts, marks)


def _place(ax: Axes, texts: list[Text], marks: list[tuple[float, float, float]]) -> None:
    """Moves the labels apart and off the markers (``marks``: x, y and the marker's size
    in points), then draws a grey line from each label that left its point back to it.
    adjustText does the placing; where it leaves a label over another or over any part
    of a marker (it stops after ``LABEL_ITERATIONS``), ``_free_spot`` moves it. Placing works in
    pixels, so it runs on the figure's final layout, with the axes' limits frozen: the
    lines would otherwise widen them and shift every label against its point."""
    fig = ax.get_figure(root=True)
    if not texts or fig is None:
        return
    fig.tight_layout()
    ax.set_xlim(ax.get_xlim())
    ax.set_ylim(ax.get_ylim())
    anchors = [text.get_position() for text in texts]  # each at its point, as made
    to_pixels = ax.transData
    markers = []
    for x, y, size in marks:
        px, py = to_pixels.transform((x, y))
        r = size * fig.dpi / 144  # half the marker's width
        markers.append(Bbox([(px - r, py - r), (px + r, py + r)]))
    to_data = to_pixels.inverted()
    adjust_text(
        texts,
        objects=[Bbox(to_data.transform(m.get_points())) for m in markers],
        ax=ax,
        iter_lim=LABEL_ITERATIONS,
        prevent_crossings=False,
    )
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent()
    placed: list[Bbox] = []
    for text, (x, y) in zip(texts, anchors, strict=True):
        box = text.get_window_extent(renderer)
        covers = any(box.overlaps(m) for m in markers)
        if covers or any(box.overlaps(other.padded(GAP)) for other in placed):
            box = _free_spot(box, [*placed, *markers], frame)
            cx, cy = to_data.transform(box.get_points().mean(axis=0))
            text.set_position((float(cx), float(cy)))
        placed.append(box)
        px, py = to_pixels.transform((x, y))
        if not box.padded(4).contains(px, py):  # from the label's nearest edge
            ex, ey = to_data.transform((min(max(px, box.x0), box.x1), min(max(py, box.y0), box.y1)))
            edge = (float(ex), float(ey))
            ax.add_patch(FancyArrowPatch(edge, (x, y), arrowstyle="-", color="0.6", lw=0.5))


def _free_spot(box: Bbox, taken: list[Bbox], frame: Bbox) -> Bbox:
    """The nearest place for ``box`` inside ``frame`` that overlaps nothing ``taken``,
    searched outwards in steps of half its height, eight directions a step."""
    step = box.height / 2
    frame = frame.padded(-GAP)
    taken = [other.padded(GAP) for other in taken]
    for ring in range(1, 400):
        for dx, dy in ((0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (-1, 1), (1, -1), (-1, -1)):
            spot = box.translated(dx * ring * step, dy * ring * step)
            inside = frame.contains(spot.x0, spot.y0) and frame.contains(spot.x1, spot.y1)
            if inside and not any(spot.overlaps(other) for other in taken):
                return spot
    return box


def jct_vs_energy_figure(rows: Sequence[Mapping[str, Any]], title: str) -> Figure:
    """Fig. 8: average JCT against total energy, one curve per scheduler from fitted
    models (held-out priors) and one per scheduler the oracle ran (dashed); the runs
    from their own models' priors are Fig. 10's."""
    fig, ax = plt.subplots(figsize=(11, 6), dpi=DPI)
    # Wrapped: on one line a long trace description runs off the figure's edge.
    ax.set_title(textwrap.fill(f"Average JCT against total energy: {title}", 100), fontsize=10)
    _curves(ax, rows, ("fitted", "oracle"))
    return fig


def jct_vs_energy(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """``jct_vs_energy_figure`` as a PNG."""
    return _save(jct_vs_energy_figure(rows, title), path)


def allocation_and_power_figure(outcomes: Sequence[RunOutcome]) -> Figure:
    """Fig. 9: GPUs computing and cluster power over time, one run per scheduler, with
    each power limit as a dashed line: PowerFlow's budget per run, and the baselines'
    one limit (every GPU at full power) once."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11.5, 7), sharex=True, dpi=DPI)
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
    # Beside the axes, never over the lines (a run at the top of the cluster for days
    # runs where a legend inside would sit).
    for ax, name in ((top, "scheduler (run)"), (bottom, "power limits")):
        ax.legend(
            fontsize=7, title=name, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0)
        )
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
    """Fig. 10: each scheduler the oracle ran, with fitted models (solid: held-out
    priors; dotted: its own model's prior) against the ground truth (dashed)."""
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=DPI)
    names = {r["scheduler"] for r in rows if r.get("oracle")}
    ax.set_title("Fitted models against the ground truth (oracle)", fontsize=10)
    _curves(ax, [r for r in rows if r["scheduler"] in names], tuple(KINDS))
    return fig


def fitted_vs_oracle(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """``fitted_vs_oracle_figure`` as a PNG."""
    return _save(fitted_vs_oracle_figure(rows), path)


def sensitivity_figure(
    studies: Mapping[str, Sequence[Mapping[str, Any]]], axis_labels: Mapping[str, str]
) -> Figure:
    """Fig. 11: average JCT along each sensitivity axis, one solid line per scheduler in
    its colour and marker throughout (the Zeus variants too, a point per value here)."""
    fig, axes = plt.subplots(
        1, len(studies), figsize=(5 * len(studies), 4.3), squeeze=False, dpi=DPI
    )
    styles = _styles(r["scheduler"] for rows in studies.values() for r in rows)
    for ax, (study, rows) in zip(axes[0], studies.items(), strict=True):
        for name, (color, marker, _) in styles.items():
            pts = sorted((r["x"], r["avg_jct_s"] / HOUR) for r in rows if r["scheduler"] == name)
            if not pts:
                continue
            x, y = zip(*pts, strict=True)
            ax.plot(x, y, marker=marker, color=color, label=name)
        label = axis_labels.get(study, study)
        ax.set_xlabel(label)
        ax.set_ylabel("average JCT (h)")
        ax.set_title(f"by {label}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # off the lines
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
    fig.savefig(path, dpi=DPI)
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
