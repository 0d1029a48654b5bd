"""Readers for the public measurements the ground truth is built from.

Pure file reading: each function returns plain numpy arrays from one CSV under
``powerflow/data/profiles`` and caches it, so that building every model's
ground truth parses each file once. No interpretation happens here; the
recipe (which numbers mean what) lives in the modules that use them.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from importlib import resources

import numpy as np

from powerflow.core.errors import DataError
from powerflow.core.models.protocol import FloatArray

_PROFILES = "profiles"


def _read_rows(*parts: str) -> list[dict[str, str]]:
    node = resources.files("powerflow").joinpath("data", *parts)
    try:
        with node.open("r", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except FileNotFoundError as exc:
        raise DataError(f"missing data file powerflow/data/{'/'.join(parts)}") from exc


@dataclass(frozen=True, eq=False)
class ThroughputTable:
    """Iterations/s at default clock; ``its[i, j]`` for ``global_batch_sizes[i]``
    on ``gpu_counts[j]`` GPUs, NaN where the source left the cell empty."""

    global_batch_sizes: tuple[int, ...]
    gpu_counts: tuple[int, ...]
    its: FloatArray


@functools.cache
def throughput_table(folder: str, model_name: str) -> ThroughputTable:
    rows = _read_rows(_PROFILES, folder, f"{model_name}.csv")
    if not rows:
        raise DataError(f"{folder}/{model_name}.csv is empty")
    counts = tuple(int(k) for k in rows[0] if k != "global_batch_size")
    gbs = tuple(int(r["global_batch_size"]) for r in rows)
    its = np.array(
        [[float(r[str(c)]) if r[str(c)].strip() else np.nan for c in counts] for r in rows],
        dtype=np.float64,
    )
    its[its <= 0] = np.nan  # resnet50_cifar10 writes 0 for "not measured"
    return ThroughputTable(gbs, counts, its)


@dataclass(frozen=True, eq=False)
class PolluxRecords:
    """One row per Pollux measurement with at least two GPUs."""

    gpus: FloatArray
    nodes: FloatArray
    local_bs: FloatArray
    step_time_s: FloatArray
    sync_time_s: FloatArray


@functools.cache
def pollux_records(pollux_model: str) -> PolluxRecords:
    """Both Pollux files of a model; a placement like "1124" means 4 nodes, 8 GPUs."""
    cols: list[tuple[float, float, float, float, float]] = []
    for r in _read_rows(_PROFILES, "pollux-t4", f"{pollux_model}_placements.csv"):
        p = r["placement"]
        cols.append(
            (
                float(sum(int(c) for c in p)),
                float(len(p)),
                float(r["local_bsz"]),
                float(r["step_time"]),
                float(r["sync_time"]),
            )
        )
    for r in _read_rows(_PROFILES, "pollux-t4", f"{pollux_model}_scalability.csv"):
        cols.append(
            (
                float(r["num_replicas"]),
                float(r["num_nodes"]),
                float(r["local_bsz"]),
                float(r["step_time"]),
                float(r["sync_time"]),
            )
        )
    a = np.array(cols, dtype=np.float64)
    keep = (a[:, 0] >= 2) & (a[:, 4] > 0) & (a[:, 3] > 0)
    a = a[keep]
    return PolluxRecords(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4])


@dataclass(frozen=True, eq=False)
class FrequencySweep:
    """Perseus A100 sweep summed over every stage, instruction and model:
    total time (s) and energy (J) of the same work at each clock (MHz)."""

    freq_mhz: FloatArray
    time_s: FloatArray
    energy_j: FloatArray


@functools.cache
def perseus_sweep() -> FrequencySweep:
    totals: dict[int, list[float]] = {}
    for name in ("gpt3-175b_a100-sxm_bf16.csv", "bloom_a100-sxm_bf16.csv"):
        for r in _read_rows(_PROFILES, "perseus-a100-frequency", name):
            acc = totals.setdefault(int(r["frequency"]), [0.0, 0.0])
            acc[0] += float(r["time"])
            acc[1] += float(r["energy"])
    freqs = sorted(totals)
    return FrequencySweep(
        np.array(freqs, dtype=np.float64),
        np.array([totals[f][0] for f in freqs]),
        np.array([totals[f][1] for f in freqs]),
    )


@dataclass(frozen=True, eq=False)
class ZeusRun:
    """Zeus power-limit sweep rows of one GPU type."""

    network: tuple[str, ...]
    batch_size: FloatArray
    power_limit_w: FloatArray
    average_power_w: FloatArray


ZEUS_GPUS = ("v100", "a40", "p100", "rtx6000")


@functools.cache
def zeus_run(gpu: str) -> ZeusRun:
    rows = _read_rows(_PROFILES, "zeus-power-limit", f"summary_power_{gpu}.csv")
    return ZeusRun(
        tuple(r["network"] for r in rows),
        np.array([float(r["batch_size"]) for r in rows]),
        np.array([float(r["power_limit"]) for r in rows]),
        np.array([float(r["average_power"]) for r in rows]),
    )


@dataclass(frozen=True, eq=False)
class TraceJobs:
    """The ITP trace columns the ground-truth check needs."""

    num_gpu: FloatArray
    duration_s: FloatArray
    model_name: tuple[str, ...]
    global_batch_size: FloatArray
    num_iteration: FloatArray


@functools.cache
def itp_trace() -> TraceJobs:
    rows = _read_rows("traces", "elasticflow-itp-24h-1901jobs.csv")
    return TraceJobs(
        np.array([float(r["num_gpu"]) for r in rows]),
        np.array([float(r["duration"]) for r in rows]),
        tuple(r["model_name"] for r in rows),
        np.array([float(r["global_batch_size"]) for r in rows]),
        np.array([float(r["num_iteration"]) for r in rows]),
    )
