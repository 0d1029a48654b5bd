"""kube-scheduler's candidate nodes, decoded once for every call that sends the same names.

kube-scheduler sends the names of every node its own filters passed: the
same 5,000 names for pod after pod. Decoding them, hashing them into a set
and writing the 5,000-entry ``FailedAndUnresolvableNodes`` map of a filter
answer cost more than the decision itself, so a ``Candidates`` list keeps
what is derived from the names alone (their set, whether any repeats, their
JSON, and the last few unresolvable maps written from them), and
``NamesMemo`` hands the same ``Candidates`` to every call whose ``NodeNames``
bytes are the same. Everything kept is a function of the names (and, for a
map, of its reason and the names left out, which are its key): no cluster
change can make it stale, so nothing needs invalidating.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet

import orjson

MAPS_KEPT = 8
"""Unresolvable maps kept per candidate list (``Candidates.unresolvable_json``): the gangs
whose workers kube-scheduler is filtering now, one map each (its reason names the gang)."""

LISTS_KEPT = 4
"""Candidate lists kept by ``NamesMemo``: the scheduler's usual lists (all nodes, and the
few its own filters narrow for some pods)."""


class Candidates(list[str]):
    """Candidate node names with what is derived from them computed once.

    Shared between calls (``NamesMemo``), on the event loop and on the worker threads
    that answer large bodies: never mutated once built; what is computed lazily is at
    worst computed twice.
    """

    __slots__ = ("_json", "_maps", "_members", "_zeros")

    def __init__(self, names: Iterable[str]) -> None:
        super().__init__(names)
        self._members: frozenset[str] | None = None
        self._json: bytes | bool | None = False  # False: not computed yet
        self._maps: dict[tuple[str, frozenset[str]], bytes] = {}
        self._zeros: bytes | None = None

    @property
    def members(self) -> frozenset[str]:
        if self._members is None:
            self._members = frozenset(self)
        return self._members

    @property
    def distinct(self) -> bool:
        """No name is sent twice (kube-scheduler's lists never repeat one)."""
        return len(self.members) == len(self)

    def plain_json(self) -> bytes | None:
        """The names' JSON array when no name needs an escape or holds a comma (node names
        never do): then ``","`` lies only between two names. ``None`` otherwise."""
        if self._json is False:
            try:
                text: bytes | None = orjson.dumps(list(self))
            except orjson.JSONEncodeError:  # lone surrogates
                text = None
            if text is not None and (b"\\" in text or text.count(b",") != max(len(self) - 1, 0)):
                text = None
            self._json = text
        return self._json if isinstance(self._json, bytes) else None

    def zero_priorities(self) -> bytes | None:
        """The all-zero ``HostPriorityList`` of these names (``zero_priorities``), when they
        are non-empty and plain (``plain_json``)."""
        if self._zeros is None:
            text = self.plain_json()
            if text is None or not self:
                return None
            self._zeros = zero_priorities(text)
        return self._zeros

    def unresolvable_json(self, reason: str, left_out: AbstractSet[str]) -> bytes | None:
        """``orjson.dumps(dict.fromkeys(self, reason))`` less the ``left_out`` names (which
        must be candidates), or ``None`` where only that general way writes it (repeated
        or escaped names, a reason orjson cannot write).

        Written from the names' JSON by one ``replace`` (``","`` becomes
        ``":reason,"``) after cutting out the left-out names, which a plain
        array holds once each as ``"name"``; and kept (``MAPS_KEPT``), since a
        gang's workers are filtered one after another against the same names.
        A kept map saves a quarter of a filter call's server CPU at 5,000
        nodes: 0.24 ms written each time, 0.18 ms kept, over HTTP (0.29 and
        0.19 ms in-process through the app), ``python -m
        benchmarks.extender_bench --no-bind``.
        """
        key = (reason, frozenset(left_out))
        kept = self._maps.get(key)
        if kept is not None:
            return kept
        text = self.plain_json()
        if text is None or not self.distinct:
            return None
        try:
            why = orjson.dumps(reason)
        except orjson.JSONEncodeError:
            return None
        for name in key[1]:
            entry = orjson.dumps(name)
            at = text.find(entry)
            if at < 0:
                return None  # not a candidate: not this method's contract
            end = at + len(entry)
            if text[end : end + 1] == b",":
                text = text[:at] + text[end + 1 :]
            elif text[at - 1 : at] == b",":
                text = text[: at - 1] + text[end:]
            else:
                text = text[:at] + text[end:]
        inner = text[1:-1]
        # One join, not a chain of ``+``: each ``+`` would copy the 330 kB map again.
        written = (
            b"".join((b"{", inner.replace(b'","', b'":' + why + b',"'), b":", why, b"}"))
            if inner
            else b"{}"
        )
        # A copy replaced at once: large bodies are answered on worker threads, and two
        # evicting the same oldest map from one dict would fail.
        maps = dict(self._maps)
        if len(maps) >= MAPS_KEPT:
            del maps[next(iter(maps))]
        maps[key] = written
        self._maps = maps
        return written


def zero_priorities(names: bytes) -> bytes:
    """The ``HostPriorityList`` scoring 0 everywhere of a non-empty plain JSON array of names
    (``Candidates.plain_json``): ``","`` replaced, every entry written at once."""
    entries = names[1:-1].replace(b'","', b'","Score":0},{"Host":"')
    return b'[{"Host":' + entries + b',"Score":0}]'


class AllBut(Mapping[str, str]):
    """Every candidate but ``left_out`` (a subset of them), each failing for one ``reason``:
    a filter answer's unresolvable nodes without a dict of thousands of names, written by
    ``Candidates.unresolvable_json`` and made a dict only when read entry by entry.

    ``distinct``: no candidate repeats (its size is then known without a dict)."""

    __slots__ = ("_dict", "_distinct", "candidates", "left_out", "reason")

    def __init__(
        self, candidates: Sequence[str], left_out: AbstractSet[str], reason: str, distinct: bool
    ) -> None:
        self.candidates, self.left_out, self.reason = candidates, left_out, reason
        self._distinct = distinct
        self._dict: dict[str, str] | None = None

    def as_dict(self) -> dict[str, str]:
        if self._dict is None:
            out = dict.fromkeys(self.candidates, self.reason)
            for name in self.left_out:
                out.pop(name, None)
            self._dict = out
        return self._dict

    def json(self) -> bytes | None:
        """The map's JSON, byte for byte ``orjson.dumps(self.as_dict())``, when the candidates
        can write it quickly (``Candidates.unresolvable_json``); else ``None``."""
        if isinstance(self.candidates, Candidates):
            return self.candidates.unresolvable_json(self.reason, self.left_out)
        return None

    def __getitem__(self, name: str) -> str:
        return self.as_dict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        if self._distinct:
            return len(self.candidates) - len(self.left_out)
        return len(self.as_dict())

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"AllBut({len(self.candidates)} candidates, left out {set(self.left_out)!r})"


def index(candidates: Sequence[str]) -> tuple[AbstractSet[str], bool]:
    """The candidates' set and whether they are distinct, kept when they are ``Candidates``."""
    if isinstance(candidates, Candidates):
        return candidates.members, candidates.distinct
    members = set(candidates)
    return members, len(members) == len(candidates)


class NamesMemo:
    """The ``Candidates`` of the last few ``NodeNames`` arrays, by their JSON bytes.

    A call that sends the same bytes (kube-scheduler's usual call: the same
    names for pod after pod) gets the same ``Candidates`` after one ``memcmp``
    instead of decoding 5,000 strings; the lookup compares bytes, never hashes
    them. Safe to share across threads: a lost race builds a list twice."""

    def __init__(self, size: int = LISTS_KEPT) -> None:
        self.size = size
        self._kept: tuple[tuple[bytes, Candidates], ...] = ()

    def get(self, raw: bytes) -> Candidates | None:
        for text, names in self._kept:
            if text == raw:
                return names
        return None

    def put(self, raw: bytes, names: Candidates) -> None:
        self._kept = ((raw, names), *self._kept[: self.size - 1])
