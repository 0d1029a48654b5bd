"""Model predictions remembered across ``plan`` calls, so a replan skips the model calls.

Why: a job's table rows (step time and energy over its GPU counts x clocks)
depend only on its model object and the model arguments of its rows (GPU
count, GPUs per node, local batch) and on the clocks, none of which change
between most scheduling events; the simulator keeps a job's model object until
it refits and the operator until it refits from new samples. Remaining
iterations and the time only enter the JCT, which ``curves.py`` derives from
the rows afresh on every call.

The key is therefore what decides what the model is asked: the model
object's identity, the clocks and
the cluster shape (a small ``tag`` per distinct context), and the job fields
that choose its rows of ``(n, r, local batch)`` (``tables.JobKey``). The
entry holds a strong reference to the model, so its ``id`` cannot be reused
by another object while the entry lives, and a hit also checks ``is``. A
model object is assumed immutable (``PerfModel`` implementations are frozen
dataclasses); a new fit is a new object and therefore a miss.

A cached row is bit-for-bit what a fresh call returns: models are
elementwise in their broadcast arguments, so evaluating a job's rows alone or
together with other jobs gives the same floats (``tests/test_policy_cache.py``
plans random snapshots with a warm and a cold cache and compares the plans).
So the cache never changes a decision; the policy stays a pure function of the
snapshot.

Bounded: two generations of at most ``capacity`` jobs each; a hit in the old
generation moves to the new one, and when the new one is full the old one is
dropped (an approximate LRU without per-hit bookkeeping). ``fit`` raises the
capacity to twice the jobs of the largest snapshot seen, so that one snapshot's
jobs never evict each other (memory stays O(jobs) table rows). Every operation is a
single dict call, so concurrent ``plan`` calls cannot corrupt it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tables.py imports this module; the types are for checkers only
    from powerflow.policy.tables import Gathered, JobRows, Tables

CacheKey = Hashable
"""Starts with the id of the model; ``tables.JobKey`` for the policy's entries."""


@dataclass(frozen=True)
class CachedRows:
    model: object
    """Kept alive so that its ``id`` stays unique while this entry exists."""


@dataclass
class TableCache:
    """Per-job prediction rows (see the module docstring for why this is safe)."""

    capacity: int = 2048
    _new: dict[CacheKey, CachedRows] = field(default_factory=dict, repr=False)
    _old: dict[CacheKey, CachedRows] = field(default_factory=dict, repr=False)
    _tags: dict[Hashable, int] = field(default_factory=dict, repr=False)
    last: tuple[list[int], list[JobRows], Tables] | None = field(default=None, repr=False)
    """The previous call's job order and rows and the tables stacked from them
    (``tables.py``): an event that changed no job's rows reuses it. One reference,
    replaced whole."""

    gathered: Gathered | None = field(default=None, repr=False)
    """The last rows the policy gathered from its tables (``tables.Gathered``), set by
    ``tables.build_tables``: copied again, never changes a value."""

    def get(self, key: CacheKey, model: object) -> CachedRows | None:
        hit = self._new.get(key)
        if hit is None:
            hit = self._old.pop(key, None)
            if hit is None or hit.model is not model:
                return None
            self.put(key, hit)
        return hit if hit.model is model else None

    def recent(self) -> Mapping[CacheKey, CachedRows]:
        """The newer generation, for reading many keys without a call each.

        A hit there whose ``model`` is the caller's is what ``get`` returns; on
        anything else call ``get`` (which also looks in the older generation)
        and take ``recent`` again, since a ``get`` or ``put`` may start a new one.
        """
        return self._new

    def put(self, key: CacheKey, rows: CachedRows) -> None:
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

    def clear(self) -> None:
        self._new, self._old = {}, {}
        self.last = None
        self.gathered = None
