"""A node agent killed on the twin, then the power budget changed, in one run: one node
of 8 GPUs, two jobs of the default trace training, one twin boot.

The agent runs as a process of its own (``powerflow.lab.twin.agentproc``), so a
SIGKILL is a kill: nothing of it runs. Checked:

- SIGKILL: no GPU setting changes until a new agent starts (the GPUs keep the
  clocks it locked: the driver's journal, ``GpuServer.journal``); SIGTERM: the
  agent's own handler resets every GPU before it exits;
- each restart: the new agent resets every GPU to its defaults before it sets
  anything, then locks the clocks the operator wants (the pods' annotations);
- samples resume after each restart, none is sent twice, no two windows of one
  job on the node overlap in time (a restarted agent has no memory of the old
  one's queue or windows), the samples' iterations and joules add up to no more
  than the job trained and the GPUs drew (the ground truth), and the operator
  counts no more samples for a job than were posted for it: a recording relay
  between the agent and the operator's ingest sees every batch and the
  operator's answer;
- then, with the restarted agent, the admin lowers the budget ConfigMap's ``eta``
  (1 -> 0.4) while the jobs draw more than the lower limit, and raises it back: the
  GPUs' own power (the twin's ground truth, every GPU of the node, idle ones
  included, as the budget counts them: ``eta x GPUs x P_max``), read every 0.1 s and
  judged by its one-second means (``support.twin_budget``), is at most the new limit
  within one scheduling interval and stays there; after the raise the jobs grow (the
  power goes above the old, lower limit) and it is never above the new one;
- the jobs complete, no progress goes back, no iteration is lost.

Plus the relay and the journal on their own (the checks can fail).
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from support.twin_budget import TOLERANCE, PowerLog, describe, limit_w, set_eta, settled_after
from support.twin_checks import POD_NAME, ProgressLog, bad_resumes, eventually, job_progress

from powerflow.core import contract
from powerflow.core.devices import GpuInvalidArgument
from powerflow.core.telemetry import WindowSample, parse_batch
from powerflow.lab.twin.agentproc import GpuServer, Setting, connect
from powerflow.lab.twin.components import Agent, free_port
from powerflow.lab.twin.gpus import TwinGpus
from powerflow.lab.twin.harness import Timing, Twin
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import NAMESPACE, mini_trace

SEED = 16
NODE = "node-0"
GPUS = 8
SCALE = TimeScale(0.035)
"""Longer jobs than the other fault tests' 0.02: each fault needs workers training for a
while, and the budget's phases an interval each."""
HIGH, LOW = 1.0, 0.4
TIMING = Timing(interval_s=200.0)
"""A scheduling interval of 200 s at full size (7 s at ``SCALE``): the budget's change
takes effect at the pass its edit triggers, not at the interval's end, so a shorter
interval asks the same of the operator (power under the new limit within one interval,
and under it for more than an interval after) in a third of the real time of the
simulator's 600 s."""
Obj = dict[str, Any]


@dataclass(frozen=True)
class Posted:
    """One batch an agent posted: its samples, the ingest's status and answer."""

    at_s: float
    node: str
    samples: tuple[WindowSample, ...]
    status: int
    answer: Obj


@dataclass
class Relay:
    """An HTTP relay from the agents to the operator's ingest that records each batch
    (the wire between them, observed: it forwards the request as it came, headers and
    body, and the answer as it came)."""

    upstream: str
    posted: list[Posted] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with aiohttp.ClientSession() as session:

            async def relay(request: web.Request) -> web.Response:
                body = await request.read()
                keep = ("Authorization", "Content-Type", "Content-Encoding")
                headers = {k: v for k, v in request.headers.items() if k in keep}
                async with session.post(
                    self.upstream + request.path, data=body, headers=headers
                ) as answer:
                    raw = await answer.read()
                    status, kind = answer.status, answer.content_type
                try:
                    plain = gzip.decompress(body) if "Content-Encoding" in headers else body
                    batch = parse_batch(orjson.loads(plain))
                    reply = orjson.loads(raw) if raw else {}
                    self.posted.append(
                        Posted(time.monotonic(), batch.node, batch.samples, status, reply)
                    )
                except Exception as exc:  # recorded as a failure of the test, not hidden
                    self.posted.append(Posted(time.monotonic(), f"unreadable: {exc}", (), 0, {}))
                return web.Response(status=status, body=raw, content_type=kind)

            app = web.Application()
            app.router.add_post(contract.SAMPLES_PATH, relay)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def _through(agent: Agent, url: str) -> None:
    """Point ``agent``'s ``--ingest-url`` at ``url`` (for its next start)."""
    args = agent.process.args
    args[args.index("--ingest-url") + 1] = url


def _clocks(journal: list[Setting], node: str, upto: int | None = None) -> dict[int, Any]:
    """Each GPU's clock setting after the first ``upto`` journal entries: ``(lo, hi)``
    locked, None at its default."""
    out: dict[int, Any] = {}
    for s in journal[:upto]:
        if s.node == node and s.call == "lock_clocks_mhz":
            out[s.gpu] = tuple(s.args)
        elif s.node == node and s.call == "reset_clocks":
            out[s.gpu] = None
    return out


def _all_reset(entries: list[Setting], gpus: int, which: str) -> str | None:
    """Why ``entries`` are not a reset of every GPU's clocks and power limit, or None."""
    want = {(g, c) for g in range(gpus) for c in ("reset_clocks", "reset_power_limit")}
    got = {(s.gpu, s.call) for s in entries}
    return None if got == want else f"{which} settings {[(s.gpu, s.call) for s in entries]}"


def _starts_with_defaults(entries: list[Setting], gpus: int) -> str | None:
    """Why ``entries`` (a new agent's settings) do not begin by resetting every GPU's
    clocks and power limit, or None."""
    return _all_reset(entries[: 2 * gpus], gpus, "first")


def _ends_with_defaults(entries: list[Setting], gpus: int) -> str | None:
    """Why ``entries`` (a stopped agent's settings) do not end by resetting every GPU's
    clocks and power limit, or None. A pass under way at the SIGTERM ends first (the
    loop stops between passes), so its settings may come before the resets (a CI run
    had it lock all eight clocks there); none may come after them."""
    return _all_reset(entries[-2 * gpus :], gpus, "last")


def _pods(twin: Twin) -> dict[str, Obj]:
    assert twin.client is not None
    items = twin.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
    return {p["metadata"]["name"]: p for p in items}


def _desired(pod: Obj) -> tuple[int, int] | str | None:
    """The clock the operator wants for ``pod`` (its ``frequency-mhz``), None for the
    default, ``"sweep"`` while a profiling sweep picks the clock."""
    annotations = pod["metadata"].get("annotations") or {}
    if contract.PROFILE_ANNOTATION in annotations:
        return "sweep"
    raw = annotations.get(contract.FREQUENCY_ANNOTATION)
    return None if raw is None else (int(raw), int(raw))


def _settled(twin: Twin, since: int) -> Callable[[], bool]:
    """True once, after journal entry ``since``, the node's GPUs carry the clock the
    operator wants for each training worker (a sweeping one: a clock locked since),
    with at least one such worker."""

    def check() -> bool:
        assert twin.kubelet is not None and twin.gpu_server is not None
        journal = list(twin.gpu_server.journal)
        if not any(s.call == "lock_clocks_mhz" for s in journal[since:]):
            return False
        clocks = _clocks(journal, NODE)
        pods = _pods(twin)
        checked = 0
        for w in list(twin.kubelet.workers.values()):
            pod = pods.get(w.pod)
            if pod is None or w.finished or time.monotonic() < w.train_from_s:
                continue
            want = _desired(pod)
            if want == "sweep":  # the agent steps the clock: any clock it locked since
                swept = any(
                    s.gpu == w.gpu and s.node == NODE and s.call == "lock_clocks_mhz"
                    for s in journal[since:]
                )
                if not swept:
                    return False
            elif clocks.get(w.gpu) != want:
                return False
            checked += 1
        return checked > 0

    return check


def _training(twin: Twin) -> bool:
    """A worker trains, and the agent locked a clock on its GPU since it started."""
    assert twin.kubelet is not None and twin.gpu_server is not None
    now = time.monotonic()
    for w in list(twin.kubelet.workers.values()):
        if w.finished or now < w.train_from_s + 1.0:
            continue
        if any(
            s.gpu == w.gpu and s.call == "lock_clocks_mhz" and s.at_s >= w.started_s
            for s in list(twin.gpu_server.journal)
        ):
            return True
    return False


def _model_samples(twin: Twin) -> dict[str, int]:
    assert twin.client is not None
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NAMESPACE}/{contract.PLURAL}"
    items = twin.client.get(path).json()["items"]
    return {
        i["metadata"]["name"]: int(
            (((i.get("status") or {}).get("model") or {}).get("samples")) or 0
        )
        for i in items
    }


def _overlaps(posted: list[Posted], slack_s: float = 0.05) -> list[str]:
    """Samples sent twice, and windows of one (node, job, generation) that overlap.

    A window's span is estimated as its iterations times its mean step time, back from
    its end. An iteration under way at a window's edge counts in the window it ends
    in, so a span may reach back up to one step into the window before (a loaded CI
    run: 0.13 s, one vgg16 step): that much, plus ``slack_s``, is no overlap; a
    window counted twice overlaps by its whole span."""
    wrong: list[str] = []
    windows: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}
    seen: set[tuple[str, WindowSample]] = set()
    for batch in posted:
        for s in batch.samples:
            if (batch.node, s) in seen:
                wrong.append(f"sent twice: {s}")
            seen.add((batch.node, s))
            key = (batch.node, s.job, s.generation)
            start = s.end_s - s.step_time_s * s.iterations
            windows.setdefault(key, []).append((start, s.end_s, s.step_time_s))
    for key, spans in windows.items():
        spans.sort(key=lambda span: span[1])
        for (_, end, _), (start, later, step) in itertools.pairwise(spans):
            if start < end - step - slack_s:
                wrong.append(f"{key}: window {start:.3f}-{later:.3f} overlaps one ending {end:.3f}")
    return wrong


@pytest.mark.timeout(900)
def test_agent_killed_and_stopped_then_the_budget_lowered_and_raised_in_one_run(
    tmp_path: Path,
) -> None:
    """SIGKILL then SIGTERM of the node's agent while its workers train, each followed by
    a new agent; then eta 1 -> 0.4 while the jobs draw more than 0.4's limit, and back to
    1 an interval and 10 s later (module docstring)."""
    jobs = mini_trace(2, SCALE, max_duration_s=3000)
    interval = SCALE(TIMING.interval_s)
    low, high = limit_w(LOW, GPUS), limit_w(HIGH, GPUS)
    lowered = raised = grown = 0.0
    faults: list[tuple[str, int, int]] = []
    """(signal, journal length when it was sent, journal length at the new start)."""
    with Twin(
        tmp_path, nodes=1, gpus_per_node=GPUS, scale=SCALE, eta=HIGH, seed=SEED, timing=TIMING
    ) as twin:
        assert twin.gpu_server is not None and twin.kubelet is not None
        agent = twin.agents[NODE]
        journal = twin.gpu_server.journal
        ingest = agent.process.args[agent.process.args.index("--ingest-url") + 1]
        relay = Relay(ingest)
        # The agent posts through the relay: restarted once before the trace (SIGTERM).
        agent.stop()
        _through(agent, relay.url)
        agent.start()
        progress = ProgressLog(twin)
        power = PowerLog(twin)
        restarts: list[float] = []
        with ThreadPoolExecutor(1) as pool:
            # The agents are children of this thread (PR_SET_PDEATHSIG): faults from here.
            running = pool.submit(twin.run, jobs, timeout_s=600)
            began = time.monotonic()
            try:
                for sig in (signal.SIGKILL, signal.SIGTERM):
                    assert eventually(lambda: _training(twin) or running.done(), 300)
                    assert not running.done(), "the trace ended before the fault"
                    sent = len(journal)
                    locked = _clocks(journal, NODE)
                    if sig == signal.SIGKILL:
                        agent.kill()
                    else:
                        agent.stop()
                    assert agent.process.proc is not None
                    assert agent.process.proc.returncode is not None
                    time.sleep(2.0)  # no agent: the workers train on, their reports refused
                    after = len(journal)
                    if sig == signal.SIGKILL:  # nothing ran: every clock as it was
                        assert after == sent, f"settings after SIGKILL: {journal[sent:after]}"
                        assert _clocks(journal, NODE) == locked
                    else:  # its handler reset every GPU, after any pass under way
                        problem = _ends_with_defaults(journal[sent:after], GPUS)
                        assert problem is None, f"on SIGTERM: {problem}"
                        assert set(_clocks(journal, NODE).values()) == {None}
                    agent.start()
                    restarts.append(time.monotonic())
                    faults.append((signal.Signals(sig).name, sent, after))
                    assert eventually(_settled(twin, after), 60), (
                        f"clocks not back to the operator's after {signal.Signals(sig).name}"
                    )
                # The budget, with the agent started last.
                busy = eventually(lambda: running.done() or power.recent() > low * 1.1, 300)
                assert busy and not running.done(), "the jobs never drew more than the low limit"
                lowered = time.monotonic()
                set_eta(twin, LOW)
                time.sleep(interval + 10.0)
                raised = time.monotonic()
                set_eta(twin, HIGH)
                assert not running.done(), "the trace ended while the budget was low"
                time.sleep(interval)
                eventually(lambda: running.done() or power.recent() > low * 1.05, 6 * interval)
                grown = time.monotonic()
                result = running.result()
                ended = time.monotonic()
            finally:
                power.close()
                progress.close()
                relay.close()
                print(describe(power, low, high, lowered, raised, grown or time.monotonic()))
        final = job_progress(twin)
        stats = twin.kubelet.stats
        samples = _model_samples(twin)
        events = list(twin.kubelet.stats.events)
        resumes = bad_resumes(twin)
    posted = relay.posted
    restarted = ", ".join(f"{at - began:.0f}" for at in restarts)
    print(
        f"faults {[f[0] for f in faults]}, journal {len(journal)} settings, "
        f"batches {len(posted)}, samples {sum(len(b.samples) for b in posted)} of "
        f"{sum(s.energy_j * s.iterations for b in posted for s in b.samples):.0f} J "
        f"(the GPUs' active energy {result.active_energy_j:.0f} J), "
        f"operator's counts {samples}, workers started {stats.started}; into the run: "
        f"agent restarted at {restarted} s, budget lowered at {lowered - began:.0f} s, "
        f"raised at {raised - began:.0f} s, run {ended - began:.0f} s"
    )
    assert [j.phase for j in result.jobs] == ["Succeeded"] * len(jobs)
    assert [f[0] for f in faults] == ["SIGKILL", "SIGTERM"]
    for _, _, start in faults:  # each new agent: defaults first
        assert _starts_with_defaults(journal[start:], GPUS) is None
    assert all(b.status for b in posted), [b.node for b in posted if not b.status]
    for at in restarts:  # samples resume after each restart
        assert any(b.at_s > at and b.samples and b.status == 200 for b in posted)
    assert _overlaps(posted) == []
    by_job: dict[str, int] = {}
    for b in posted:
        if 200 <= b.status < 300:
            for s in b.samples:
                by_job[s.job] = by_job.get(s.job, 0) + 1
    # What the samples carry adds up to no more than the ground truth: each iteration
    # and each joule in one window at most.
    joules = sum(s.energy_j * s.iterations for b in posted for s in b.samples)
    assert 0 < joules <= result.active_energy_j, (joules, result.active_energy_j)
    for job in jobs:
        trained = sum(s.iterations for b in posted for s in b.samples if s.job == job.name)
        assert 0 < trained <= job.job.iterations, (job.name, trained)
        assert 0 < samples[job.name] <= by_job.get(job.name, 0), (job.name, samples, by_job)
        seen = progress.seen.get(job.name, [])
        assert seen == sorted(seen), f"{job.name}'s progress went back: {seen}"
        assert final[job.name] == job.job.iterations
    assert stats.lost_iterations == 0
    assert resumes == []
    assert any(POD_NAME.match(pod) for _, pod, _ in events)
    # The budget: under the lowered limit within one interval and from then on until the
    # raise; after it, above the old limit (the jobs grew) and never above the new one.
    settle_low = settled_after(power, lowered, raised, low)
    assert max(power.between(lowered - 5.0, lowered)) > low * 1.05, "the lower budget bound nothing"
    assert settle_low is not None and settle_low <= interval
    over = [w for w in power.between(lowered + interval, raised) if w > low * (1 + TOLERANCE)]
    assert over == []
    assert settled_after(power, raised, ended, high) == 0.0, (
        "above the raised limit after the raise"
    )
    assert max(power.between(raised, grown)) > low * 1.05, "the jobs did not grow when raised"


def test_the_journal_and_the_relay_see_what_they_check(tmp_path: Path) -> None:
    """The GPU server journals a setting made through an agent's proxy (and not a refused
    one, whose error reaches the caller), and stopping it leaves ``sys.stdout`` alone;
    ``_overlaps`` finds a sample sent twice and two windows that overlap;
    ``_starts_with_defaults`` refuses an agent that locks first, ``_ends_with_defaults``
    one that locks after its resets."""
    gpus = TwinGpus(2, node="n", seed=0, clock=time.monotonic)
    server = GpuServer({"n": gpus}, tmp_path / "key").start()
    try:
        remote = connect(server.address, (tmp_path / "key").read_bytes(), "n")
        remote.lock_clocks_mhz(1, 900, 900)
        assert gpus.sm_clock_mhz(1) == 900
        with pytest.raises(GpuInvalidArgument):
            remote.lock_clocks_mhz(0, 1, 0)
        assert [(s.gpu, s.call, s.args) for s in server.journal] == [
            (1, "lock_clocks_mhz", (900, 900))
        ]
        assert _clocks(server.journal, "n") == {1: (900, 900)}
        assert _starts_with_defaults(server.journal, 2) is not None
        remote.reset_clocks(1)
        assert _clocks(server.journal, "n") == {1: None}
        remote.reset_power_limit(1)
        remote.reset_clocks(0)
        remote.reset_power_limit(0)
        assert _ends_with_defaults(server.journal, 2) is None  # a lock, then every reset
        remote.lock_clocks_mhz(0, 900, 900)
        assert _ends_with_defaults(server.journal, 2) is not None  # a lock after them
    finally:
        out, err = sys.stdout, sys.stderr
        server.stop()
    # Stopping leaves this process's output alone (``Server.serve_forever`` resets it).
    assert (sys.stdout, sys.stderr) == (out, err)
    s = WindowSample("ml", "j", 1, 1, 1, 32.0, 1410, 1, 10, 0.5, 100.0, 1000.0)
    later = WindowSample("ml", "j", 1, 1, 1, 32.0, 1410, 1, 10, 0.5, 100.0, 1004.0)
    after = WindowSample("ml", "j", 1, 1, 1, 32.0, 1410, 1, 10, 0.5, 100.0, 1005.0)
    assert _overlaps([Posted(0, "n", (s, after), 200, {})]) == []
    assert len(_overlaps([Posted(0, "n", (s, later), 200, {})])) == 1
    assert len(_overlaps([Posted(0, "n", (s,), 200, {}), Posted(1, "n", (s,), 200, {})])) == 2
