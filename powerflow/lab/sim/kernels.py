"""The engine's per-event passes over its holders, compiled.

At every event the engine advances every holder's progress and recomputes
every holder's next event; at a few hundred holders numpy's fancy indexing
would spend more on fixed per-call costs than on the arithmetic. These loops
do the same float operations per job, in the same order (no fastmath, so no
fused or reordered arithmetic): the results are the very floats of a plain
Python loop over the jobs (tests/test_sim_fastpaths.py checks against one).

``held`` is the holders' rows in the engine's ``_holders`` order,
``computing`` the rows of those that compute. The per-job columns come as
the two blocks of ``JobArrays``: ``floats`` (one row per float column, the
indices below) and ``flags`` (the boolean ones). A block is one argument
that numba's dispatcher types on its fast path for arrays, where a
``NamedTuple`` of the columns would be fingerprinted field name by field
name at every call, and the engine calls these several times per event.
The indices live here because the compiled loops have them built in:
numba's cache notices a change in this file only.
"""

from __future__ import annotations

import math

import numpy as np

from powerflow.core.jit import njit

# Rows of JobArrays.floats.
(
    DONE,
    ENERGY,
    ATTAINED,
    RUN_S,
    SHARE,
    STEP,
    POWER,
    N,
    ITERATIONS,
    PHASE_END,
    NEXT_EVENT,
    PLANNED,
) = range(12)
FLOAT_ROWS = 12
# Rows of JobArrays.flags.
COMPLETION, COMPUTING, RUNNING = range(3)
FLAG_ROWS = 3


@njit
def advance(held: np.ndarray, computing: np.ndarray, dt: float, floats: np.ndarray) -> None:
    """``dt`` seconds on: held time of every holder, work and energy of
    every computing one (its share of its GPUs at its current rates)."""
    n, share, step, power = floats[N], floats[SHARE], floats[STEP], floats[POWER]
    attained, run_s, done, energy = floats[ATTAINED], floats[RUN_S], floats[DONE], floats[ENERGY]
    for i in held:
        attained[i] += n[i] * dt
        run_s[i] += dt
    for i in computing:
        done[i] += dt * share[i] / step[i]
        energy[i] += dt * share[i] * power[i]


@njit
def draw(computing: np.ndarray, floats: np.ndarray) -> tuple[float, float]:
    """(active watts, busy GPUs) of the computing jobs, each the sum of the
    jobs' shares of their terms added one by one in ``computing`` order."""
    share, power, n = floats[SHARE], floats[POWER], floats[N]
    active_w = 0.0
    busy = 0.0
    for i in computing:
        active_w += share[i] * power[i]
        busy += share[i] * n[i]
    return active_w, busy


@njit
def next_events(
    held: np.ndarray, computing: np.ndarray, now: float, floats: np.ndarray, flags: np.ndarray
) -> float:
    """Set every holder's next event (its completion if that comes no later
    than its phase end) and return the soonest (inf: no holders, NaN if
    any is NaN, as ``np.min`` has it)."""
    phase_end, iterations, done = floats[PHASE_END], floats[ITERATIONS], floats[DONE]
    step, share, next_event = floats[STEP], floats[SHARE], floats[NEXT_EVENT]
    completion = flags[COMPLETION]
    for i in held:
        next_event[i] = phase_end[i]
        completion[i] = False
    for i in computing:
        remaining = iterations[i] - done[i]
        if remaining < 0.0:
            remaining = 0.0
        finish = now + remaining * step[i] / share[i]
        if finish <= phase_end[i]:
            next_event[i] = finish
            completion[i] = True
    soonest = math.inf
    for i in held:
        t: float = next_event[i]
        if math.isnan(t):
            return t
        if t < soonest:
            soonest = t
    return soonest


@njit
def progress_rows(held: np.ndarray, floats: np.ndarray) -> np.ndarray:
    """The progress fields of the holders' views, one column per holder:
    remaining iterations (never below 1e-9, NaN kept), seconds held and
    GPU-seconds held."""
    iterations, done, run_s, attained = (
        floats[ITERATIONS],
        floats[DONE],
        floats[RUN_S],
        floats[ATTAINED],
    )
    out = np.empty((3, len(held)))
    for k in range(len(held)):
        i = held[k]
        left = iterations[i] - done[i]
        out[0, k] = left if (left > 1e-9 or math.isnan(left)) else 1e-9
        out[1, k] = run_s[i]
        out[2, k] = attained[i]
    return out


@njit
def ratio_sums(
    held: np.ndarray, lo: float, hi: float, floats: np.ndarray, flags: np.ndarray
) -> tuple[float, float]:
    """(measured, planned) watts that ``RatioWindow.add`` sums over the holders
    running as planned, in ``held`` order: each one's true power (its share of
    its GPUs' power) against its plan's, a pair left out unless both are finite
    and positive and their ratio lies in ``[lo, hi]`` (``BELIEVED``); a job
    whose plan counts no power has 0 planned watts, so it is left out too."""
    share, power, planned_w = floats[SHARE], floats[POWER], floats[PLANNED]
    running = flags[RUNNING]
    measured = 0.0
    planned = 0.0
    for i in held:
        if not running[i]:
            continue
        m = share[i] * power[i]
        p = planned_w[i]
        if not (0.0 < m < math.inf and 0.0 < p < math.inf):
            continue
        if not lo <= m / p <= hi:
            continue
        measured += m
        planned += p
    return measured, planned
