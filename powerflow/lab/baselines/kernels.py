"""AFS-L's allocation loop, compiled.

AFS re-divides the cluster at every event: a couple of hundred rounds, each
a tournament over the jobs whose next step still fits, about a hundred
thousand comparisons per decision. In Python that loop was a fifth of an AFS
run even with exact shortcuts (skipping tournaments whose winner was known,
resuming the others); compiled, the plain loop (every round a whole
tournament) costs a few microseconds per decision. The arithmetic is
the same float operations in the same order (no fastmath), so the counts
are those of the Python rule (``tests/test_baselines.py`` checks them
against a literal transcription of the tournament).
"""

from __future__ import annotations

import math

import numpy as np

from powerflow.core.jit import njit


@njit
def afs_l_levels(
    counts: np.ndarray, remaining_s: np.ndarray, start: np.ndarray, free_gpus: int
) -> np.ndarray:
    """Each job's ladder level (-1: no GPUs) after AFS-L's rounds.

    Job ``i``'s ladder is ``counts[start[i]:start[i + 1]]`` (GPU counts) and
    ``remaining_s[start[i]:start[i + 1]]`` (its remaining time on each), jobs
    in FIFO order; ``afs.afs_l`` has the rule.
    """
    inf = math.inf
    jobs = len(start) - 1
    level = np.full(jobs, -1, dtype=np.int64)
    now = np.full(jobs, inf)  # remaining time at the current allocation
    first = np.full(jobs, inf)  # remaining time on the first step
    cost = np.full(jobs, inf)  # GPUs of the next step (inf: none left)
    gain_old = np.full(jobs, inf)  # (s'/s - 1) per GPU of the next step; s = 0: inf
    gain_new = np.zeros(jobs)  # (1 - s/s') per GPU of the next step
    for i in range(jobs):
        if start[i + 1] > start[i]:
            first[i] = remaining_s[start[i]]
            cost[i] = float(counts[start[i]])
            gain_new[i] = 1.0 / cost[i]
    free = free_gpus
    while True:
        best = -1
        b_now = b_old = b_new = b_first = inf
        for i in range(jobs):
            if cost[i] > free:
                continue
            if best < 0:
                take = True
            elif now[i] < b_now:  # the challenger is the shorter job
                take = gain_old[i] > b_new
            elif b_now == inf:  # neither has GPUs
                take = first[i] < b_first
            else:  # the incumbent is the shorter job
                take = not b_old > gain_new[i]
            if take:
                best = i
                b_now, b_old, b_new, b_first = now[i], gain_old[i], gain_new[i], first[i]
        if best < 0:
            return level
        free -= int(cost[best])
        k = level[best] + 1
        level[best] = k
        at = start[best] + k
        now[best] = remaining_s[at]
        if at + 1 < start[best + 1]:
            c = counts[at + 1] - counts[at]
            # Speeds as AFS-L writes them, so that exact ties between jobs
            # (common with power-of-two ladders) break the same way.
            s0, s1 = 1.0 / remaining_s[at], 1.0 / remaining_s[at + 1]
            cost[best] = float(c)
            gain_old[best] = (s1 - s0) / s0 / c
            gain_new[best] = (s1 - s0) / s1 / c
        else:
            cost[best] = inf
