"""The ground-truth job: step time and energy of one model on one GPU type.

Built once per (model, GPU) from the public measurements by ``build``; the
recipe and the reasons for each step are in the docstring of
``powerflow.lab.groundtruth``. Evaluation is pure numpy and broadcasts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from powerflow.core.errors import DataError
from powerflow.core.gpus import GpuSpec
from powerflow.core.models.protocol import ArrayLike, FloatArray
from powerflow.lab.groundtruth.frequency import FrequencyCurves, frequency_curves
from powerflow.lab.groundtruth.shapes import (
    POLLUX_MODEL,
    active_power_ratio,
    light_power_ratio,
    pollux_sync_bs_elasticity,
)
from powerflow.lab.groundtruth.sources import throughput_table


@dataclass(frozen=True)
class ThroughputSource:
    """Where a GPU type's full-clock throughput comes from: a table folder under
    ``powerflow/data/profiles`` and the type's training speed-up over that table
    (1 for the type the table was measured on)."""

    folder: str
    speedup: float = 1.0
    synthetic: bool = False
    """True where the speed-up stands in for a measured table of the type's own."""


H100_SXM_SPEEDUP = 14.4 / 7.8
"""H100 SXM over A100 SXM training throughput, 1.85: MLPerf Training v3.0, ResNet-50,
Dell's two submissions with the same CPUs and 16 GPUs each, 14.4 min on A100-SXM-80GB
against 7.8 min on H100-SXM5-80GB (``mlperf-v3-dell`` in ``powerflow/data/README.md``).
ResNet-50 because it is the source's one pair of like systems on a model of the
trace that NVIDIA's H100 software does not run in FP8 (its BERT does, through the
Transformer Engine, which the trace's jobs do not use); one ratio for every model,
since the source gives no other like-for-like pair for them."""

# Each GPU type with a ground truth: the hook for more types. Only the A100's is
# measured; the H100 SXM's is the A100's tables divided by the ratio above.
THROUGHPUT_SOURCES: dict[str, ThroughputSource] = {
    "A100": ThroughputSource("a100-throughput"),
    "H100-SXM": ThroughputSource("a100-throughput", H100_SXM_SPEEDUP, synthetic=True),
}

GPUS_PER_NODE = 8  # the table was measured on 8-GPU A100 nodes; HGX H100 has 8 too

# Evaluations of at most this many rows are remembered (GroundTruth._phases),
# up to this many distinct inputs per model (then the memo starts afresh).
MEMO_MAX_ROWS = 256
MEMO_MAX_ENTRIES = 100_000

_Phases = tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]

# Share of a GPU-light phase (exposed all-reduce, per-iteration overhead) whose
# duration follows the core clock: NCCL all-reduce is bound by NVLink/InfiniBand
# bandwidth and the overhead by host-side work and memory-bound optimizer
# kernels; only their arithmetic and launches run at core clock. An assumption
# (no public sweep isolates it), kept small so that the clock barely moves them.
LIGHT_CLOCK_SHARE = 0.15

# Crossing a node boundary never makes the all-reduce faster (NVLink outruns
# InfiniBand): a split job of n <= 8 GPUs syncs at least this much slower.
MIN_NODE_PENALTY = 1.1

# Bounds on the borrowed Pollux elasticity of sync time to local batch size,
# applied only outside the table's global batch sizes.
_BS_ELASTICITY_RANGE = (-0.5, 0.0)
_NODE_ELASTICITY_RANGE = (0.05, 1.0)


def _ring_share(n: FloatArray) -> FloatArray:
    """Per-GPU traffic of a ring all-reduce relative to the buffer size, 2(n-1)/n."""
    return 2.0 * (n - 1.0) / n


@dataclass(frozen=True)
class GroundTruth:
    """One trace model on one GPU type: the simulator's "real hardware".

    Fields after ``global_batch_sizes`` are the recipe's derived numbers, kept
    for inspection and tests; ``build`` is the only intended constructor.
    """

    model_name: str
    gpu: GpuSpec
    global_batch_sizes: tuple[int, ...]
    gpus_per_node: int = GPUS_PER_NODE
    compute_bs: tuple[float, ...] = ()  # local batch sizes of the 1-GPU column
    compute_s: tuple[float, ...] = ()  # full-clock 1-GPU step time there
    overhead_s: float = 0.0  # per-iteration fixed part (intercept below the table)
    sync_bs_elasticity: float = 0.0
    node_elasticity: float = 0.0
    active_power_w: float = 0.0
    light_power_w: float = 0.0
    curves: FrequencyCurves | None = field(default=None, repr=False, compare=False)
    sync_log2_gb: tuple[float, ...] = ()  # grid of log2 global batch (table rows)
    sync_log_s: FloatArray | None = field(default=None, repr=False, compare=False)
    _memo: dict[tuple[object, ...], _Phases] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """``_phases`` of small inputs by their exact bytes (see ``_phases``)."""
    _clock_rows: dict[
        tuple[float, float, float], dict[float, tuple[float, float, float, float]]
    ] = field(default_factory=dict, init=False, repr=False, compare=False)
    """(heavy s, light s, heavy W, light W) by (n, r, bs) and clock (``_by_clock``)."""
    _plans: dict[tuple[float, float, GpuSpec | None], tuple[FloatArray, FloatArray]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """``measure.sweep_plan`` by (batch, duration, GPU): one per batch size in a run."""
    _measured: dict[tuple[object, ...], object] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """What ``measure`` reads from the truth before its noise, by its inputs (``measured``)."""

    def sweep_plan(
        self,
        bs: float,
        duration_s: float,
        gpu: GpuSpec | None,
        make: Callable[[GroundTruth, float, float, GpuSpec | None], tuple[FloatArray, FloatArray]],
    ) -> tuple[FloatArray, FloatArray]:
        """``make``'s pre-run plan, made once per (batch, duration, GPU) and copied out.

        The plan depends only on these and on the ground truth, and a run asks
        for it once per job; the memo lives here so that it goes with the
        truth, and callers get copies so that none can change it.
        """
        key = (float(bs), float(duration_s), gpu)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = make(self, bs, duration_s, gpu)
        return plan[0].copy(), plan[1].copy()

    def measured(self, key: tuple[object, ...], make: Callable[[], object]) -> object:
        """``make()`` once per ``key``, kept with the truth (``measure._clean_rows``: the
        rows a profiler measures and their true values, the same at every measurement
        of them); up to ``MEMO_MAX_ENTRIES`` keys, then the memo starts afresh."""
        hit = self._measured.get(key)
        if hit is None:
            if len(self._measured) >= MEMO_MAX_ENTRIES:
                self._measured.clear()
            hit = self._measured[key] = make()
        return hit

    # -- full-clock pieces ---------------------------------------------------

    def compute_time_s(self, bs: ArrayLike) -> FloatArray:
        """1-GPU step time at full clock: log-log between the table's points,
        affine (fixed overhead + per-sample cost) beyond either end."""
        bs = np.asarray(bs, dtype=np.float64)
        xb, yc = np.array(self.compute_bs), np.array(self.compute_s)
        inside = np.exp(np.interp(np.log(bs), np.log(xb), np.log(yc)))
        lo_slope = (yc[1] - yc[0]) / (xb[1] - xb[0])
        hi_slope = (yc[-1] - yc[-2]) / (xb[-1] - xb[-2])
        below = yc[0] + lo_slope * (bs - xb[0])
        above = yc[-1] + hi_slope * (bs - xb[-1])
        out = np.where(bs < xb[0], below, np.where(bs > xb[-1], above, inside))
        return np.asarray(out, dtype=np.float64)

    def _packed_sync_s(self, n: FloatArray, bs: FloatArray) -> FloatArray:
        """Exposed sync at full clock on ceil(n/8) nodes, from the table's grid."""
        assert self.sync_log_s is not None
        grid = self.sync_log_s  # rows: log2 n = 1, 2, ..., columns: sync_log2_gb
        gbs = np.array(self.sync_log2_gb)
        log_gb = np.log2(n * bs)
        clamped = np.clip(log_gb, gbs[0], gbs[-1])
        ln = np.clip(np.log2(np.maximum(n, 2.0)), 1.0, float(grid.shape[0]))
        s = np.exp(_bilinear(grid, ln - 1.0, gbs, clamped))
        # Beyond the largest global batch the extra compute hides more of the
        # all-reduce: exposed sync shrinks as (1 + extra compute / sync) ** e,
        # e >= -0.5, so the step still grows with the batch. Below the smallest
        # it stays at the edge value (nothing more to hide it behind).
        above = log_gb > clamped
        if np.any(above):
            n_a, bs_a, s_a = n[above], bs[above], s[above]
            edge_bs = np.exp2(clamped[above]) / n_a
            extra = self.compute_time_s(bs_a) - self.compute_time_s(edge_bs)
            s[above] = s_a * (1.0 + extra / s_a) ** self.sync_bs_elasticity
        ramp = np.clip(n - 1.0, 0.0, 1.0)  # nothing to sync on one GPU
        return np.asarray(s * ramp, dtype=np.float64)

    def sync_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike) -> FloatArray:
        """Exposed (not overlapped) synchronisation time per iteration at full clock."""
        cols = np.broadcast_arrays(n, r, bs)
        shape = cols[0].shape
        n, r, bs = (np.array(x, dtype=np.float64).ravel() for x in cols)
        per_node = self.gpus_per_node
        nodes = np.ceil(n / r - 1e-9)
        packed_nodes = np.ceil(n / per_node - 1e-9)
        packed = self._packed_sync_s(n, bs)
        # n > 8: more nodes than needed; grow with the node count like the
        # table's own multi-node diagonal does (a no-op when packed).
        out = packed * (nodes / packed_nodes) ** self.node_elasticity
        # n <= 8 split across nodes: the table's two-node sync (16 GPUs) scaled
        # to n GPUs by ring all-reduce traffic, never below MIN_NODE_PENALTY x
        # the one-node sync, then grown with the node count.
        split = (packed_nodes < 2) & (nodes >= 2)
        if np.any(split):
            n_s, k_s, one_node = n[split], nodes[split], packed[split]
            two_node = self._packed_sync_s(np.full_like(n_s, 2.0 * per_node), bs[split]) * (
                _ring_share(np.maximum(n_s, 2.0)) / _ring_share(np.array(2.0 * per_node))
            )
            out[split] = np.maximum(two_node, MIN_NODE_PENALTY * one_node) * (k_s / 2.0) ** (
                self.node_elasticity
            )
        return np.asarray(out, dtype=np.float64).reshape(shape)

    # -- the PerfModel protocol ------------------------------------------------

    def _phases(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> _Phases:
        """(n, heavy s, light s, heavy W, light W) per GPU for each configuration.

        The simulator asks for the same few configurations again and again
        (every profile of a model at a GPU count, every pre-run of a batch
        size), each time a handful of rows whose numpy overhead outweighs the
        arithmetic; so small inputs are remembered by their exact float64
        bytes and answered with the very arrays computed the first time
        (read-only: callers only combine them into new arrays).
        """
        key = _memo_key(n, r, bs, f)
        if key is not None:
            hit = self._memo.get(key)
            if hit is not None:
                return hit
        cols = np.broadcast_arrays(n, r, bs, f)
        n_, r_, bs_, f_ = (np.asarray(x, dtype=np.float64) for x in cols)
        if key is None or n_.size > MEMO_MAX_ROWS:
            return self._compute_phases(n_, r_, bs_, f_)
        out = self._by_clock(n_, r_, bs_, f_)
        for a in out:
            if isinstance(a, np.ndarray):
                a.flags.writeable = False
        if len(self._memo) >= MEMO_MAX_ENTRIES:
            self._memo.clear()
            self._clock_rows.clear()
        self._memo[key] = out
        return out

    def _by_clock(self, n_: FloatArray, r_: FloatArray, bs_: FloatArray, f_: FloatArray) -> _Phases:
        """``_compute_phases`` of a few rows, from rows remembered clock by clock
        where they are all of one (n, r, bs).

        A profile is measured again and again with more of its slices done
        (another prefix of the same clocks), each a new input to the memo but
        rows it has seen: each row is the very floats it is in any evaluation
        (the ground truth is elementwise), so only clocks not seen at that
        configuration are evaluated, together. A fitted run of the default
        trace evaluates clocks for 89 of its 638 such inputs then: ``_phases``
        takes 0.073-0.077 s of its CPU against 0.121-0.125 s (``process_time``
        inside ``run_one(RunSpec("powerflow", 0.6))``, 3 runs each, alternated).
        """
        if not (
            n_.ndim == 1
            and n_.size
            and (n_ == n_[0]).all()
            and (r_ == r_[0]).all()
            and (bs_ == bs_[0]).all()
        ):
            return self._compute_phases(n_.copy(), r_, bs_, f_)
        n0, r0, bs0 = float(n_[0]), float(r_[0]), float(bs_[0])
        rows = self._clock_rows.setdefault((n0, r0, bs0), {})
        clocks = f_.tolist()
        missing = [c for c in dict.fromkeys(clocks) if c not in rows]
        if missing:
            k = len(missing)
            _, heavy, light, p_heavy, p_light = self._compute_phases(
                np.full(k, n0), np.full(k, r0), np.full(k, bs0), np.array(missing)
            )
            found = zip(
                heavy.tolist(), light.tolist(), p_heavy.tolist(), p_light.tolist(), strict=True
            )
            rows.update(zip(missing, found, strict=True))
        cols = np.array([rows[c] for c in clocks], dtype=np.float64).T.copy()
        return n_.copy(), cols[0], cols[1], cols[2], cols[3]

    def _compute_phases(
        self, n_: FloatArray, r_: FloatArray, bs_: FloatArray, f_: FloatArray
    ) -> _Phases:
        assert self.curves is not None
        _validate(n_, r_, bs_, f_, self.gpus_per_node)
        f_ = np.clip(f_, self.gpu.min_clock_mhz, self.gpu.max_clock_mhz)
        tau = self.curves.time_factor(f_)
        rho = self.curves.dynamic_power_factor(f_)
        heavy = (self.compute_time_s(bs_) - self.overhead_s) * tau
        light_full = self.overhead_s + self.sync_time_s(n_, r_, bs_)
        light = light_full * (1.0 + LIGHT_CLOCK_SHARE * (tau - 1.0))
        idle = self.gpu.idle_power_w
        p_heavy = idle + (self.active_power_w - idle) * rho
        p_light = idle + (self.light_power_w - idle) * rho
        return n_, heavy, light, p_heavy, p_light

    def step_time_s(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        """Seconds per iteration."""
        _, heavy, light, _, _ = self._phases(n, r, bs, f)
        return heavy + light

    def energy_per_iter_j(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> FloatArray:
        """Joules per iteration, summed over the job's n GPUs."""
        n_, heavy, light, p_heavy, p_light = self._phases(n, r, bs, f)
        return n_ * (p_heavy * heavy + p_light * light)

    def step_and_energy(
        self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike
    ) -> tuple[FloatArray, FloatArray]:
        """``(step_time_s, energy_per_iter_j)`` from one evaluation (a profiler
        measures both at once)."""
        n_, heavy, light, p_heavy, p_light = self._phases(n, r, bs, f)
        return heavy + light, n_ * (p_heavy * heavy + p_light * light)

    def power_w(self, n: ArrayLike, r: ArrayLike, bs: ArrayLike, f: ArrayLike) -> FloatArray:
        """Average power of the whole job (all n GPUs), W."""
        n_, heavy, light, p_heavy, p_light = self._phases(n, r, bs, f)
        return n_ * (p_heavy * heavy + p_light * light) / (heavy + light)


def _memo_key(*args: ArrayLike) -> tuple[object, ...] | None:
    """A dictionary key that determines the float64 inputs exactly, or None.

    Numbers stand for themselves (equal numbers convert to the same float64;
    the signed zeros, which compare equal, are invalid inputs and never
    remembered); arrays by shape, dtype and bytes. Anything else (lists, large
    arrays) is not remembered.
    """
    parts: list[object] = []
    for a in args:
        if isinstance(a, np.ndarray):
            if a.size > MEMO_MAX_ROWS:
                return None
            parts.append((a.shape, a.dtype.str, a.tobytes()))
        elif isinstance(a, (int, float, np.integer, np.floating)):
            parts.append(a)
        else:
            return None
    return tuple(parts)


def _bilinear(grid: FloatArray, x: FloatArray, ys: FloatArray, y: FloatArray) -> FloatArray:
    """Bilinear interpolation on ``grid[i, j]`` at row coordinate ``x`` (rows at
    0, 1, 2, ...) and column coordinate ``y`` (columns at ``ys``); exact at the
    nodes, which is what reproducing the table to float precision needs."""
    i = np.clip(np.floor(x).astype(np.intp), 0, grid.shape[0] - 2)
    tx = x - i
    j = np.clip(np.searchsorted(ys, y, side="right") - 1, 0, len(ys) - 2)
    ty = (y - ys[j]) / (ys[j + 1] - ys[j])
    return (
        (1 - tx) * (1 - ty) * grid[i, j]
        + tx * (1 - ty) * grid[i + 1, j]
        + (1 - tx) * ty * grid[i, j + 1]
        + tx * ty * grid[i + 1, j + 1]
    )


def _validate(n: FloatArray, r: FloatArray, bs: FloatArray, f: FloatArray, per_node: int) -> None:
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(r)) and np.all(np.isfinite(bs))):
        raise DataError("configurations must be finite")
    if np.any(n < 1) or np.any(r < 1):
        raise DataError("need n >= 1 GPUs and r >= 1 GPUs per node")
    if np.any(r > n) or np.any(r > per_node):
        raise DataError(f"GPUs per node r must be <= n and <= {per_node}")
    if np.any(bs <= 0):
        raise DataError("local batch size must be positive")
    if not np.all(f > 0):
        raise DataError("clock must be positive MHz")


def build(model_name: str, gpu: GpuSpec) -> GroundTruth:
    """Derive every number of the recipe for one model on one GPU type."""
    source = THROUGHPUT_SOURCES.get(gpu.name)
    if source is None:
        raise DataError(
            f"no ground truth for GPU type {gpu.name!r}; the types with one: "
            f"{', '.join(THROUGHPUT_SOURCES)}"
        )
    table = throughput_table(source.folder, model_name)
    gbs = np.array(table.global_batch_sizes, dtype=np.float64)
    counts = np.array(table.gpu_counts, dtype=np.float64)
    if len(gbs) < 2 or counts[0] != 1 or counts[-1] < 2 * GPUS_PER_NODE:
        raise DataError(f"{model_name}: table needs >= 2 batch sizes, 1 GPU to >= 16 GPUs")
    # Every full-clock step time (compute, overhead and exposed sync alike) is
    # the table's divided by the type's speed-up: the source measured the ratio
    # end to end, synchronisation included. Dividing by 1 changes no bit.
    step = 1.0 / table.its / source.speedup
    one_gpu = step[:, 0]
    if np.any(np.isnan(one_gpu)):
        raise DataError(f"{model_name}: 1-GPU column incomplete")

    overhead = one_gpu[0] - (one_gpu[1] - one_gpu[0]) / (gbs[1] - gbs[0]) * gbs[0]
    if not 0 < overhead < one_gpu[0]:
        raise DataError(f"{model_name}: 1-GPU step time not affine-extendable to small batches")

    proto = GroundTruth(
        model_name=model_name,
        gpu=gpu,
        global_batch_sizes=table.global_batch_sizes,
        compute_bs=tuple(float(g) for g in gbs),
        compute_s=tuple(float(t) for t in one_gpu),
        overhead_s=float(overhead),
    )
    multi = counts >= 2
    local_bs = gbs[:, None] / counts[None, multi]
    sync = step[:, multi] - proto.compute_time_s(local_bs)
    known = ~np.isnan(sync)
    if np.any(sync[known] <= 0):
        raise DataError(f"{model_name}: multi-GPU step faster than its compute alone")
    log_sync = np.log(np.where(known, sync, 1.0))
    log_sync = _fill_missing(log_sync, known)

    log_n = np.log2(counts[multi])
    if not np.allclose(log_n, np.arange(1, len(log_n) + 1)):
        raise DataError(f"{model_name}: expected GPU columns 2, 4, ..., 64")

    # Node elasticity: sync growth along the table's multi-node diagonal at a
    # fixed local batch (n GPUs at gb vs 2n GPUs at 2gb), n >= 16.
    diffs = []
    for i in range(len(gbs) - 1):
        if gbs[i + 1] != 2 * gbs[i]:
            continue
        for j, c in enumerate(counts[multi][:-1]):
            if c >= 2 * GPUS_PER_NODE and known[i, j] and known[i + 1, j + 1]:
                diffs.append(np.log2(sync[i + 1, j + 1] / sync[i, j]))
    node_el = float(np.clip(np.median(diffs) if diffs else 0.0, *_NODE_ELASTICITY_RANGE))

    bs_el = pollux_sync_bs_elasticity(POLLUX_MODEL[model_name])
    bs_el = float(np.clip(bs_el, *_BS_ELASTICITY_RANGE))
    return GroundTruth(
        model_name=model_name,
        gpu=gpu,
        global_batch_sizes=table.global_batch_sizes,
        compute_bs=proto.compute_bs,
        compute_s=proto.compute_s,
        overhead_s=proto.overhead_s,
        sync_bs_elasticity=bs_el,
        node_elasticity=node_el,
        active_power_w=active_power_ratio(model_name) * gpu.max_power_w,
        light_power_w=light_power_ratio() * gpu.max_power_w,
        curves=frequency_curves(gpu),
        sync_log2_gb=tuple(float(g) for g in np.log2(gbs)),
        sync_log_s=log_sync.T.copy(),
    )


def _fill_missing(log_sync: FloatArray, known: np.ndarray) -> FloatArray:
    """Fill a missing cell from its column neighbour and the neighbouring
    batch size's ratio at the previous GPU count (deepspeech2, gb 32, 64 GPUs:
    same gb-ratio as at 32 GPUs)."""
    out = log_sync.copy()
    rows, cols = np.nonzero(~known)
    for i, j in zip(rows, cols, strict=True):
        if j == 0:
            raise DataError("table lacks a 2-GPU value")
        other = i + 1 if i + 1 < out.shape[0] else i - 1
        if not (known[other, j] and known[i, j - 1] and known[other, j - 1]):
            raise DataError("table too sparse to fill a missing value")
        out[i, j] = out[other, j] + (out[i, j - 1] - out[other, j - 1])
    return out
