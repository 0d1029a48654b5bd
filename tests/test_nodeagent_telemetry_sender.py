"""The sample sender against a real local HTTP server playing the operator's ingest.

The server parses every batch with the operator's own parser
(``powerflow.core.telemetry.parse_batch``) and answers what a test scripts: the
sender must deliver every queued sample exactly once and in order through
failures, drop only a batch the operator refuses for good, and count drops.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from powerflow.nodeagent.agent import gpu_limits, gpu_report
from powerflow.nodeagent.sender import Backoff, Batching, IngestConnection, SampleSender
from prometheus_client import CollectorRegistry

from powerflow.core import contract
from powerflow.core.gpu_facts import GpuReport, encode_report, node_spec, parse_report
from powerflow.core.gpus import GPU_SPECS
from powerflow.core.telemetry import JobProgress, NodePower, SampleBatch, WindowSample, parse_batch
from powerflow.lab.simulated_gpus import SimulatedGpus
from powerflow.lab.twin.ports import free_port

NODE = "node-a"
Handler = Callable[[web.Request], Awaitable[web.Response]]


def sample(i: int) -> WindowSample:
    return WindowSample("ml", "job", 1, 4, 2, 64.0, 1200, 2, 10 + i, 0.2, 150.0, 1e9 + i)


class Ingest:
    """The operator's side: records accepted batches; ``script`` decides answers."""

    def __init__(self, script: Callable[[int], web.Response | None] | None = None) -> None:
        self.script = script or (lambda _: None)
        self.batches: list[SampleBatch] = []
        self.tokens: list[str | None] = []
        self.posts = 0
        self.changed = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.posts += 1
        self.tokens.append(request.headers.get("Authorization"))
        self.changed.set()
        answer = self.script(self.posts)
        if answer is not None:
            return answer
        self.batches.append(parse_batch(await request.json()))
        return web.Response(status=202)

    def samples(self) -> list[WindowSample]:
        return [s for b in self.batches for s in b.samples]

    async def wait(self, done: Callable[[], bool]) -> None:
        async def loop() -> None:
            while not done():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(loop(), 20)


@asynccontextmanager
async def serve(
    ingest: Ingest, port: int, more: Mapping[str, Handler] | None = None
) -> AsyncIterator[str]:
    """The ingest on ``port``; ``more``: other paths' handlers (none: 404 there, as an
    operator that predates them answers)."""
    app = web.Application()
    app.router.add_post(contract.SAMPLES_PATH, ingest.handle)
    for path, handler in (more or {}).items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def make_sender(
    url: str,
    token: Path | None,
    *,
    queue_max: int = 100,
    batch_max: int = 7,
    interval_s: float = 0.01,
) -> SampleSender:
    return SampleSender(
        IngestConnection(url, str(token) if token else None),
        NODE,
        batching=Batching(queue_max, batch_max, interval_s),
        backoff=Backoff(initial_s=0.01, max_s=0.05),
        registry=CollectorRegistry(),
        rng=random.Random(1),
    )


@asynccontextmanager
async def running(sender: SampleSender) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(sender.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


def dropped(sender: SampleSender, reason: str) -> float:
    return sender.dropped.labels(reason)._value.get()


async def test_batches_arrive_in_order_with_the_current_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    ingest = Ingest()
    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, token)
        for i in range(20):
            sender.put(sample(i))
        async with running(sender):
            await ingest.wait(lambda: len(ingest.samples()) == 20)
            token.write_text("rotated")  # the kubelet rotates the projected token
            sender.put(sample(20))
            await ingest.wait(lambda: len(ingest.samples()) == 21)
    assert ingest.samples() == [sample(i) for i in range(21)]
    assert all(len(b.samples) <= 7 and b.node == NODE for b in ingest.batches)
    assert ingest.tokens[0] == "Bearer first"
    assert ingest.tokens[-1] == "Bearer rotated"
    assert sender.sent._value.get() == 21
    assert sender.queued() == ()


async def test_failures_that_may_pass_are_retried_without_losing_samples(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    answers = {
        1: web.Response(status=503),
        2: web.Response(status=401, text="token not valid yet"),
        3: web.Response(status=403),
        4: web.Response(status=429, headers={"Retry-After": "0"}),
        5: web.Response(status=500),
    }
    ingest = Ingest(lambda n: answers.get(n))
    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, token)
        for i in range(10):
            sender.put(sample(i))
        async with running(sender):
            await ingest.wait(lambda: len(ingest.samples()) == 10)
    assert ingest.samples() == [sample(i) for i in range(10)]
    assert sender.post_failures._value.get() == 5
    assert dropped(sender, "rejected") == dropped(sender, "queue_full") == 0


@pytest.mark.parametrize(
    "refusal",
    [
        (400, "samples[0].n: bad"),
        # The operator's answer when every sample was refused (e.g. a generation that
        # ended while they were queued): resending never helps, and must not block
        # the samples behind them.
        (422, '{"accepted": 0, "refused": 4, "reasons": {"not_on_node": 4}}'),
    ],
)
async def test_a_batch_the_operator_refuses_is_dropped_and_counted(
    refusal: tuple[int, str],
) -> None:
    status, text = refusal
    ingest = Ingest(lambda n: web.Response(status=status, text=text) if n == 1 else None)
    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, None, batch_max=4)
        for i in range(10):
            sender.put(sample(i))
        async with running(sender):
            await ingest.wait(lambda: len(ingest.samples()) == 6)
    assert ingest.samples() == [sample(i) for i in range(4, 10)]
    assert dropped(sender, "rejected") == 4
    assert ingest.tokens[0] is None  # no token file configured: no header


async def test_a_full_queue_drops_new_samples_and_counts_them() -> None:
    sender = make_sender("http://127.0.0.1:9", None, queue_max=5)
    for i in range(8):
        sender.put(sample(i))  # never blocks
    assert sender.queued() == tuple(sample(i) for i in range(5))
    assert dropped(sender, "queue_full") == 3


async def test_samples_wait_for_an_operator_that_is_not_up_yet() -> None:
    port = free_port()
    sender = make_sender(f"http://127.0.0.1:{port}", None)
    for i in range(3):
        sender.put(sample(i))
    async with running(sender):
        while sender.failures < 3:  # connection refused, backing off
            await asyncio.sleep(0.01)
        assert sender.queued() == tuple(sample(i) for i in range(3))
        ingest = Ingest()
        async with serve(ingest, port):
            await ingest.wait(lambda: len(ingest.samples()) == 3)
    assert ingest.samples() == [sample(i) for i in range(3)]
    assert sender.failures == 0


async def test_an_unreadable_token_file_keeps_the_samples(tmp_path: Path) -> None:
    ingest = Ingest()
    token = tmp_path / "missing"
    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, token)
        sender.put(sample(0))
        async with running(sender):
            while sender.failures < 2:
                await asyncio.sleep(0.01)
            assert ingest.posts == 0
            token.write_text("late")
            await ingest.wait(lambda: len(ingest.samples()) == 1)
    assert ingest.tokens == ["Bearer late"]


async def test_power_rides_along_and_is_sent_alone_too() -> None:
    ingest = Ingest()
    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, None)
        sender.set_power(NodePower(1234.5, 1e9))
        async with running(sender):
            await ingest.wait(lambda: len(ingest.batches) == 1)
            sender.put(sample(0))
            sender.set_power(NodePower(99.0, 1e9 + 1))
            await ingest.wait(lambda: len(ingest.batches) == 2)
    assert ingest.batches[0] == SampleBatch(NODE, (), NodePower(1234.5, 1e9))
    assert ingest.batches[1] == SampleBatch(NODE, (sample(0),), NodePower(99.0, 1e9 + 1))


async def test_progress_rides_along_and_a_change_is_posted_alone() -> None:
    """The jobs' progress is state: the latest counts go with each post, and a change
    since the last post the operator took is posted even with nothing else to send."""
    ingest = Ingest()
    progress = [(JobProgress("ml", "job", 1, 10),)]
    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, None)
        sender.progress_of = lambda: progress[0]
        async with running(sender):
            await ingest.wait(lambda: len(ingest.batches) == 1)
            sender.put(sample(0))
            await ingest.wait(lambda: len(ingest.batches) == 2)
            progress[0] = (JobProgress("ml", "job", 1, 25),)
            await ingest.wait(lambda: len(ingest.batches) == 3)
            await asyncio.sleep(0.3)  # nothing new: nothing posted
    assert ingest.batches == [
        SampleBatch(NODE, (), None, (JobProgress("ml", "job", 1, 10),)),
        SampleBatch(NODE, (sample(0),), None, (JobProgress("ml", "job", 1, 10),)),
        SampleBatch(NODE, (), None, (JobProgress("ml", "job", 1, 25),)),
    ]


async def test_progress_that_changes_all_the_time_is_posted_once_a_round() -> None:
    """Workers report ten times a second, so the counts change during every post: one
    post per round (``interval_s``), not a post per change."""
    ingest = Ingest()
    count = [0]

    def moving() -> tuple[JobProgress, ...]:
        count[0] += 1
        return (JobProgress("ml", "job", 1, count[0]),)

    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, None, interval_s=0.2)
        sender.progress_of = moving
        async with running(sender):
            await asyncio.sleep(1.0)
    assert 2 <= ingest.posts <= 7, ingest.posts


async def test_progress_the_ingest_did_not_take_is_posted_again() -> None:
    """A 2xx whose ``progressRefused`` is not 0 (the operator's view is behind the job's
    workers): the same counts go again next round, though they did not change."""
    refused = web.json_response({"accepted": 0, "refused": 0, "progressRefused": 1})
    ingest = Ingest(lambda post: refused if post == 1 else None)
    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, None, interval_s=0.05)
        sender.progress_of = lambda: (JobProgress("ml", "job", 1, 1000),)
        async with running(sender):
            await ingest.wait(lambda: len(ingest.batches) == 1)
            await asyncio.sleep(0.3)  # taken now: not posted again
    assert ingest.posts == 2
    assert ingest.batches == [SampleBatch(NODE, (), None, (JobProgress("ml", "job", 1, 1000),))]


async def test_stop_delivers_what_is_queued_once_more() -> None:
    ingest = Ingest()
    async with serve(ingest, free_port()) as url:
        sender = make_sender(url, None, interval_s=3600.0)
        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        await asyncio.sleep(0)
        sender.put(sample(0))
        stop.set()
        await asyncio.wait_for(task, 20)
    assert ingest.samples() == [sample(0)]


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    rng = random.Random(3)
    for failures in range(1, 80):
        d = Backoff(initial_s=0.5, max_s=30.0).pause_s(failures, rng)
        base = min(30.0, 0.5 * 2 ** (failures - 1))
        assert 0.5 * base <= d <= base


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="batch_max"):
        Batching(batch_max=5000)
    with pytest.raises(ValueError, match="queue_max"):
        Batching(queue_max=0)


def simulated_report() -> GpuReport:
    """What ``gpu_report`` makes of two simulated H100s, as the agent reads them."""
    gpus = SimulatedGpus(2, gpu=GPU_SPECS["H100-SXM"], node=NODE)
    infos = gpus.gpus()
    report = gpu_report(NODE, infos, gpu_limits(gpus, infos))
    assert report is not None
    return report


def test_the_report_carries_what_nvml_says_of_each_gpu() -> None:
    report = simulated_report()
    h100 = GPU_SPECS["H100-SXM"]
    assert [g.index for g in report.gpus] == [0, 1]
    for facts in report.gpus:
        assert facts.clocks_mhz == h100.clocks_mhz
        assert (facts.min_limit_w, facts.default_limit_w, facts.max_limit_w) == (
            h100.min_power_limit_w, h100.max_power_w, h100.max_power_w,
        )  # fmt: skip
    assert parse_report(encode_report(report)) == report  # what the operator parses
    assert node_spec(report.gpus) == h100  # NVML's facts are the catalogue's here


async def test_the_gpu_report_goes_at_start_and_again_after_its_interval() -> None:
    ingest, reports = Ingest(), []

    async def take(request: web.Request) -> web.Response:
        reports.append(parse_report(await request.json()))
        ingest.changed.set()
        return web.Response(status=200)

    async with serve(ingest, free_port(), {contract.GPUS_PATH: take}) as url:
        sender = make_sender(url, None)
        sender.batching = Batching(100, 7, 0.01, report_interval_s=0.2)
        sender.gpu_report = simulated_report()
        sender.put(sample(0))
        async with running(sender):
            await ingest.wait(lambda: len(reports) >= 2 and len(ingest.samples()) == 1)
    assert reports[0] == sender.gpu_report


async def test_an_operator_that_predates_gpu_reports_still_takes_every_sample() -> None:
    """An operator without ``contract.GPUS_PATH`` answers 404: the report counts as
    delivered until its interval (no retry storm), and the samples go as before."""
    ingest, refused = Ingest(), []

    async def old(request: web.Request) -> web.Response:
        refused.append(request.path)
        return web.Response(status=404)

    async with serve(ingest, free_port(), {contract.GPUS_PATH: old}) as url:
        sender = make_sender(url, None)
        sender.gpu_report = simulated_report()
        for i in range(10):
            sender.put(sample(i))
        async with running(sender):
            await ingest.wait(lambda: len(ingest.samples()) == 10)
            sender.put(sample(10))
            await ingest.wait(lambda: len(ingest.samples()) == 11)
    assert ingest.samples() == [sample(i) for i in range(11)]
    assert refused == [contract.GPUS_PATH]  # once: the next is 300 s away
