"""What a ``PowerFlowPolicy`` keeps between its ``plan`` calls: the policy's one speed layer.

The policy stays a pure function of the snapshot; this only spares work
whose answer a previous call already had, and never changes a plan
(``tests/test_policy_memo.py`` plans sequences of related snapshots with one
warm policy and compares every plan with a fresh policy's). It keeps six
things; the first four together take a whole-trace fitted run (``powerflow simulate
--scheduler powerflow --eta 0.6``, 2,314 decisions of 177 jobs on average)
from 47 s of CPU to 10 s (``python benchmarks/sim_bench.py --runs fitted``
with and without ``--forget``, which plans every decision with a fresh
policy):

* **Each job's table rows** (``tables.JobRows``: predicted step time and
  energy over its GPU counts x clocks, and what is derived from them). A
  job's rows depend only on its model object, the fields that choose its
  counts and the clocks and cluster shape, none of which change at most
  events; without them every decision calls every job's model again.
* **The previous call's job plans** (``plans``), handed out again when all
  their fields are equal: most of a run's job plans equal the previous
  call's, a frozen ``JobPlan`` per job per call is not free, and the
  simulator skips a plan object a job already runs by unread.
* **The previous call's static part** (``static``: ``static.StaticPart``):
  the field checks, stacked tables, power correction and tie-break ranks of
  the jobs, which depend on everything but their progress, handed out whole
  when only progress changed and kept job by job (``StaticPart.matches``)
  for the jobs whose fields did not change; ``static.py`` says exactly what is
  compared. Policy CPU of that run 8.3 -> 6.7 s (``python
  benchmarks/sim_bench.py --runs fitted`` with and without ``--clear
  static``, best of 3 on a shared 2-core machine at load average 3-4).
* **The previous call's placement** (``placement``: ``place_columns``'
  arguments and its result), handed out again for equal arguments:
  placement is a pure function of them, and at most decisions that follow
  one that changed nothing the running jobs ask for exactly the GPUs they
  hold (890 of the 2,314). Policy CPU 7.3 -> 6.7 s (the same with and
  without ``--clear placement``).
* **The rows the previous call's clock phase read** (``gathered``:
  ``tables.Gathered``, the running jobs' step time and energy at every
  clock), taken by row serial instead of gathered row by row again
  (``Tables.values``; its gain is in ``Gathered``).
* **The previous call's cluster** (``cluster``: ``validate.Cluster`` and the
  ``Snapshot.nodes`` it was made of), handed out again for the very same nodes
  tuple (a simulator hands the same one to every call; nodes are frozen):
  ``cluster_of`` checks every node at each call, 13 µs of CPU at 64 nodes, 0.03 s
  over a fitted run's 2,314 decisions (``time.process_time`` around it in a replay of
  ``benchmarks/replay_bench.py``'s snapshots).

Keys: a job's rows are keyed by the id of its model object and the fields
and context that choose them (``tables.JobKey``); the entry keeps the model
alive, so its id cannot be reused by another object while the entry lives,
and a hit also checks identity. A model object is assumed immutable
(``PerfModel`` implementations are frozen dataclasses); a refit is a new
object and so a miss.

Bounded: rows are kept in two generations of at most ``capacity`` jobs; a
hit in the old one moves to the new one, and when the new one is full the
old one is dropped. ``fit`` raises the capacity to twice the largest
snapshot seen, so that one snapshot's jobs never evict each other. Every
operation is one dict call or one reference swap, so concurrent ``plan``
calls of one policy cannot corrupt it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Generic, Protocol, TypeVar

from powerflow.core.policy.placement import PlacementResult
from powerflow.core.policy.snapshot import JobPlan


class Entry(Protocol):
    """What the memo keeps per job key: anything that names the model it came from."""

    @property
    def model(self) -> object: ...


R = TypeVar("R", bound=Entry)


class PolicyMemo(Generic[R]):
    """Table rows per job key, and the last call's job plans (see the module docstring).

    Generic in the kind of rows so that this module needs nothing from
    ``tables.py`` (which uses it with its ``JobRows``).
    """

    __slots__ = (
        "_new",
        "_old",
        "_tags",
        "capacity",
        "cluster",
        "gathered",
        "placement",
        "plans",
        "static",
    )

    def __init__(self, capacity: int = 2048) -> None:
        self.capacity = capacity
        self._new: dict[Hashable, R] = {}
        self._old: dict[Hashable, R] = {}
        self._tags: dict[Hashable, int] = {}
        self.plans: Mapping[str, JobPlan] = {}
        """The previous call's plan per job id; replaced whole by each call."""
        self.static: object = None
        """The previous call's ``static.StaticPart`` (None before the first call)."""
        self.placement: tuple[tuple[object, ...], PlacementResult] | None = None
        """The previous call's placement: its inputs (``place_columns``' arguments) and
        its result."""
        self.gathered: object = None
        """The rows the previous call's clock phase read (``tables.Gathered``)."""
        self.cluster: tuple[object, object] | None = None
        """The previous call's ``Snapshot.nodes`` and the ``validate.Cluster`` made of them."""

    def rows(self, key: Hashable, model: object) -> R | None:
        """The rows kept under ``key`` for this very ``model`` object, or None."""
        hit = self._new.get(key)
        if hit is None:
            hit = self._old.pop(key, None)
            if hit is None or hit.model is not model:
                return None
            self.keep(key, hit)
        return hit if hit.model is model else None

    def keep(self, key: Hashable, rows: R) -> None:
        if len(self._new) >= self.capacity:
            self._old, self._new = self._new, {}
        self._new[key] = rows

    def fit(self, jobs: int) -> None:
        """Make room for ``jobs`` entries without evicting any of them within one call."""
        self.capacity = max(self.capacity, 2 * jobs)

    def tag(self, context: Hashable) -> int:
        """A small int for ``context`` (clocks, cluster shape), so keys stay cheap to hash."""
        return self._tags.setdefault(context, len(self._tags))

    def __len__(self) -> int:
        return len(self._new) + len(self._old)
