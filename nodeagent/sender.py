"""Samples from the agent to the operator's ingest endpoint: batched, retried, bounded.

``put`` never blocks the caller (the report handler on the event loop): it
appends to a bounded queue (``Batching.queue_max``), and when the queue is full
the new sample is dropped and counted (``powerflow_agent_samples_dropped_total{reason=
"queue_full"}``). ``run`` posts the queue in batches of ``Batching.batch_max`` to
``IngestConnection.url + contract.SAMPLES_PATH`` every ``Batching.interval_s``, as
``powerflow.core.telemetry.encode_batch`` JSON with ``Authorization: Bearer`` the
agent's projected ServiceAccount token. The token file is read again for
every post because the kubelet rotates it.

A batch leaves the queue only once the operator took it (2xx). On a failure
that may pass (no connection, a timeout, 5xx, among them the ingest's 503
``view_behind`` for samples newer than its cluster view, 401/403 while RBAC
or the token catches up, 429) it stays at the head of the queue and the sender
backs off exponentially with jitter (``Backoff.pause_s``), honouring a 429's
``Retry-After``. Any other 4xx means the operator will never accept this
batch (the wire format's validation refused it): it is logged with the
operator's reason and dropped, counted with ``reason="rejected"``, so one bad
batch cannot wedge the queue.

The node's GPU report (``gpu_report``: what NVML says of its GPUs,
``powerflow.core.gpu_facts``) goes to ``contract.GPUS_PATH`` at the first round and
then every ``Batching.report_interval_s``, so an operator that restarted learns
it again within that time. It is a post of its own, never in the sample queue's
way: any answer but a failure that may pass (see above) counts as delivered
until the next interval, a 404 from an operator that predates reports included
(it then plans from the nodes' labels); a failure that may pass is tried again
next round.

Each post also carries the node's jobs' progress as ``progress_of`` answers at
that moment (``Telemetry.progress``: each job's most iterations its workers here
reported). It is state, not a queue: the latest counts go with every post, and a
change of them since the last post the operator took is a reason for one post per
round (``Batching.interval_s``) even with no sample queued: workers report ten times a
second, and their counts must not turn the round into a stream of posts.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from powerflow.core import contract
from powerflow.core.gpu_facts import GpuReport, encode_report
from powerflow.core.telemetry import (
    MAX_SAMPLES_PER_BATCH,
    JobProgress,
    NodePower,
    SampleBatch,
    WindowSample,
    encode_batch,
)

log = logging.getLogger(__name__)

_RETRY_STATUSES: Final = frozenset({401, 403, 408, 429})


def _progress_refused(answer: str) -> int:
    """The ingest's count of progress entries it did not take (its cluster view may be
    behind the job's workers: the same counts are posted again next round)."""
    try:
        body = json.loads(answer)
    except ValueError:
        return 0
    value = body.get("progressRefused", 0) if isinstance(body, dict) else 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class IngestConnection:
    """Where and how the agent posts: the operator's ingest ``url`` (its
    ``contract.SAMPLES_PATH`` is added), the projected token presented to it
    (``token_file``; None: no ``Authorization``), the PEM certificates its HTTPS
    certificate must chain to (``ca_file``; None: the system's), and how long one
    post may take (``timeout_s``)."""

    url: str
    token_file: str | None = None
    ca_file: str | None = None
    timeout_s: float = 10.0


@dataclass(frozen=True)
class Batching:
    """How samples wait and leave: at most ``queue_max`` wait (more are dropped, never
    block the caller), a post carries at most ``batch_max`` (the wire format's
    ``MAX_SAMPLES_PER_BATCH`` at most), and a round of posts starts every
    ``interval_s`` (sooner when a batch fills up)."""

    queue_max: int = 10_000
    batch_max: int = 500
    interval_s: float = 5.0
    report_interval_s: float = 300.0
    """Between two GPU reports (the module docstring)."""

    def __post_init__(self) -> None:
        if self.queue_max < 1 or not 1 <= self.batch_max <= MAX_SAMPLES_PER_BATCH:
            raise ValueError(f"queue_max must be >= 1, batch_max in [1, {MAX_SAMPLES_PER_BATCH}]")


@dataclass(frozen=True)
class Backoff:
    """The pause after failed posts: ``initial_s`` after the first, doubling up to
    ``max_s`` (also the most a 429's ``Retry-After`` holds the sender)."""

    initial_s: float = 1.0
    max_s: float = 60.0

    def pause_s(self, failures: int, rng: random.Random | None = None) -> float:
        """The pause after ``failures`` failed posts in a row: ``initial_s *
        2**(failures-1)`` capped at ``max_s``, times a jitter in [0.5, 1] so agents
        that lost the operator together do not come back in lockstep."""
        base = min(self.max_s, self.initial_s * 2.0 ** min(max(failures - 1, 0), 62))
        jitter = (rng or random).uniform(0.5, 1.0)
        return base * jitter


DEFAULT_BATCHING: Final = Batching()
DEFAULT_BACKOFF: Final = Backoff()


class SampleSender:
    """Queue of samples for the operator (see the module docstring).

    ``registry`` receives the counters (a private one when None, so several
    senders can live in one process, as in tests).
    """

    def __init__(
        self,
        connection: IngestConnection,
        node: str,
        *,
        batching: Batching = DEFAULT_BATCHING,
        backoff: Backoff = DEFAULT_BACKOFF,
        registry: CollectorRegistry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.connection = connection
        self.url = connection.url.rstrip("/") + contract.SAMPLES_PATH
        self.node = node
        self.batching = batching
        self.backoff = backoff
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context(cafile=connection.ca_file) if connection.ca_file else None
        )
        self._rng = rng or random.Random()
        self._queue: collections.deque[WindowSample] = collections.deque()
        self._power: NodePower | None = None
        self.progress_of: Callable[[], tuple[JobProgress, ...]] = tuple
        """The jobs' progress to send with each post (set by ``Telemetry``)."""
        self._progress_taken: tuple[JobProgress, ...] = ()
        self.gpu_report: GpuReport | None = None
        """The node's GPUs, posted to ``contract.GPUS_PATH`` (set by the agent's wiring)."""
        self._report_due_s: float | None = None
        """Loop time of the next GPU report (None: at the first round)."""
        self._wake = asyncio.Event()
        self._retry_after_s = 0.0
        self.failures = 0
        """Failed posts in a row (0 after a success)."""
        registry = registry if registry is not None else CollectorRegistry()
        self.dropped = Counter(
            "powerflow_agent_samples_dropped",
            "Samples the agent dropped: queue full, or a batch the operator rejected (4xx).",
            ["reason"],
            registry=registry,
        )
        self.sent = Counter(
            "powerflow_agent_samples_sent",
            "Samples the operator's ingest endpoint accepted.",
            registry=registry,
        )
        self.post_failures = Counter(
            "powerflow_agent_sample_post_failures",
            "Posts of a batch that failed and will be retried.",
            registry=registry,
        )
        for reason in ("queue_full", "rejected"):
            self.dropped.labels(reason)

    # -- the producer side (never blocks) -------------------------------------

    def put(self, sample: WindowSample) -> None:
        """Queue ``sample``; count it dropped when the queue is full. Call it on the
        event loop that runs ``run`` (it may wake it), as the worker endpoint's
        handler is."""
        if len(self._queue) >= self.batching.queue_max:
            self.dropped.labels("queue_full").inc()
            return
        self._queue.append(sample)
        if len(self._queue) >= self.batching.batch_max:
            self._wake.set()

    def set_power(self, power: NodePower) -> None:
        """The node's latest board power; it rides on the next post."""
        self._power = power

    def queued(self) -> Sequence[WindowSample]:
        """The samples waiting, oldest first (a copy)."""
        return tuple(self._queue)

    # -- the consumer side -----------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Post until ``stop`` is set, then try once more to deliver what is queued."""
        timeout = aiohttp.ClientTimeout(total=self.connection.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            pause_s = self.batching.interval_s
            while not stop.is_set():
                await self._sleep(pause_s, stop)
                if stop.is_set():
                    break
                await self._report(session)
                pause_s = await self._flush(session)
            if self._queue:
                await self._flush(session, once=True)

    async def _report(self, session: aiohttp.ClientSession) -> None:
        """Post the GPU report when it is due (module docstring)."""
        now = asyncio.get_running_loop().time()
        if self.gpu_report is None or (self._report_due_s is not None and now < self._report_due_s):
            return
        url = self.connection.url.rstrip("/") + contract.GPUS_PATH
        status = await self._send(session, url, encode_report(self.gpu_report))
        if status is None or status >= 500 or status in _RETRY_STATUSES:
            return  # tried again next round
        if status == 404:
            log.info("the operator takes no GPU reports (404): it plans from the nodes' labels")
        elif status >= 300:
            log.warning("the operator refused this node's GPU report with %d", status)
        self._report_due_s = now + self.batching.report_interval_s

    async def _send(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, object]
    ) -> int | None:
        """POST ``body`` with the token; the status, or None when no answer came."""
        headers = self._headers()
        if headers is None:
            return None
        try:
            async with session.post(
                url, json=body, headers=headers, ssl=self._ssl if self._ssl is not None else True
            ) as resp:
                await resp.read()
                return resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("posting to %s failed: %s", url, e or type(e))
            return None

    def _headers(self) -> dict[str, str] | None:
        """``Authorization`` from the token file, read again for every post (the kubelet
        rotates it); None when it cannot be read."""
        token_file = self.connection.token_file
        if token_file is None:
            return {}
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            log.warning("cannot read the ingest token %s: %s", token_file, e)
            return None
        return {"Authorization": f"Bearer {token}"}

    async def _flush(self, session: aiohttp.ClientSession, *, once: bool = False) -> float:
        """Post batches while there are any; the pause before the next round."""
        posted = False  # a change of progress alone is posted once a round, not per change
        while (
            self._queue
            or self._power is not None
            or (not posted and self.progress_of() != self._progress_taken)
        ):
            posted = True
            if not await self._post_one(session):
                self.failures += 1
                self.post_failures.inc()
                return self.backoff.pause_s(self.failures, self._rng)
            self.failures = 0
            if once:
                break
        return self.batching.interval_s

    async def _post_one(self, session: aiohttp.ClientSession) -> bool:
        """Post the head batch; True when it left the queue (accepted or rejected)."""
        count = min(len(self._queue), self.batching.batch_max)
        samples = tuple(self._queue[i] for i in range(count))
        power = self._power
        headers = self._headers()
        if headers is None:
            return False
        progress = self.progress_of()
        body = encode_batch(SampleBatch(self.node, samples, power, progress))
        try:
            async with session.post(
                self.url,
                json=body,
                headers=headers,
                ssl=self._ssl if self._ssl is not None else True,
            ) as resp:
                status = resp.status
                text = await resp.text()
                reason = text[:300] if status >= 300 else ""
                retry_after = resp.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            log.warning("posting %d samples to %s failed: %s", count, self.url, e or type(e))
            return False
        if 200 <= status < 300:
            self._consume(count, power)
            if not _progress_refused(text):  # else posted again next round, as it is then
                self._progress_taken = progress
            self.sent.inc(count)
            return True
        if status >= 500 or status in _RETRY_STATUSES:
            log.warning("ingest answered %d to %d samples (will retry): %s", status, count, reason)
            if status == 429 and retry_after is not None and retry_after.isdigit():
                self._retry_after_s = float(retry_after)
            return False
        log.error("ingest rejected %d samples with %d (dropped): %s", count, status, reason)
        self._consume(count, power)
        self._progress_taken = progress  # the same counts would be rejected the same way
        self.dropped.labels("rejected").inc(count)
        return True

    def _consume(self, count: int, power: NodePower | None) -> None:
        for _ in range(count):
            self._queue.popleft()
        if self._power is power:
            self._power = None

    async def _sleep(self, seconds: float, stop: asyncio.Event) -> None:
        """Wait ``seconds`` (at least a 429's Retry-After), or less when a batch
        fills up or ``stop`` is set."""
        seconds = max(seconds, min(self._retry_after_s, self.backoff.max_s))
        self._retry_after_s = 0.0
        self._wake.clear()
        waits = [asyncio.ensure_future(stop.wait())]
        if self.failures == 0:
            waits.append(asyncio.ensure_future(self._wake.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
