"""The shipped Grafana dashboard drawn from a real Prometheus's series (a picture, not Grafana).

Each panel of ``dashboard.json`` at its grid position, each of its queries
run as Grafana runs a time-series panel (``query_range`` over the window, one
point per ``step``), one line per returned series, labelled by the target's
``legendFormat`` with the series' labels filled in. A panel whose queries
returned nothing says "No data", as Grafana does. The chart twin's test draws
it from the run it scraped (``e2e/test_chart_twin.py``); ``docs/dashboard.png``
is that picture.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from powerflow.lab.twin.monitoring import Prometheus

Obj = dict[str, Any]
UNITS = {"watt": "W", "hertz": "Hz", "s": "s", "percentunit": "", "short": "", "none": ""}


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def draw(board: Obj, prom: Prometheus, start: float, end: float, path: Path) -> dict[str, int]:
    """Write the picture; returns each panel's number of series (0: "No data")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = max((end - start) / 200, 1.0)
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    fig = plt.figure(figsize=(16, rows * 0.42))
    grid = fig.add_gridspec(rows, 24, hspace=1.2, wspace=1.5, top=0.96, bottom=0.03)
    counts: dict[str, int] = {}
    for panel in board["panels"]:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"] + 1 : g["y"] + g["h"], g["x"] : g["x"] + g["w"]])
        ax.set_title(panel["title"], fontsize=9, loc="left")
        unit = UNITS.get(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""), "")
        n = 0
        for target in panel["targets"]:
            for series in prom.query_range(target["expr"], start, end, step):
                xs = [float(t) - start for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(
                    xs,
                    ys,
                    lw=1.2,
                    label=legend(target.get("legendFormat", ""), series["metric"])[:40],
                )
                n += 1
        counts[panel["title"]] = n
        if n == 0:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)
        elif n <= 8:
            ax.legend(fontsize=6, loc="upper left")
        ax.tick_params(labelsize=7)
        ax.set_xlabel("s since the run began", fontsize=7)
        if unit:
            ax.set_ylabel(unit, fontsize=7)
    fig.suptitle(
        'Grafana dashboard "PowerFlow": series a real Prometheus scraped from the chart\'s '
        "pods on the chart twin (e2e/test_chart_twin.py)",
        fontsize=11,
        y=0.985,
    )
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return counts
