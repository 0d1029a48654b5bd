"""The GPU types the node agents discovered, per node, as the operator plans with them.

Each agent reports its GPUs (``powerflow.core.gpu_facts``) to the ingest at start
and every few minutes; the ingest records the spec a report gives here, and the
allocation pass (``nodes.cluster_nodes``) and the ingest's physics checks
(``sample_checks.node_gpus``) read it: discovered facts beat the catalogue.
The agents write nothing to the API server (they need no right to write nodes).

Restarts. An operator that forgot what the agents said would plan a pool whose
label the catalogue lacks as unknown until every agent reported again (up to
300 s): its jobs' pods would lose their clocks and caps, then get them back. So
the operator also keeps each accepted report on its node, as the record
``contract.GPU_REPORT_ANNOTATION`` (the pass writes the ones ``unrecorded``
names, with the right it has for node marks, ``patch`` on nodes), and each pass
reads back the records of the nodes it has no entry for (``unread``, parsed by
``read_records`` in a worker thread, then ``take``; ``restore`` does all three): a
restarted operator's first pass plans the pool as the last one did, and writes
nothing its predecessor did not. Anyone who may patch the node may edit its
record, so a record is read exactly as a report is accepted
(``gpu_facts.parse_record``: ``parse_report``'s bounds, the node's own report;
then ``node_spec``; ``nodes.pool_gpu``'s rules apply to it alike), and one that
is not acceptable is logged once and ignored; an entry read back is what its
node's record says, so it goes when the record goes or turns unacceptable. A
report from the node's agent beats the record, which is then rewritten to
match. A record is rewritten when the report it holds changes or is
``REFRESH_S`` old (one write per node per half hour, not one per report), and
one older than ``STALE_S`` is not read back.

A record already taken or refused is not parsed again (a memo: the entry keeps
the record it stands for, ``_ignored`` the refused ones). Reading 1,000 nodes'
records of 8 H100s costs 322-355 ms of CPU at the first pass after a restart
(in a worker thread), and each later pass that finds them unchanged 0.71-0.74 ms
instead (``python -m benchmarks gpu_records``, best of 5, two runs on a shared
2-core machine); ``tests/test_gpu_discovery.py`` checks that the memo gives
what parsing every record at every pass gives.

A node's entry goes when the node leaves the cluster (``keep_only``) or when its
agent stops reporting for ``STALE_S`` (a node whose agent was replaced by one
that cannot read NVML must not keep an old type for ever). A node reports at
most once per ``MIN_INTERVAL_S``: more is refused (``too_often``), so a sender
cannot make the ingest rebuild specs in a loop; an entry read back from a record
does not count as a report there, so the agent's first report after a restart is
taken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from powerflow.core import contract
from powerflow.core.errors import PowerFlowError
from powerflow.core.gpu_facts import GpuReport, encode_record, node_spec, parse_record
from powerflow.core.gpus import GpuSpec

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 10.0
"""Least time between two accepted reports of one node (an agent sends one every 300 s)."""
STALE_S = 3600.0
"""A node's discovered type is forgotten this long after its last report."""
REFRESH_S = STALE_S / 2
"""A node's record is rewritten this long after it was written, although its agent
reports the same: a record read back after a restart is then at most this much older
than the agent's last report, and the node keeps its type at least ``STALE_S -
REFRESH_S`` for the agent to report again."""


@dataclass(frozen=True)
class _Entry:
    spec: GpuSpec
    at: float
    """When the node's agent last reported (read back: when the record was written)."""
    report: GpuReport
    record: str
    """The record that stands for ``report`` (``gpu_facts.encode_record``)."""
    recorded_at: float
    reported: bool
    """Reported to this process (False: read back from the node's record)."""


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def record_of(body: Any) -> tuple[str, str | None]:
    """A Node body's name and its GPU record (None: none, or not a string)."""
    meta = _dict(_dict(body).get("metadata"))
    name = meta.get("name")
    text = _dict(meta.get("annotations")).get(contract.GPU_REPORT_ANNOTATION)
    return (name if isinstance(name, str) else ""), (text if isinstance(text, str) else None)


def read_record(name: str, text: str, now_s: float) -> tuple[GpuReport, GpuSpec, float]:
    """Node ``name``'s record as the ingest takes a report: its report, the spec it gives
    and when it was accepted; ``PowerFlowError`` when the ingest would refuse it, or
    when it is older than ``STALE_S``."""
    report, at = parse_record(text, name, now_s)
    if now_s - at > STALE_S:
        raise PowerFlowError(f"written {now_s - at:.0f} s ago, more than {STALE_S:g} s")
    return report, node_spec(report.gpus), at


Read = tuple[GpuReport, GpuSpec, float] | PowerFlowError
"""What ``read_record`` gave of one record: its report, spec and time, or why not."""


def read_records(pending: Iterable[tuple[str, str]], now_s: float) -> list[tuple[str, str, Read]]:
    """``read_record`` of each ``(node, record)`` (pure: runs in a worker thread)."""
    out: list[tuple[str, str, Read]] = []
    for name, text in pending:
        try:
            read: Read = read_record(name, text, now_s)
        except PowerFlowError as exc:
            read = exc
        out.append((name, text, read))
    return out


def recorded_specs(bodies: Iterable[Any], now_s: float) -> dict[str, GpuSpec]:
    """Each node's type as its record gives it, for a reader that keeps no memory (the
    CLI's what-if); records that ``read_record`` refuses are left out."""
    out = {}
    for body in bodies:
        name, text = record_of(body)
        if name and text is not None:
            try:
                out[name] = read_record(name, text, now_s)[1]
            except PowerFlowError:
                continue
    return out


class DiscoveredGpus:
    """Node name -> its discovered spec, when it was reported, and its record."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._ignored: dict[str, str] = {}
        """Each node's record that ``take`` refused (judged and logged once)."""

    def too_soon(self, node: str) -> bool:
        """Whether ``node``'s agent reported less than ``MIN_INTERVAL_S`` ago."""
        kept = self._entries.get(node)
        return kept is not None and kept.reported and self._clock() - kept.at < MIN_INTERVAL_S

    def record(self, node: str, spec: GpuSpec, report: GpuReport) -> None:
        """An accepted report of ``node`` and the spec it gives."""
        now = self._clock()
        kept = self._entries.get(node)
        if kept is not None and kept.report == report and now - kept.recorded_at < REFRESH_S:
            text, recorded_at = kept.record, kept.recorded_at
        else:
            text, recorded_at = encode_record(report, now), now
        self._entries[node] = _Entry(spec, now, report, text, recorded_at, reported=True)

    def now(self) -> float:
        return self._clock()

    def unread(self, bodies: Iterable[Any]) -> list[tuple[str, str]]:
        """``(node, record)`` of the nodes in ``bodies`` (Node objects) whose record is to be
        read: no entry from a report, and a record neither taken nor refused before. An
        entry read back from a record that is gone goes with it (read back, an entry is
        what its node's record says, no more)."""
        out = []
        for body in bodies:
            name, text = record_of(body)
            kept = self._entries.get(name)
            if not name or (kept is not None and kept.reported):
                continue
            if text is None or self._ignored.get(name) == text:
                if kept is not None:
                    del self._entries[name]
                continue
            if kept is None or kept.record != text:
                out.append((name, text))
        return out

    def take(self, read: Iterable[tuple[str, str, Read]]) -> None:
        """``read_records``' answers: each record read is the node's entry unless its agent
        reported meanwhile; each refused one is logged, once."""
        for name, text, got in read:
            kept = self._entries.get(name)
            if kept is not None and kept.reported:
                continue
            if isinstance(got, PowerFlowError):
                self._entries.pop(name, None)  # one read back from the record before
                self._ignored[name] = text
                log.warning(
                    "node %s: its %s is not taken: %s",
                    name, contract.GPU_REPORT_ANNOTATION, str(got)[:300],
                )  # fmt: skip
                continue
            report, spec, at = got
            self._entries[name] = _Entry(spec, at, report, text, at, reported=False)

    def restore(self, bodies: Iterable[Any]) -> None:
        """``unread``, ``read_records`` and ``take`` in one call (on the caller's thread)."""
        self.take(read_records(self.unread(bodies), self._clock()))

    def unrecorded(self, bodies: Iterable[Any]) -> list[tuple[str, str]]:
        """``(node, record)`` for each node in ``bodies`` whose record is not the one of its
        agent's last report: the writes that bring the records up to date."""
        out = []
        for body in bodies:
            name, text = record_of(body)
            kept = self._entries.get(name)
            if kept is not None and kept.reported and kept.record != text:
                out.append((name, kept.record))
        return out

    def specs(self) -> dict[str, GpuSpec]:
        """The fresh entries (stale ones are dropped here)."""
        now = self._clock()
        for node in [n for n, e in self._entries.items() if now - e.at > STALE_S]:
            del self._entries[node]
        return {node: e.spec for node, e in self._entries.items()}

    def keep_only(self, nodes: Iterable[str]) -> None:
        """Forget the nodes that left the cluster."""
        keep = set(nodes)
        for node in [n for n in self._entries if n not in keep]:
            del self._entries[node]
        for node in [n for n in self._ignored if n not in keep]:
            del self._ignored[node]
