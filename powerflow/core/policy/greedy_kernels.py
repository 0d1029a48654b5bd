"""The compiled loops of allocation (``allocation.py``) and the clock phase (``frequency.py``).

Both pop "the best next step" from a heap hundreds of times per decision.
Their heap entries are tuples ``(class, value, tie rank, tie, entry)``
(``entry``: the job or row the step belongs to, at most one step each in the
heap at a time), so here an entry is an integer and its keys sit in four
arrays indexed by it, and the loops sift integers instead of boxing tuples.
``_before`` is Python's tuple ``<`` on those keys.

The keys are totally ordered (the entry breaks every tie, and the values are
finite or infinite, never NaN: the tables are validated finite and
positive), so any correct heap pops them in the order ``heapq`` would. That
lets the loops handle "take the best step, then queue its job's next one" as
one operation: the entry stays at the root with its new keys and sinks
(``_sift`` from the root, as ``heapq.heapreplace`` does), half the work of a
pop and a push. ``heap`` is a preallocated array of which the first ``size``
entries are in use.

The kernels take their arguments in groups of what belongs together, each a
``NamedTuple`` (numba passes one as a struct of its fields, so the loops read
them as they would separate arguments): ``Rows`` and ``JobSteps`` (the
tables' per-row and per-job columns), ``StepRules`` and ``PowerState`` (what
allocation may do, and the power model where it starts), ``Matrices`` and
``RaiseRules`` (the clock phase's), ``Heap`` (a loop's scratch).

Everything compiled lives in this one file on purpose: numba's on-disk cache
notices a change in the file of a cached function, not in the files of the
functions it calls.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from powerflow.core.jit import njit
from powerflow.core.models.protocol import FloatArray
from powerflow.core.policy.tables import IntArray


class Heap(NamedTuple):
    """A heap loop's scratch (``heap_arrays``): the class, value and tie keys
    of each entry, and the heap itself."""

    cls: IntArray
    value: FloatArray
    tie: IntArray
    heap: IntArray


def heap_arrays(n: int) -> Heap:
    """Scratch for a heap of up to ``n`` entries, ``tie`` zero.

    Allocated by the caller: numpy allocation inside a kernel roughly doubles
    its compile time.
    """
    return Heap(
        np.empty(n, dtype=np.int64),
        np.empty(n),
        np.zeros(n, dtype=np.int64),
        np.empty(n, dtype=np.int64),
    )


class Rows(NamedTuple):
    """Per table row (``tables.py``): its GPU count, and the job's JCT,
    remaining energy and power there at the row's most efficient clock."""

    counts: IntArray
    jct: FloatArray
    energy: FloatArray
    power: FloatArray


class JobSteps(NamedTuple):
    """Per job: its first table row, how many rows it has, its age (s since
    arrival), its tie rank, and the row of the count it runs on now (-1:
    none; see ``_doubling_key``)."""

    start: IntArray
    sizes: IntArray
    age: FloatArray
    rank: IntArray
    current: IntArray


class StepRules(NamedTuple):
    """What allocation may do (``allocation.py``): rank steps by energy, take
    doublings, check the power of every step; a rescale's checkpoint-restart
    seconds and per-GPU watts; the floor on a doubling's ``d_jct /
    d_energy`` (0: none); the short-first exponent and reference remaining
    seconds (``_short_first``; exponent 0: none)."""

    energy_aware: bool
    elastic: bool
    strict: bool
    restart_s: float
    restart_w: float
    min_ratio: float
    short_first: float
    short_ref_s: float


class PowerState(NamedTuple):
    """``PowerModel``'s numbers as the heap loop starts: free GPUs, GPUs
    allocated and the jobs' power (the pinned jobs'), GPUs per node, nodes
    on at least, idle watts per GPU and the limit."""

    free: int
    allocated: int
    jobs_w: float
    gpus_per_node: int
    base_nodes: int
    idle_w: float
    limit_w: float


class Matrices(NamedTuple):
    """JCT, energy and power of the running jobs (``Curves.matrices``, the
    power as ``power_loop`` counts it): one row per job at its GPU count, one
    column per clock. ``raise_steps`` takes them C-contiguous float64 (one compiled
    signature)."""

    jct: FloatArray
    energy: FloatArray
    power: FloatArray


class RaiseRules(NamedTuple):
    """The clock phase's bounds: the power limit, columns per raise, rank
    raises by energy, the floor on a raise's ``d_jct / d_energy`` (0: none),
    and per row a factor on that ratio (PowerFlow+'s short-first rule)."""

    limit_w: float
    step: int
    energy_aware: bool
    min_ratio: float
    weight: FloatArray
    """Per row, the factor on a raise's ratio (``_short_first``; all 1: the paper's keys)."""


@njit
def _step_key(d_jct: float, d_energy: float, energy_aware: bool) -> tuple[int, float]:
    """Heap class and value of a step that shortens the JCT by ``d_jct`` for ``d_energy`` more.

    Class 1: a free win (saves energy and time), largest ``d_jct`` first; 2:
    the ratio ``d_jct / d_energy`` (or ``d_jct`` alone without energy
    awareness); 3: never taken (no JCT reduction). Values are negated gains,
    so smaller sorts first.
    """
    if not d_jct > 0:
        return 3, 0.0
    if not energy_aware:
        return 2, -d_jct
    if d_energy <= 0:
        return 1, -d_jct
    return 2, -d_jct / d_energy


@njit
def _short_first(remaining_s: float, ref_s: float, exponent: float) -> float:
    """PowerFlow+'s factor on a step's ratio for a job with ``remaining_s`` to go:
    ``(ref_s / remaining_s) ** exponent``, so that of two steps with the same
    ``dJCT / dE`` the shorter job's is served first (``returns.py``)."""
    return float((ref_s / max(remaining_s, 1e-9)) ** exponent)


@njit
def _doubling_key(
    j: int, nxt: int, table: Rows, current: IntArray, age: FloatArray, rules: StepRules
) -> tuple[int, float]:
    """``_step_key`` of job ``j``'s step from row ``nxt - 1`` to ``nxt``, rescale cost included.

    A running job (``current[j]``: the row of the count it holds, -1 for none)
    pays a checkpoint-restart whenever it ends on another count:
    ``rules.restart_s`` seconds added to its JCT and ``restart_s *
    restart_w`` joules per GPU it then holds. The step into its current count
    therefore gains one restart (it avoids it), the step out of it loses one;
    other steps pay it on both sides and are unchanged. With ``restart_s`` 0
    this is ``_step_key`` exactly. With ``rules.short_first`` above 0 a ratio
    (class 2) is multiplied by ``_short_first`` of the job's remaining time on
    its count before the step (its JCT there less its ``age``).
    """
    eff_jct, eff_energy, counts = table.jct, table.energy, table.counts
    restart_s, restart_w = rules.restart_s, rules.restart_w
    d_jct = eff_jct[nxt - 1] - eff_jct[nxt]
    d_energy = eff_energy[nxt] - eff_energy[nxt - 1]
    cur = current[j]
    if restart_s > 0 and cur >= 0:
        if nxt == cur:
            d_jct += restart_s
            d_energy -= restart_s * restart_w * counts[nxt - 1]
        elif nxt - 1 == cur:
            d_jct -= restart_s
            d_energy += restart_s * restart_w * counts[nxt]
    cls, value = _step_key(d_jct, d_energy, rules.energy_aware)
    if rules.short_first > 0 and cls == 2:
        value *= _short_first(eff_jct[nxt - 1] - age[j], rules.short_ref_s, rules.short_first)
    return cls, value


@njit
def _before(
    a: int, b: int, cls: IntArray, value: FloatArray, rank: IntArray, tie: IntArray
) -> bool:
    """Python's ``(cls, value, rank, tie, entry)`` tuple ``<`` for entries ``a`` and ``b``."""
    if cls[a] != cls[b]:
        return bool(cls[a] < cls[b])
    if value[a] != value[b]:
        return bool(value[a] < value[b])
    if rank[a] != rank[b]:
        return bool(rank[a] < rank[b])
    if tie[a] != tie[b]:
        return bool(tie[a] < tie[b])
    return a < b


@njit
def _sift(
    heap: IntArray,
    size: int,
    pos: int,
    cls: IntArray,
    value: FloatArray,
    rank: IntArray,
    tie: IntArray,
) -> None:
    """``heapq._siftup``: sink ``heap[pos]`` to a leaf along smaller children, then back up.

    Restores the heap below ``pos`` when only ``heap[pos]`` may be out of place.
    Callers pass ``int(np.int64(0))`` rather than ``0`` for the root: numba
    compiles a separate copy for each literal argument it sees.
    """
    item = heap[pos]
    start = pos
    child = 2 * pos + 1
    while child < size:
        right = child + 1
        if right < size and not _before(heap[child], heap[right], cls, value, rank, tie):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    while pos > start:  # heapq._siftdown
        parent = (pos - 1) >> 1
        if not _before(item, heap[parent], cls, value, rank, tie):
            break
        heap[pos] = heap[parent]
        pos = parent
    heap[pos] = item


@njit
def _pop(
    heap: IntArray, size: int, cls: IntArray, value: FloatArray, rank: IntArray, tie: IntArray
) -> int:
    """``heapq.heappop`` without the answer (the caller read ``heap[0]``); returns the new size."""
    size -= 1
    heap[0] = heap[size]
    _sift(heap, size, int(np.int64(0)), cls, value, rank, tie)  # see ``_sift``
    return size


@njit
def _after_step(
    frm: int,
    to: int,
    table: Rows,
    allocated: int,
    jobs_w: float,
    nodes: int,
    strict: bool,
    power: PowerState,
) -> tuple[bool, int, float, int]:
    """A job's step from row ``frm`` (-1: it holds none) to ``to`` against the power
    model (``PowerModel.nodes_on``/``total_w`` inlined, the same arithmetic): whether
    it passes the check (every step with ``strict``, else one that switches a node
    on), and the GPUs allocated, the jobs' power and the nodes on after it. The one
    power rule of ``allocate_steps`` and ``tournament_steps``."""
    counts, watts = table.counts, table.power
    gpn = power.gpus_per_node
    new_jobs_w = jobs_w + watts[to] - (watts[frm] if frm >= 0 else 0.0)
    new_allocated = allocated + (counts[to] - (counts[frm] if frm >= 0 else 0))
    new_nodes = max(-(-new_allocated // gpn), power.base_nodes)
    over = new_jobs_w + power.idle_w * (new_nodes * gpn - new_allocated) > power.limit_w
    return not ((strict or new_nodes > nodes) and over), new_allocated, new_jobs_w, new_nodes


@njit
def allocate_steps(
    table: Rows,
    jobs: JobSteps,
    candidates: IntArray,
    rules: StepRules,
    power: PowerState,
    row: IntArray,
    order: IntArray,
    scratch: Heap,
) -> tuple[int, int, float]:
    """Allocation's heap loop over the ``candidates`` (see ``allocation.py``).

    Heap entries are jobs (one step each at a time), keyed (class, value,
    tie rank, row of the step); a first step has class 0 and the job's
    remaining service as value. ``PowerModel.nodes_on``/``total_w`` are
    inlined with the same arithmetic, starting from ``power``. Sets
    ``row[j]`` (it comes filled with -1, which stays for the jobs that wait)
    and lists in ``order`` the jobs in the order they got their first GPUs;
    returns how many did, the GPUs allocated and the jobs' predicted power.
    ``jobs.current`` and the rules' ``restart_s`` and ``restart_w``: the
    rescale cost (``_doubling_key``); ``rules.min_ratio``: the floor on a
    doubling's ``d_jct / d_energy`` (0: none). Doublings sit in the heap by
    that ratio, so the first one below the floor ends them all; first steps
    and free wins are never refused by it. ``scratch``: ``heap_arrays``, its
    ``tie`` holding each entry's row of the step.
    """
    counts, eff_jct = table.counts, table.jct
    start, sizes, ages, rank, current = jobs
    elastic, strict, min_ratio = rules.elastic, rules.strict, rules.min_ratio
    free, allocated, jobs_w, gpn, base_nodes = (
        power.free,
        power.allocated,
        power.jobs_w,
        power.gpus_per_node,
        power.base_nodes,
    )
    cls, value, to_row, heap = scratch
    size = root = int(np.int64(0))  # see ``_sift``
    for j in candidates:
        if sizes[j] == 0:
            continue
        first = start[j]
        cls[j] = 0
        value[j] = counts[first] * (eff_jct[first] - ages[j]) if elastic else 0.0
        to_row[j] = first
        heap[size] = j
        size += 1
    for pos in range(size // 2 - 1, -1, -1):  # heapq.heapify
        _sift(heap, size, pos, cls, value, rank, to_row)

    n_order = 0
    nodes = max(-(-allocated // gpn), base_nodes)
    while size and free > 0:  # every step costs at least one GPU
        j = heap[0]
        if min_ratio > 0 and cls[j] == 2 and -value[j] < min_ratio:
            break  # every later entry is a doubling of a lower ratio (or never taken)
        to = to_row[j]
        frm = row[j]
        cost = counts[to] - (counts[frm] if frm >= 0 else 0)
        if cost > free:
            size = _pop(heap, size, cls, value, rank, to_row)
            continue
        fits, new_allocated, new_jobs_w, new_nodes = _after_step(
            frm, to, table, allocated, jobs_w, nodes, strict, power
        )
        if not fits:
            size = _pop(heap, size, cls, value, rank, to_row)
            continue
        if frm < 0:
            order[n_order] = j
            n_order += 1
        row[j], allocated, free, jobs_w = to, new_allocated, free - cost, new_jobs_w
        nodes = new_nodes
        nxt = to + 1  # the job's next step replaces this one in the heap
        step_cls, step_value = 3, 0.0
        if elastic and nxt < start[j] + sizes[j]:
            step_cls, step_value = _doubling_key(j, nxt, table, current, ages, rules)
        if step_cls == 3:
            size = _pop(heap, size, cls, value, rank, to_row)
            continue
        cls[j], value[j], to_row[j] = step_cls, step_value, nxt
        _sift(heap, size, root, cls, value, rank, to_row)  # heapq.heapreplace
    return n_order, allocated, jobs_w


class Tournament(NamedTuple):
    """``tournament_steps``' scratch, per candidate (``tournament_arrays``): its
    remaining time on the count it holds and on its first step, the GPUs of its
    next step (``inf``: none left), and the two sides of AFS-L's inequality for
    that step, per GPU."""

    now: FloatArray
    first: FloatArray
    cost: FloatArray
    gain_old: FloatArray
    gain_new: FloatArray


def tournament_arrays(n: int) -> Tournament:
    """Scratch for ``tournament_steps`` over ``n`` candidates (see ``heap_arrays``)."""
    return Tournament(np.empty(n), np.empty(n), np.empty(n), np.empty(n), np.empty(n))


@njit
def _left_s(j: int, r: int, table: Rows, jobs: JobSteps, restart_s: float) -> float:
    """Job ``j``'s remaining time on row ``r``: its JCT there less its age, plus a
    checkpoint-restart when it runs now on another count (``_doubling_key``'s cost)."""
    left = table.jct[r] - jobs.age[j]
    cur = jobs.current[j]
    if restart_s > 0 and cur >= 0 and r != cur:
        left += restart_s
    return float(max(left, 1e-9))


@njit
def _next_step(
    k: int,
    j: int,
    to: int,
    table: Rows,
    jobs: JobSteps,
    rules: StepRules,
    scratch: Tournament,
) -> None:
    """Candidate ``k`` (job ``j``, now on row ``to``)'s next doubling in ``scratch``:
    its GPUs and AFS-L's gains per GPU, or no step (cost ``inf``) at its last row, for
    a doubling that does not shorten its JCT, or one below the floor on ``dJCT / dE``
    (``_doubling_key``, the rescale cost counted; ``rules.short_first`` is 0 here,
    ``allocation.allocate`` sees to it)."""
    now, _, cost, gain_old, gain_new = scratch
    nxt = to + 1
    cost[k] = np.inf
    if not rules.elastic or nxt >= jobs.start[j] + jobs.sizes[j]:
        return
    cls, value = _doubling_key(j, nxt, table, jobs.current, jobs.age, rules)
    if cls == 3 or (rules.min_ratio > 0 and cls == 2 and -value < rules.min_ratio):
        return
    c = float(table.counts[nxt] - table.counts[to])
    # Speeds as AFS-L writes them (``lab/baselines/kernels.afs_l_levels``).
    s0 = 1.0 / now[k]
    s1 = 1.0 / _left_s(j, nxt, table, jobs, rules.restart_s)
    cost[k] = c
    gain_old[k] = (s1 - s0) / s0 / c
    gain_new[k] = (s1 - s0) / s1 / c


@njit
def tournament_steps(
    table: Rows,
    jobs: JobSteps,
    candidates: IntArray,
    rules: StepRules,
    power: PowerState,
    row: IntArray,
    order: IntArray,
    scratch: Tournament,
) -> tuple[int, int, float]:
    """Allocation by AFS-L's tournament (``allocation.py``, ``tournament``): the same
    inputs, power checks and outputs as ``allocate_steps``, ``candidates`` in FIFO
    (tie-rank) order.

    Each round the incumbent meets every candidate whose next step fits the free
    GPUs, in order: of two jobs, ``l`` the one with less time left on the count
    it holds (none: infinite; equal: the incumbent) and ``h`` the other, ``l``
    wins iff ``(s'_l - s_l) / s_l / c_l > (s'_h - s_h) / s'_h / c_h`` (``s``
    its speed now, ``s'`` after the step of ``c`` GPUs); two jobs without GPUs:
    the one that finishes sooner on its first step. The winner's step is taken
    if the power check passes (as in ``allocate_steps``), else the job takes no
    more steps. A doubling below ``rules.min_ratio`` (or that does not shorten
    the JCT) ends the job's steps; first steps are never refused by the floor.

    The rounds are the AFS baseline's (``lab/baselines/kernels.afs_l_levels``)
    with these rules inside them. The baseline keeps its own loop: run through
    this one with nothing binding it took 386 µs a decision of 250 jobs on 512
    GPUs against 231 µs (the same levels), a few percent of an AFS run; and a
    kernel calls compiled helpers only from its own file (``core/jit.py``: numba's
    cache would miss a change to another file's), so the rounds' winner cannot be
    one helper of both.
    """
    counts = table.counts
    start, sizes = jobs.start, jobs.sizes
    strict = rules.strict
    free, allocated, jobs_w, gpn, base_nodes = (
        power.free,
        power.allocated,
        power.jobs_w,
        power.gpus_per_node,
        power.base_nodes,
    )
    now, first, cost, gain_old, gain_new = scratch
    inf = np.inf
    n = len(candidates)
    for k in range(n):
        j = candidates[k]
        now[k] = inf
        first[k] = inf
        cost[k] = inf
        gain_old[k] = inf
        gain_new[k] = 0.0
        if sizes[j] > 0:
            first[k] = _left_s(j, start[j], table, jobs, rules.restart_s)
            cost[k] = float(counts[start[j]])
            gain_new[k] = 1.0 / cost[k]
    n_order = 0
    nodes = max(-(-allocated // gpn), base_nodes)
    while free > 0:
        best = -1
        b_now = b_old = b_new = b_first = inf
        for k in range(n):
            if cost[k] > free:
                continue
            if best < 0:
                take = True
            elif now[k] < b_now:  # the challenger is the shorter job
                take = gain_old[k] > b_new
            elif b_now == inf:  # neither has GPUs
                take = first[k] < b_first
            else:  # the incumbent is the shorter job
                take = not b_old > gain_new[k]
            if take:
                best = k
                b_now, b_old, b_new, b_first = now[k], gain_old[k], gain_new[k], first[k]
        if best < 0:
            break
        j = candidates[best]
        frm = row[j]
        to = frm + 1 if frm >= 0 else start[j]
        step = counts[to] - (counts[frm] if frm >= 0 else 0)
        fits, new_allocated, new_jobs_w, new_nodes = _after_step(
            frm, to, table, allocated, jobs_w, nodes, strict, power
        )
        if not fits:
            cost[best] = inf  # the job takes no more steps; a smaller one may still fit
            continue
        if frm < 0:
            order[n_order] = j
            n_order += 1
        row[j], allocated, free, jobs_w = to, new_allocated, free - step, new_jobs_w
        nodes = new_nodes
        now[best] = _left_s(j, to, table, jobs, rules.restart_s)
        _next_step(best, j, to, table, jobs, rules, scratch)
    return n_order, allocated, jobs_w


@njit
def raise_steps(
    matrices: Matrices,
    rank: IntArray,
    total_w: float,
    rules: RaiseRules,
    columns: IntArray,
    raised_rows: IntArray,
    raised_from: IntArray,
    scratch: Heap,
) -> tuple[int, float]:
    """The clock phase's heap loop (see ``frequency.py``): take the best raise if it fits.

    Heap entries are rows keyed (class, value, tie rank, 0); a committed
    raise is replaced by the row's next one. ``total_w`` is the predicted
    power at the start columns, ``columns`` holds those and ends with the
    chosen ones; the committed raises (rows, columns before) are written in
    order to ``raised_rows`` and ``raised_from`` (room for ``rows * (width -
    1)``: every raise moves a row at least one column up). Returns how many,
    and the predicted power. ``rules.min_ratio``: the floor on a raise's
    ``d_jct / d_energy`` (0: none), as in ``allocate_steps``. ``scratch``:
    ``heap_arrays`` (``tie`` zero).
    """
    jct, energy, power = matrices
    limit_w, step, energy_aware, min_ratio, weight = rules
    cls, value, tie, heap = scratch
    rows, width = jct.shape
    size = root = int(np.int64(0))  # see ``_sift``
    for i in range(rows):
        col = columns[i]
        if col < width - 1:
            up = min(col + step, width - 1)
            cls[i], value[i] = _step_key(
                jct[i, col] - jct[i, up], energy[i, up] - energy[i, col], energy_aware
            )
            if cls[i] == 2:
                value[i] *= weight[i]
            if cls[i] < 3:
                heap[size] = i
                size += 1
    for pos in range(size // 2 - 1, -1, -1):  # heapq.heapify
        _sift(heap, size, pos, cls, value, rank, tie)
    n_raised = 0
    while size:
        i = heap[0]
        if min_ratio > 0 and cls[i] == 2 and -value[i] < min_ratio:
            break  # every later entry is a raise of a lower ratio
        col = columns[i]
        up = min(col + step, width - 1)
        new_total = total_w + (power[i, up] - power[i, col])
        if new_total > limit_w:  # the job leaves the heap; a smaller raise may still fit
            size = _pop(heap, size, cls, value, rank, tie)
            continue
        total_w = new_total
        columns[i] = up
        raised_rows[n_raised] = i
        raised_from[n_raised] = col
        n_raised += 1
        step_cls, step_value = 3, 0.0
        if up < width - 1:  # never raise at the top clock
            nxt = min(up + step, width - 1)
            step_cls, step_value = _step_key(
                jct[i, up] - jct[i, nxt], energy[i, nxt] - energy[i, up], energy_aware
            )
            if step_cls == 2:
                step_value *= weight[i]
        if step_cls == 3:
            size = _pop(heap, size, cls, value, rank, tie)
            continue
        cls[i], value[i] = step_cls, step_value
        _sift(heap, size, root, cls, value, rank, tie)  # heapq.heapreplace
    return n_raised, total_w
