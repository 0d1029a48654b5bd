"""Figures like the paper's Figs 3 and 5: measured points against fitted curves.

One PNG per model with four panels: throughput and energy per iteration
against the clock on one GPU, and against the GPU count at fixed clocks
(1200 MHz, and 600 MHz for energy as in Fig. 5). Points are the profile's
measurements; lines are the fitted model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from powerflow.core.gpus import GpuSpec
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.params import ModelParams
from powerflow.core.models.samples import Samples


def _nearest_clock(gpu: GpuSpec, mhz: float) -> float:
    clocks = np.asarray(gpu.clocks_mhz, dtype=np.float64)
    return float(clocks[np.argmin(np.abs(clocks - mhz))])


def plot_model(
    name: str, profile: Samples, params: ModelParams, gpu: GpuSpec, folder: Path
) -> Path:
    """Write ``folder/<name>.png`` and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = FittedModel(params)
    folder.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    clocks = np.asarray(gpu.clocks_mhz, dtype=np.float64)
    one = profile.n == 1
    for bs in np.unique(profile.bs[one]):
        rows = one & (profile.bs == bs)
        t, e = model.predict(1.0, 1.0, bs, clocks)
        (line,) = axes[0, 0].plot(clocks, 1.0 / t, label=f"bs={bs:g}")
        axes[0, 0].scatter(
            profile.f[rows], 1.0 / profile.step_time_s[rows], s=6, color=line.get_color()
        )
        axes[0, 1].plot(clocks, e, color=line.get_color(), label=f"bs={bs:g}")
        axes[0, 1].scatter(profile.f[rows], profile.energy_j[rows], s=6, color=line.get_color())
    axes[0, 0].set(xlabel="core clock (MHz)", ylabel="throughput (it/s)", title=f"{name}: 1 GPU")
    axes[0, 1].set(xlabel="core clock (MHz)", ylabel="energy per iteration (J)", title="1 GPU")
    global_bs = profile.n * profile.bs
    packed = profile.r == np.minimum(profile.n, profile.r.max())
    for ax, mhz, what in (
        (axes[1, 0], 1200.0, "t"),
        (axes[1, 1], 1200.0, "e"),
        (axes[1, 1], 600.0, "e"),
    ):
        f = _nearest_clock(gpu, mhz)
        for gb in np.unique(global_bs):
            rows = packed & (profile.f == f) & (global_bs == gb)
            if not rows.any():
                continue
            ns = np.unique(profile.n[rows])
            rs = np.array([profile.r[rows & (profile.n == k)][0] for k in ns])
            t, e = model.predict(ns, rs, gb / ns, f)
            label = f"BS={gb:g}, {f:g} MHz"
            y_fit = 1.0 / t if what == "t" else e
            y_meas = 1.0 / profile.step_time_s[rows] if what == "t" else profile.energy_j[rows]
            (line,) = ax.plot(ns, y_fit, label=label)
            ax.scatter(profile.n[rows], y_meas, s=8, color=line.get_color())
    axes[1, 0].set(xscale="log", xlabel="GPUs", ylabel="throughput (it/s)", title="vs GPU count")
    axes[1, 1].set(xscale="log", yscale="log", xlabel="GPUs", ylabel="energy per iteration (J)")
    for ax in axes.flat:
        ax.legend(fontsize=6)
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
