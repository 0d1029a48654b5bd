"""Keeping the budget with models that are wrong: measured power fed back, and caps.

PowerFlow plans with predicted power (``E_iter / T_iter`` of each job's model),
and fitted models are off by a few percent, more on GPU counts never run. Three
mechanisms keep the measured power within the admin's limit anyway:

* **Per-job correction.** A job measured on its current GPUs
  (``Job.measured_power_w`` at ``Job.measured_frequency_mhz``) gets the factor
  ``scale = measured / predicted`` there (clamped to ``SCALE_RANGE``), and the
  policy multiplies every power it predicts for that job by it: a model's error
  mostly carries over between clocks and GPU counts of one job.
* **Cluster ratio.** The backend reports the recent ratio of measured to
  predicted power of the jobs running as planned (``Snapshot.power_ratio``);
  the policy plans against ``limit / max(1, ratio) * (1 - margin)``, so a
  systematic error the per-job factors miss (jobs not measured yet) shrinks
  the budget it plans with instead of passing the limit. ``margin`` is a fixed
  floor (default 0).
* **Profiling sweeps.** A job's first run on a GPU count not in
  ``Job.profiled_gpus`` sweeps the clocks up to the highest one, so such a row
  counts its highest power at any clock (``peak``), not its power at the clock
  planned; the clock phase then costs it nothing more.
* **GPUs the caps can hold** (``cappable_gpus``): a cap is never below the
  board's lowest power limit (A100: 100 W), so under a limit of less than that
  per GPU (eta below about 1/3) caps at that floor on every busy GPU could sum
  above the limit and hold nothing. With caps on, the policy runs at most as
  many GPUs as their floor caps and the idle GPUs of the nodes they use fit.
* **Caps** (``caps``): when the planned power leaves less than ``headroom`` of
  the limit free, every placed job gets a per-GPU power cap: what the plan
  counted for it plus an equal share per GPU of what is left of the limit,
  rounded down and kept steady across passes (``steady_caps``). The caps and
  the idle GPUs sum to at most the limit, and a GPU never draws more than its
  cap while some clock fits it (``powerflow.core.devices.capped_clock_mhz``), so even
  a wrong model cannot pass the budget: the job slows down instead.

Everything here is a pure function of the snapshot and the tables: a job's
predicted power where it was measured and its rows' sweep peaks are read from
its table rows, and the model is asked only for a configuration no row has.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from powerflow.core.errors import SnapshotError
from powerflow.core.models.protocol import FloatArray
from powerflow.core.policy.snapshot import Job
from powerflow.core.policy.tables import IntArray, JobRows, Tables

SCALE_RANGE = (0.5, 2.0)
"""Bounds of a per-job correction: a measurement farther off than this from its
model is more likely a broken window than a model error."""


MIN_CAP_W = 1.0
"""The smallest cap the policy writes on a GPU whose lowest limit is unknown."""

CAP_STEP_W = 1.0
"""Caps are rounded down to whole watts (``steady_caps``)."""
CAP_SLACK_W = 2.0
"""A held cap is kept down to this far below what the plan counted per GPU."""
CAP_RAISE_W = 10.0
"""A cap a job's GPUs hold is raised only when the new one is this much higher."""


@dataclass(frozen=True)
class LoopOptions:
    """The policy's power-loop options (see ``PowerFlowPolicy``)."""

    correction: bool = True
    margin: float = 0.0
    caps: bool = True
    cap_headroom: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise SnapshotError(f"power margin {self.margin} outside [0, 1)")
        if not 0.0 <= self.cap_headroom <= 1.0:
            raise SnapshotError(f"cap headroom {self.cap_headroom} outside [0, 1]")


def planning_limit_w(limit_w: float, power_ratio: float, options: LoopOptions) -> float:
    """The limit the policy plans against: ``limit / max(1, ratio) * (1 - margin)``.

    Without correction the ratio is ignored (only the fixed margin applies).
    """
    if not (math.isfinite(power_ratio) and power_ratio > 0):
        raise SnapshotError(f"power ratio {power_ratio} must be finite and > 0")
    ratio = max(1.0, power_ratio) if options.correction else 1.0
    return limit_w / ratio * (1.0 - options.margin)


def cappable_gpus(
    limit_w: float, floor_w: float, idle_w: float, gpus_per_node: int, total_gpus: int
) -> int:
    """The most GPUs that may compute at once so that caps can still hold ``limit_w``.

    A cap is never below ``floor_w`` (``max(MIN_CAP_W, the board's lowest
    limit)``), so ``u`` busy GPUs packed on ``k = ceil(u / gpus_per_node)``
    nodes (placement packs: at most one node partly used) draw up to
    ``u * floor + (k * gpus_per_node - u) * idle_w``; the answer is the largest
    ``u`` (at most ``total_gpus``) where that fits. Why: at eta 0.2 and 0.3 on
    A100s the limit is 60 and 90 W per GPU, below the 100 W floor; without
    this bound the policy would run up to 416 GPUs on 30.7 kW at eta 0.2, every
    cap at the floor, and a model error or a profiling sweep on a new job would
    pass the limit with nothing to stop it.
    """
    if not math.isfinite(limit_w):
        return total_gpus
    floor = max(MIN_CAP_W, floor_w)
    g = gpus_per_node
    best = 0
    for k in range(1, -(-total_gpus // g) + 1):
        lo, hi = (k - 1) * g + 1, min(k * g, total_gpus)
        if floor > idle_w:  # the draw grows with u: the most that fits
            u = min(hi, math.floor((limit_w - k * g * idle_w) / (floor - idle_w)))
        else:  # it does not: all of this node's GPUs, if that fits
            u = hi if hi * floor + (k * g - hi) * idle_w <= limit_w else 0
        if u >= lo:
            best = u
    return best


def job_scales(
    tables: Tables,
    jobs: Sequence[Job],
    gpus_per_node: int,
    clocks: Sequence[int],
    known: Sequence[float | None] | None = None,
) -> FloatArray:
    """Per job, ``measured / predicted`` power on its current GPUs (1 where unmeasured).

    The prediction is the job's table row of its GPU count where that row is
    the measured configuration (GPUs per node, local batch, a clock the policy
    plans with), else one model call. ``known``: per job its factor where the
    caller has it already (``static.py``: the same fields and model as when it
    was computed), else None.
    """
    column = {c: k for k, c in enumerate(clocks)}.get
    entries = tables.job_rows
    if known is None:
        known = [None] * len(jobs)
    return np.asarray(
        [
            job_scale(job, entries[i], gpus_per_node, column) if scale is None else scale
            for i, (job, scale) in enumerate(zip(jobs, known, strict=True))
        ],
        dtype=np.float64,
    ).reshape(len(jobs))


def job_scale(
    job: Job, rows: JobRows, gpus_per_node: int, column: Callable[[int], int | None]
) -> float:
    """One job's ``measured / predicted`` power (``job_scales``); ``rows``: its table rows,
    ``column``: the clock column of a clock (None: not one the policy plans with)."""
    measured, f = job.measured_power_w, job.measured_frequency_mhz
    if measured is None or f is None or not job.placement:
        return 1.0
    if not (math.isfinite(measured) and measured > 0):
        raise SnapshotError(f"job {job.id!r}: measured power {measured} W")
    placement = job.placement
    n = len(placement)
    nodes = {node for node, _ in placement}
    if len(nodes) == 1:
        r = n
    elif n == len(nodes) * gpus_per_node:
        r = gpus_per_node  # whole nodes (slots are distinct: ``validate``)
    else:
        r = max(Counter(node for node, _ in placement).values())
    bs = -(-job.global_batch_size // n)
    k = column(int(f))
    predicted = None if k is None else rows.power_w(n, r, bs, k)
    if predicted is None:
        t = float(job.model.step_time_s(n, r, bs, float(f)))
        e = float(job.model.energy_per_iter_j(n, r, bs, float(f)))
        if not (t > 0 and e > 0 and math.isfinite(t) and math.isfinite(e)):
            raise SnapshotError(f"job {job.id!r}: model predicts nonsense at {(n, r, bs, f)}")
        predicted = e / t
    lo, hi = SCALE_RANGE
    return min(hi, max(lo, measured / predicted))


def sweeping_rows(
    tables: Tables, jobs: Sequence[Job], masks: Sequence[FloatArray] | None = None
) -> FloatArray:
    """Per table row: its highest power over the clocks where a run there would
    sweep them (its count not yet profiled), else NaN. ``masks``: per job its
    ``sweep_mask`` where the caller has them already."""
    if masks is None:
        entries = tables.job_rows
        masks = [sweep_mask(job, entries[j]) for j, job in enumerate(jobs)]
    if not len(masks):
        return tables.peak_w.copy()
    # The rows are stacked in the order of the jobs' first rows (``tables._stack``);
    # a job with no rows adds nothing wherever it falls.
    order = np.argsort(tables.start, kind="stable").tolist()
    out: FloatArray = tables.peak_w * np.concatenate([masks[j] for j in order])
    return out


def sweep_mask(job: Job, rows: JobRows) -> FloatArray:
    """Per row of ``job`` (``rows``): 1.0 where a run there would sweep the clocks
    (its count not yet profiled), NaN where not (profiled, or a job that never sweeps)."""
    return np.asarray(sweep_values(job, rows), dtype=np.float64).reshape(rows.size)


def sweep_values(job: Job, rows: JobRows) -> list[float]:
    """``sweep_mask`` as a list (``static.py`` writes several jobs' into one array)."""
    profiled = job.profiled_gpus
    if profiled is None:
        return [math.nan] * rows.size
    return [math.nan if n in profiled else 1.0 for n in rows.counts]


@dataclass(frozen=True)
class Correction:
    """How the policy turns predicted power into the power it counts, per table row."""

    row_scale: FloatArray
    """Per row: the owning job's correction factor."""
    peak_w: FloatArray
    """Per row: its corrected sweep peak (NaN: no sweep there)."""

    def efficient(self, power_w: FloatArray) -> FloatArray:
        """The rows' counted power at their efficient clocks (``power_w``: predicted)."""
        out: FloatArray = power_w * self.row_scale
        return out

    def matrix(self, rows: np.ndarray, power_w: FloatArray) -> FloatArray:
        """``rows``' counted power at every clock (``power_w``: predicted, rows x clocks)."""
        out: FloatArray = power_w * self.row_scale[rows, None]
        return out

    def row(self, row: int, power_w: Sequence[float]) -> list[float]:
        """One row's counted power per clock from its predicted ``power_w``."""
        scale = float(self.row_scale[row])
        return [p * scale for p in power_w]


def correction(
    tables: Tables,
    jobs: Sequence[Job],
    gpus_per_node: int,
    clocks: Sequence[int],
    enabled: bool,
    scales: FloatArray | None = None,
    masks: Sequence[FloatArray] | None = None,
) -> Correction:
    """Per-row factors and sweep peaks for ``jobs`` (factors 1 when not ``enabled``).

    ``scales`` (``job_scales``, or ones when not ``enabled``) and ``masks`` (per job
    its ``sweep_mask``): where the caller has them already."""
    if scales is None:
        scales = job_scales(tables, jobs, gpus_per_node, clocks) if enabled else np.ones(len(jobs))
    row_scale = scales[tables.row_job]
    return Correction(row_scale=row_scale, peak_w=sweeping_rows(tables, jobs, masks) * row_scale)


def caps_w(
    job_power_w: Sequence[float] | FloatArray,
    job_gpus: Sequence[int] | IntArray,
    job_peak_w: Sequence[float] | FloatArray,
    planned_w: float,
    limit_w: float,
    headroom: float,
    min_cap_w: float = 0.0,
) -> list[float] | None:
    """``cap_array``'s caps as a list (None: no caps)."""
    caps = cap_array(job_power_w, job_gpus, job_peak_w, planned_w, limit_w, headroom, min_cap_w)
    return None if caps is None else caps.tolist()


def cap_array(
    job_power_w: Sequence[float] | FloatArray,
    job_gpus: Sequence[int] | IntArray,
    job_peak_w: Sequence[float] | FloatArray,
    planned_w: float,
    limit_w: float,
    headroom: float,
    min_cap_w: float = 0.0,
) -> FloatArray | None:
    """Per-GPU caps for the placed jobs, or None when the plan leaves enough room.

    ``job_power_w``/``job_gpus``: each placed job's counted power and GPUs;
    ``job_peak_w`` its sweep's peak where it profiles (NaN elsewhere);
    ``planned_w`` the plan's predicted cluster power (idle GPUs included) and
    ``limit_w`` the admin's limit. Caps are set when the plan with every sweep
    at its peak leaves less than ``headroom * limit`` free. What is left of the
    limit, ``left = limit - planned``, goes first to the sweeps (each its
    extra power at the peak, all scaled down alike when ``left`` does not
    cover them), then in equal shares per GPU to every job; a negative
    ``left`` (pinned jobs already past the limit) is taken in equal shares.
    Either way the caps and the idle GPUs sum to the limit. A cap is at least
    ``min_cap_w``, the lowest limit the board accepts (the node agent clamps a
    lower one up to it, so the GPU would draw more than the plan's share): the
    caps below it are raised to it and what they gain is taken from the others
    (``_floored``), so the sum stays the limit where the boards allow it
    (``MIN_CAP_W`` at least).
    """
    if not len(job_power_w) == len(job_gpus) == len(job_peak_w):
        raise ValueError("caps_w: power, GPUs and peaks differ in length")
    n = np.asarray(job_gpus, dtype=np.int64)
    if n.size and n.min() < 1:  # a cap is watts per GPU: none for no GPU
        raise ValueError("caps_w: a placed job has no GPU")
    # Each job's arithmetic as one array operation (the same IEEE operations per job),
    # the sums in job order: 0.055 s of CPU against 0.088 s for a loop per job over
    # the 2,314 calls of a fitted run's replay (process_time around it, least of 3,
    # alternated); tests/test_policy_cap_floor.py pins it to the loop bit for bit.
    # The policy hands in arrays (and steady_caps the caps as one): over a fitted run's
    # 2,314 calls (1,363 capped) 64-68 ms of CPU against 93-98 ms from lists
    # (process_time, 4 alternations).
    power = np.asarray(job_power_w, dtype=np.float64)
    peak = np.asarray(job_peak_w, dtype=np.float64)
    extra = np.where(peak > power, peak - power, 0.0)
    gpus = int(n.sum())
    need = sum(extra.tolist())
    left = limit_w - planned_w
    if not gpus or not math.isfinite(limit_w) or left - need >= headroom * limit_w:
        return None
    if left <= 0:
        sweep, share = 0.0, left / gpus
    elif need <= left:
        sweep, share = 1.0, (left - need) / gpus
    else:
        sweep, share = left / need, 0.0
    caps: FloatArray = (power + sweep * extra) / n + share
    floor = max(MIN_CAP_W, min_cap_w)
    if not (caps < floor).any():
        return caps  # none to raise to the floor (``_floored`` would hand them back)
    per_gpu = power / n
    counted = np.where(per_gpu > floor, per_gpu, floor)  # ``max(floor, w / n)``
    floored = _floored(caps.tolist(), n.tolist(), floor, counted.tolist())
    return np.array(floored, dtype=np.float64)


def _floored(
    caps: list[float], gpus: Sequence[int], floor: float, counted: Sequence[float]
) -> list[float]:
    """``caps`` (per GPU, jobs of ``gpus`` GPUs) none below ``floor``, their GPUs' sum
    kept: what the raised ones gain is taken first from the others' room above what
    the plan counted for them (``counted``, per GPU, at least ``floor``), then, if
    that is not enough, from their room above ``floor``; each gives up the same
    fraction of its room. Only when every cap is at ``floor`` does the sum grow."""
    deficit = sum(n * (floor - c) for c, n in zip(caps, gpus, strict=True) if c < floor)
    if deficit <= 0:
        return caps
    out = [max(c, floor) for c in caps]
    for low in (counted, [floor] * len(caps)):
        room = sum(n * max(0.0, c - lo) for c, lo, n in zip(out, low, gpus, strict=True))
        if room <= 0:
            continue
        keep = max(0.0, 1.0 - deficit / room)
        out = [lo + (c - lo) * keep if c > lo else c for c, lo in zip(out, low, strict=True)]
        deficit -= min(deficit, room)
        if deficit <= 0:
            break
    return out


def steady_caps(
    caps: Sequence[float] | FloatArray,
    counted_w: Sequence[float] | FloatArray,
    current: Sequence[float | None],
    min_cap_w: float,
    max_cap_w: float,
) -> list[float]:
    """``caps_w``'s caps made steady: a new cap is set ``CAP_SLACK_W`` below the
    computed one, rounded down to ``CAP_STEP_W``, but never below what the plan
    counted for the job per GPU (``counted_w``) nor outside the board's limits
    ``min_cap_w`` .. ``max_cap_w``; a job's ``current`` cap is kept while it is
    no higher than the computed cap, within ``CAP_RAISE_W`` of it and at most
    ``CAP_SLACK_W`` below what was counted.

    Why: the caps follow measured power, which moves a little with every window, so exact
    caps changed at almost every pass (the first 3 h of the default trace at eta 0.6: 73 %
    of the passes where a capped job kept its GPUs and clock moved its cap; 28 % with these
    rules, mostly where the cap is what the plan counted and the measured power moved it
    down: ``tests/test_policy_steady_caps.py``): one PATCH per worker pod and one NVML write
    per GPU each time, and a restarted operator, which has lost the windows, would rewrite
    them all. Every rule only lowers a cap below the computed one, so the caps and the idle
    GPUs still sum to at most the limit, and a cap that must go down goes down at once. A
    kept cap may hold a job up to ``CAP_SLACK_W`` below its planned power (a clock step at
    most); on the whole default trace the average JCT moved by under 0.1 % (eta 0.4 and
    0.6).
    """
    if not (len(caps) == len(counted_w) == len(current)):
        raise ValueError("caps, counted power and current caps differ in length")
    floor = max(MIN_CAP_W, min_cap_w)
    cap = np.asarray(caps, dtype=np.float64)
    top = np.minimum(np.maximum(floor, cap), max_cap_w)
    # what the plan's clock draws, where it fits
    need = np.minimum(np.maximum(floor, np.asarray(counted_w, dtype=np.float64)), top)
    # a cushion below the cap, so that the next pass's slightly lower cap keeps it
    rounded = np.floor((cap - CAP_SLACK_W) / CAP_STEP_W) * CAP_STEP_W
    step = np.maximum(need, np.minimum(rounded, top))
    now = np.asarray([np.nan if c is None else c for c in current], dtype=np.float64)
    keep = (need - CAP_SLACK_W <= now) & (now <= top) & (top - now < CAP_RAISE_W)  # NaN: False
    out: list[float] = np.where(keep, np.maximum(now, floor), step).tolist()
    return out
