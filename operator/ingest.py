"""The ingest endpoint: node agents post their per-window samples to the operator.

An aiohttp server on the operator's event loop (``--ingest-port``,
``contract.INGEST_PORT``; 0 turns it off; HTTPS with
``--ingest-tls-cert/--ingest-tls-key``) serves ``POST contract.SAMPLES_PATH``
with a ``powerflow.core.telemetry`` batch. Each request is checked in this order,
and the first failure answers at once (JSON ``{"error": reason, "message"}``,
one count of ``powerflow_ingest_refused_total{reason}``):

1. a ``Content-Length`` over ``telemetry.MAX_BODY_BYTES``: 413
   ``body_too_large`` before anything is read (instead of ``100 Continue``
   to a client that asks first; a chunked body is read up to the bound, then
   the same 413);
2. the bearer token (``tokenreview``): none or not authenticated for our
   audience 401 ``unauthenticated``; another account 403 ``wrong_account``;
   no node for the sender 403 ``no_node``;
3. this replica has no cluster view yet, or is not the leader (only the
   leader refits and writes status): 503 ``unavailable`` with
   ``Retry-After``, also when the API server could not review the token.
   The agent keeps the batch and retries, as for any 5xx; no bad input ever
   gets a 5xx;
4. the body: unreadable (a broken chunk, a ``Content-Encoding`` it is not
   in, cut short), not JSON, or refused by ``telemetry.parse_batch``: 400
   ``invalid`` with its one-line message; ``batch.node`` not the sender's
   node: 403 ``node_mismatch``.

Then each sample on its own, against the leader's latest cluster view (the
``ClusterState`` its last allocation pass read: no API call per sample), by
``sample_checks``: the DLJob must exist (``unknown_job``) and have a worker pod
of the sample's generation bound to the sender's node (``not_on_node``), at
least as many as the GPUs the sample measured (``too_many_gpus``: one GPU per
worker pod); the sample must match that generation's allocation
(``wrong_allocation``), have a clock the node's GPU has
(``impossible_clock``) and a power the GPUs can draw (``impossible_power``);
and it must end no later than ``MAX_AHEAD_S`` past the operator's clock
(``clock_ahead``) and after the last window taken from that sender for that
job (``duplicate``, ``overlap``). Refused samples are counted by reason (and by
reason and sender: ``powerflow_ingest_samples_refused_total{sender_node,reason}``;
a ``SUSPECT`` reason is logged once an hour per sender and told to ``ControllerLink.on_refused``,
which the operator turns into a ``SamplesRefused`` Warning Event on the node);
the others go to the
``SampleSink``
(``powerflow_ingest_samples_total``). The answer is 200 with
``{"accepted", "refused", "reasons": {reason: count}}`` when at least one
sample was accepted or the batch had none, else 422 with the same body:
a 2xx tells the agent "done, do not resend", a 422 "this will never be
accepted, drop it" (samples of a generation that ended, or of a job deleted,
while they waited in the agent's queue). 401 and 403 are kept for who sent
the batch, which the agent retries: a rotated token or a moving node may
fix it.

A view older than a sample cannot refuse it: the scheduler binds a gang's
pods after the pass that created them, so a sample measuring all the GPUs
its node's workers hold may come before the pass that sees them bound. A
sample the view would refuse as ``not_on_node`` or ``too_many_gpus`` whose
window ended after the view's read began (``ClusterView.read_at_s``) is not
judged: the whole batch gets 503 ``view_behind`` with ``Retry-After`` (one
count of ``powerflow_ingest_refused_total{reason="view_behind"}``) and
nothing of it is taken, so the agent resends it, as it does on any 5xx,
without duplicates; its other samples wait with it. Nothing is held here.
The next pass reads a view newer than the sample, which judges it for good:
accepted once the pods are seen bound, 422 if its generation ended
meanwhile; passes come at least every ``schedulingIntervalSeconds``, so
nothing is retried forever. A window that ends more than ``MAX_AHEAD_S``
past the operator's clock (an agent's clock far ahead) is judged at once (and
refused, ``clock_ahead``), or its batch, and the agent's queue behind it,
would wait as long.
``unknown_job`` is never deferred: a job's pods are created by a pass that
read the job, so a sample of a job the view lacks is of a job deleted. The
comparison trusts the agents' clocks: one behind the operator's by more
than the time from a bind to the sample's end can still see such a sample
refused.

The batch's ``progress`` (each job's most iterations its workers on the sender's
node reported) goes to ``reported_progress`` where ``sample_checks.judge_progress``
finds a worker of that generation on the sender's node; a count that reaches the
job's ``spec.iterations`` is told to ``ControllerLink.on_finished``, which starts a pass (the job
is done once a worker exited or none runs, or after its workers' grace period). The others are
dropped and counted in the answer's ``progressRefused`` (present when the batch had
progress): a job that ended or moved since the post, or workers bound after this
view was read; the agent posts those counts again next round.

``POST contract.GPUS_PATH`` takes a node's GPU report (``powerflow.core.gpu_facts``:
what its agent read through NVML) through the same steps 1 to 4 (``parse_report``'s
bounds in step 4), then: ``report.node`` not the sender's node 403 ``node_mismatch``;
a second report from the node within ``discovered.MIN_INTERVAL_S`` 429 ``too_often``
with ``Retry-After``; GPUs that give no spec (``gpu_facts.node_spec``: several
products, no shared clock, no board limit for a product the catalogue lacks) 422
``implausible``. Those refusals are counted in
``powerflow_ingest_gpu_reports_refused_total{reason}`` (the report's ``invalid``
too); an accepted report's spec goes to ``ControllerLink.discovered``, which the
allocation pass and the physics checks read (and the pass records on the node,
``discovered``), and is answered 200 with the type's name, its clock count and
board limit.

The batch's ``power`` reading (after the node check) updates
``powerflow_cluster_power_watts``: the latest reading of each node summed,
a node left out once its reading is older than ``power_staleness_s``
(default 60 s: an agent reports every few seconds; a node whose agent died
must not count forever).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson
from aiohttp import web
from powerflow.operator import sample_checks
from powerflow.operator.discovered import MIN_INTERVAL_S, DiscoveredGpus
from powerflow.operator.kube import ClusterState
from powerflow.operator.metrics import Metrics
from powerflow.operator.reported_progress import ReportedProgress
from powerflow.operator.tokenreview import (
    Denied,
    ReviewUnavailable,
    Sender,
    TokenReviewer,
    bearer_token,
)

from powerflow.core import contract
from powerflow.core.errors import DataError
from powerflow.core.gpu_facts import GpuFactsError, node_spec, parse_report
from powerflow.core.gpus import GpuSpec
from powerflow.core.telemetry import (
    MAX_BODY_BYTES,
    NodePower,
    SampleBatch,
    TelemetryError,
    WindowSample,
    parse_batch,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_AFTER_S = "1"
MAX_AHEAD_S = 300.0
"""How far past the operator's clock a sample's end may lie and still be deferred."""
SUSPECT = frozenset(sample_checks.REASONS) - {"unknown_job", "not_on_node", "too_many_gpus"}
"""Refusals an honest agent does not earn (a job deleted or rescaled while its samples
queued gives ``unknown_job`` or ``not_on_node``): logged and told (an Event on the node)."""
TOLD_S = 3600.0
"""A sender's refusals for one reason are told again after this long."""
DEFERRABLE = frozenset({"not_on_node", "too_many_gpus"})
"""Refusals a later view may undo: the pods' binds the view has not seen yet."""


class SampleSink(Protocol):
    """Where accepted samples go (the online refit store)."""

    def add(self, node: str, samples: Sequence[WindowSample], now_s: float) -> None: ...


class DiscardSink:
    """Keeps nothing: the default until the refit store is wired in."""

    def add(self, node: str, samples: Sequence[WindowSample], now_s: float) -> None:
        log.debug("%d sample(s) from %s discarded (no sink)", len(samples), node)


@dataclass(frozen=True)
class ClusterView:
    """What the ingest judges samples by: the leader's latest state."""

    state: ClusterState
    leading: bool
    read_at_s: float
    """Unix time when the read of ``state`` began: samples that ended later may
    have measured pods bound after it (module docstring)."""


class ClusterPower:
    """The latest power reading of each node; their sum while fresh."""

    def __init__(self, staleness_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.staleness_s = staleness_s
        self._clock = clock
        self._readings: dict[str, tuple[float, float, float]] = {}
        """node -> (watts, agent's at_s, received at, operator's clock)."""

    def record(self, node: str, power: NodePower) -> None:
        """Keep ``power`` unless a fresh reading measured later is already kept (a retried
        old batch); a stale one always gives way (an agent restarted with its clock set
        back)."""
        now = self._clock()
        old = self._readings.get(node)
        if old is None or power.at_s >= old[1] or now - old[2] > self.staleness_s:
            self._readings[node] = (power.watts, power.at_s, now)

    def total_w(self) -> float:
        now = self._clock()
        for node in [n for n, r in self._readings.items() if now - r[2] > self.staleness_s]:
            del self._readings[node]
        return sum(r[0] for r in self._readings.values())


def _closing(request: web.Request, response: web.Response) -> web.Response:
    """``response``, closing the connection when it was refused before its body was read
    (``start``), and saying so, or the client would send its next request into a closed
    socket."""
    if not request.content.is_eof():
        response.force_close()
    return response


def _answer(status: int, reason: str, message: str, **headers: str) -> web.Response:
    body = orjson.dumps({"error": reason, "message": message})
    return web.Response(
        status=status, body=body, content_type="application/json", headers=headers or None
    )


@dataclass(frozen=True)
class ControllerLink:
    """What the ingest shares with the operator's controller: where the jobs' reported
    progress goes (``progress``, which each pass reads; ``reported_progress``), whom it
    tells a job's key when that progress reaches the job's ``spec.iterations``
    (``on_finished``: a pass starts), and whom it tells ``(sender node, reason, count)``
    with each log line of a ``SUSPECT`` refusal (``on_refused``: a Warning Event on the
    node). Without a controller (a benchmark): a progress of its own, no one told."""

    progress: ReportedProgress = field(default_factory=ReportedProgress)
    on_refused: Callable[[str, str, int], None] | None = None
    on_finished: Callable[[str], None] | None = None
    discovered: DiscoveredGpus = field(default_factory=DiscoveredGpus)


class Ingest:
    """The ``POST /v1/samples`` handler (see the module docstring)."""

    def __init__(
        self,
        reviewer: TokenReviewer,
        view: Callable[[], ClusterView | None],
        sink: SampleSink,
        metrics: Metrics,
        power: ClusterPower,
        clock: Callable[[], float] = time.time,
        controller: ControllerLink | None = None,
    ) -> None:
        self.reviewer = reviewer
        self.controller = controller if controller is not None else ControllerLink()
        self.view = view
        self.sink = sink
        self.metrics = metrics
        self.power = power
        self._clock = clock
        self._index: (
            tuple[ClusterState, sample_checks.Index, dict[str, GpuSpec], dict[tuple[str, str], int]]
            | None
        ) = None
        self.windows = sample_checks.Windows()
        self._unavailable: str | None = None
        self._told: dict[tuple[str, str], float] = {}
        """When each (sender, reason) of ``SUSPECT`` was last logged (once per ``TOLD_S``)."""
        self._senders_seen: set[str] = set()
        """Nodes whose refusal series exist (at 0 from their first batch: a rate over a
        series never exported is no data, and the dashboard would read "No data")."""
        for why in sample_checks.REASONS:
            metrics.ingest_refused.labels(reason=why)
        metrics.cluster_power_watts.set_function(power.total_w)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(contract.SAMPLES_PATH, self.handle, expect_handler=self._expect)
        app.router.add_post(contract.GPUS_PATH, self.handle_gpus, expect_handler=self._expect)
        return app

    async def _expect(self, request: web.Request) -> web.Response | None:
        """``Expect: 100-continue``: a body over the bound gets its 413 instead of the
        go-ahead (aiohttp's default handler would invite the client to send it)."""
        too_large = self._too_large(request)
        if too_large is not None:
            too_large.force_close()
            return too_large
        if request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text="only Expect: 100-continue is understood")
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    def _too_large(self, request: web.Request) -> web.Response | None:
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:
            return self._refuse(413, "body_too_large", f"{length} bytes, at most {MAX_BODY_BYTES}")
        return None

    def _refuse(self, status: int, reason: str, message: str, **headers: str) -> web.Response:
        self.metrics.ingest_refused.labels(reason=reason).inc()
        return _answer(status, reason, message, **headers)

    def _jobs(self, state: ClusterState) -> tuple[sample_checks.Index, dict[str, GpuSpec]]:
        """The view's jobs and nodes' GPU types (discovered ones as of the view's first
        sample), built once per view."""
        if self._index is None or self._index[0] is not state:
            jobs = sample_checks.index(state)
            self._index = (
                state,
                jobs,
                sample_checks.node_gpus(state, self.controller.discovered.specs()),
                sample_checks.totals(state),
            )
            self.windows.keep_only(jobs)
        return self._index[1], self._index[2]

    def _take_progress(self, node: str, batch: SampleBatch, jobs: sample_checks.Index) -> int:
        """Keep each job's progress from ``node`` that ``judge_progress`` believes; a count
        that reaches the job's ``spec.iterations`` starts a pass (``on_finished``): the job
        is done, and its GPUs are free for others. The number refused."""
        refused = 0
        totals = self._index[3] if self._index is not None else {}
        for progress in batch.progress:
            if sample_checks.judge_progress(jobs, node, progress) is not None:
                refused += 1  # a job that ended or moved since the post: the next is current
                continue
            total = totals.get((progress.namespace, progress.job))
            generations = jobs.get((progress.namespace, progress.job), {}).keys()
            self.controller.progress.report(
                progress, total=total, now_s=self._clock(), generations=generations
            )
            finished = self.controller.on_finished
            if total is not None and progress.iterations >= total and finished is not None:
                finished(f"{progress.namespace}/{progress.job}")
        return refused

    def _busy(self, why: str) -> web.Response:
        if why != self._unavailable:  # once per distinct cause, not per request
            self._unavailable = why
            log.warning("ingest answering 503: %s", why)
        return self._refuse(503, "unavailable", why, **{"Retry-After": RETRY_AFTER_S})

    async def handle(self, request: web.Request) -> web.Response:
        return _closing(request, await self._handle(request))

    async def handle_gpus(self, request: web.Request) -> web.Response:
        return _closing(request, await self._handle_gpus(request))

    async def _handle_gpus(self, request: web.Request) -> web.Response:
        """``POST contract.GPUS_PATH``: a node's GPU report (module docstring)."""
        admitted = await self._admit(request, parse_report, GpuFactsError, self._refuse_report)
        if isinstance(admitted, web.Response):
            return admitted
        sender, report = admitted
        if report.node != sender.node:
            return self._refuse_report(
                403, "node_mismatch", f"report for node {report.node} sent from {sender.node}"
            )
        discovered = self.controller.discovered
        if discovered.too_soon(report.node):
            return self._refuse_report(
                429, "too_often", f"one report per {MIN_INTERVAL_S:g} s",
                **{"Retry-After": f"{MIN_INTERVAL_S:.0f}"},
            )  # fmt: skip
        try:
            spec = node_spec(report.gpus)
        except DataError as exc:
            return self._refuse_report(422, "implausible", str(exc)[:300])
        discovered.record(report.node, spec, report)
        self.metrics.gpu_reports.inc()
        body_out = {"gpu": spec.name, "clocks": len(spec.clocks_mhz), "boardW": spec.max_power_w}
        return web.Response(body=orjson.dumps(body_out), content_type="application/json")

    def _refuse_report(
        self, status: int, reason: str, message: str, **headers: str
    ) -> web.Response:
        self.metrics.gpu_reports_refused.labels(reason=reason).inc()
        return _answer(status, reason, message, **headers)

    async def _admit(
        self,
        request: web.Request,
        parse: Callable[[object], T],
        errors: type[Exception],
        refuse: Callable[[int, str, str], web.Response],
    ) -> tuple[Sender, T] | web.Response:
        """Steps 1 to 4 of the module docstring: who sent what, or the refusal (``refuse``
        for a body ``parse`` refuses by raising ``errors``)."""
        too_large = self._too_large(request)
        if too_large is not None:
            return too_large
        try:
            token = bearer_token(request.headers.get("Authorization"))
        except Denied as exc:
            return self._refuse(
                exc.status, exc.reason, exc.message, **{"WWW-Authenticate": "Bearer"}
            )
        view = self.view()
        if view is None:
            return self._busy("no cluster view yet (starting)")
        if not view.leading:
            return self._busy("not the leader: only the leader takes samples")
        try:
            sender = await self.reviewer.sender(token)
        except Denied as exc:
            extra = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
            return self._refuse(exc.status, exc.reason, exc.message, **extra)
        except ReviewUnavailable as exc:
            return self._busy(str(exc))
        body = await self._read(request)
        if isinstance(body, web.Response):
            return body
        try:
            return sender, parse(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            return refuse(400, "invalid", f"body: not JSON ({str(exc)[:120]})")
        except errors as exc:
            return refuse(400, "invalid", str(exc))

    async def _handle(self, request: web.Request) -> web.Response:
        admitted = await self._admit(request, parse_batch, TelemetryError, self._refuse)
        if isinstance(admitted, web.Response):
            return admitted
        sender, batch = admitted
        view = self.view()  # the latest, after the awaits: a pass or the Lease may have moved
        if view is None or not view.leading:
            return self._busy("not the leader: only the leader takes samples")
        if self._unavailable is not None:
            log.info("ingest serving again")
            self._unavailable = None
        return self._accept(sender, batch, view)

    async def _read(self, request: web.Request) -> bytes | web.Response:
        """The body, or the refusal: 413 past ``MAX_BODY_BYTES`` (stops reading there), 400
        for a body that cannot be read (a broken chunk, a ``Content-Encoding`` it is not
        in) or was cut short (the client went away: the answer reaches nobody, but the
        handler ends as usual, where an exception would log a traceback and a 500)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = await request.content.readany()
            except web.RequestPayloadError as exc:
                why = " ".join(str(exc.__cause__ or exc).split())[:120]
                return self._refuse(400, "invalid", f"body: cannot be read ({why})")
            except ConnectionResetError:
                return self._refuse(400, "invalid", "body: the client went away before its end")
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return self._refuse(413, "body_too_large", f"body over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)

    def _accept(self, sender: Sender, batch: SampleBatch, view: ClusterView) -> web.Response:
        node, samples, power = batch.node, batch.samples, batch.power
        if node != sender.node:
            return self._refuse(
                403, "node_mismatch", f"batch for node {node} sent from node {sender.node}"
            )
        if power is not None:
            self.power.record(node, power)
        if node not in self._senders_seen:  # its refusal series exist from its first batch
            self._senders_seen.add(node)
            for each in sample_checks.REASONS:
                self.metrics.ingest_sender_refused.labels(sender_node=node, reason=each)
        jobs, gpus = self._jobs(view.state)
        gpu = gpus.get(node)
        accepted: list[WindowSample] = []
        reasons: Counter[str] = Counter()
        latest_s = self._clock() + MAX_AHEAD_S
        behind = 0
        windows = self.windows.batch()
        for sample in samples:
            why = sample_checks.judge(jobs, node, gpu, sample)
            if why is None:
                why = windows.check(node, sample, latest_s)
            if why is None:
                windows.take(node, sample)
                accepted.append(sample)
            else:
                reasons[why] += 1
                behind += why in DEFERRABLE and view.read_at_s < sample.end_s <= latest_s
        if behind:
            return self._refuse(
                503,
                "view_behind",
                f"{behind} sample(s) ended after the cluster view was read; resend after "
                "the next allocation pass",
                **{"Retry-After": RETRY_AFTER_S},
            )
        self.windows.commit(windows)
        progress_refused = self._take_progress(node, batch, jobs)
        for why, count in reasons.items():
            self.metrics.ingest_refused.labels(reason=why).inc(count)
            self.metrics.ingest_sender_refused.labels(sender_node=node, reason=why).inc(count)
            told = self._told.get((node, why))
            if why in SUSPECT and (told is None or self._clock() - told > TOLD_S):
                self._told[(node, why)] = self._clock()
                log.warning("node %s: %d sample(s) refused: %s", node, count, why)
                if self.controller.on_refused is not None:
                    self.controller.on_refused(node, why, count)
        if accepted:
            self.sink.add(node, accepted, self._clock())
            self.metrics.ingest_samples.inc(len(accepted))
        body: dict[str, Any] = {
            "accepted": len(accepted),
            "refused": len(samples) - len(accepted),
            "reasons": dict(reasons),
        }
        if batch.progress:
            body["progressRefused"] = progress_refused
        status = 422 if samples and not accepted else 200
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


@dataclass(frozen=True)
class IngestServer:
    """The running server; ``stop()`` closes it."""

    runner: web.AppRunner
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """HTTPS when a certificate is given (``OSError``/``ssl.SSLError`` if unusable)."""
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key or None)
    return context


async def start(
    ingest: Ingest, host: str, port: int, context: ssl.SSLContext | None
) -> IngestServer:
    """Listen on ``host:port`` (``port`` 0: any free one, as tests use).

    ``lingering_time=0``: a request refused before its body was read closes
    the connection instead of aiohttp draining the rest of the body.
    """
    runner = web.AppRunner(ingest.app(), access_log=None, lingering_time=0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    server = site._server
    sockets = getattr(server, "sockets", None) or ()
    bound = sockets[0].getsockname()[1] if sockets else port
    scheme = "https" if context else "http"
    log.info("ingest on %s://%s:%d%s", scheme, host, bound, contract.SAMPLES_PATH)
    return IngestServer(runner, int(bound))
