"""The agent's telemetry half: iteration reports -> sweeps, windows, samples.

``Telemetry`` is what the worker endpoint's handler calls
(``worker_app(telemetry.report)``) and what the control loop asks which
clock a profiling job runs now (``clock_for``). The control loop calls
``sync`` after every change of the node's pods or of the pod -> GPU mapping;
``report`` then accepts reports only from the PowerFlow pods it was told of,
with the UID the downward API gave the worker, so nothing else on the node
can feed samples or step clocks.

A job's boundaries are those of its lowest-index worker on this node that
reports (its *lead*): data-parallel workers move in lock-step, and one
reporter keeps windows and sweep steps from jittering between workers. Only
the lead's reports read energy counters (one NVML call per GPU of the job
here), so ``report`` stays cheap for the others.

Clocks: a window is tagged with the clock the control loop locked on the
job's GPUs (``locked_clock_of``; an unlocked GPU counts at its highest
supported clock, where it boosts to), read at each boundary, so a clock
changed between two boundaries discards the window that straddles it. A
sweep step happens at a boundary: the window up to it closes at the old
clock, ``on_clock_change`` tells the control loop, and the next window
starts with whatever clock is locked once that call returns.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from powerflow.nodeagent.iterations import IterationReport, Refusal, UnknownPod
from powerflow.nodeagent.pods import PodKey, PodView
from powerflow.nodeagent.sender import SampleSender
from powerflow.nodeagent.sweep import Sweeps
from powerflow.nodeagent.windows import JobShape, Reading, Windows

from powerflow.core.devices import GpuDevices, GpuError
from powerflow.core.telemetry import (
    JobProgress,
    SampleBatch,
    TelemetryError,
    WindowSample,
    encode_batch,
    parse_batch,
    sendable,
)

log = logging.getLogger(__name__)

JobKey = tuple[str, str, int | None]
"""``PodView.job_key``: ``(namespace, job, generation)``."""


@dataclass(frozen=True)
class _Job:
    pods: tuple[PodKey, ...]
    """The job's pods on this node, lowest worker index first."""
    gpus: tuple[int, ...]
    """Every GPU (index) of those pods, ascending."""
    shape: JobShape | None
    """None while something a sample needs is unknown (no samples then)."""


def _noop() -> None:
    pass


class Telemetry:
    """Iteration reports of this node's workers -> sweep steps and samples."""

    def __init__(
        self,
        *,
        node: str,
        devices: GpuDevices,
        clock: Callable[[], float],
        window_s: float,
        sender: SampleSender | None,
        locked_clock_of: Callable[[int], int | None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.wall = wall
        """Unix time, for the samples' ``end_s`` (``clock`` may be monotonic)."""
        self.devices = devices
        self.clock = clock
        self.sender = sender
        self.locked_clock_of = locked_clock_of
        self.on_clock_change: Callable[[], None] = _noop
        """Called (on the event loop, from ``report``) when a sweep steps a clock."""
        self.on_gpus_reported: Callable[[], None] = _noop
        """Called when a worker reports GPU UUIDs that differ from its last ones
        (the control loop's cue to refresh a fallback mapping)."""
        self._pods: dict[PodKey, PodView] = {}
        self._job_of: dict[PodKey, JobKey] = {}
        self._jobs: dict[JobKey, _Job] = {}
        self._iterations: dict[PodKey, int] = {}
        self._counts: dict[JobKey, int] = {}
        """Each job's most iterations reported here, kept while any of its pods is active
        on this node: a worker that finished first (its pod ``Succeeded``) while the
        others wait on it still counts for the job's progress."""
        self._uuids: dict[PodKey, tuple[str, ...]] = {}
        self._max_clock: dict[int, int | None] = {}
        self._sweeps = Sweeps()
        self._windows = Windows(window_s)
        self.samples = 0
        """Samples produced (handed to the sender, or not sent for want of one)."""
        if sender is not None:
            sender.progress_of = self.progress

    # -- the control loop's side ----------------------------------------------

    def sync(
        self, pods: Mapping[PodKey, PodView], gpus_of: Mapping[PodKey, tuple[int, ...]]
    ) -> None:
        """The node's pods and each pod's GPU indices, as known now."""
        mine = {k: v for k, v in pods.items() if v.job and v.node == self.node and v.active}
        by_job: dict[JobKey, list[PodView]] = {}
        for view in mine.values():
            by_job.setdefault(view.job_key, []).append(view)
        jobs: dict[JobKey, _Job] = {}
        for key, views in by_job.items():
            views.sort(key=lambda v: (v.worker_index is None, v.worker_index or 0, v.name))
            gpus = sorted({g for v in views for g in gpus_of.get(v.key, ())})
            jobs[key] = _Job(tuple(v.key for v in views), tuple(gpus), _shape(views[0]))
        self._pods = mine
        self._job_of = {v.key: v.job_key for v in mine.values()}
        self._jobs = jobs
        for table in (self._iterations, self._uuids):
            for gone in [k for k in table if k not in mine]:
                del table[gone]
        for gone_job in [k for k in self._counts if k not in jobs]:
            del self._counts[gone_job]
        self._sweeps.sync({key: self._pods[job.pods[0]].profile for key, job in jobs.items()})
        self._windows.retain(jobs.keys())

    def clock_for(self, pod: PodKey) -> int | None:
        """The clock a profiling sweep holds ``pod``'s job at; None: ``frequency-mhz``."""
        job = self._job_of.get(pod)
        return self._sweeps.frequency_mhz(job) if job is not None else None

    def progress(self) -> tuple[JobProgress, ...]:
        """Each job's most iterations any of its workers here reported (the worker
        library counts from the checkpoint it resumed at), for the operator: jobs
        without an allocation generation are not PowerFlow's to count."""
        counts = sorted((k, v) for k, v in self._counts.items() if k[2] is not None)
        entries = (JobProgress(ns, job, gen or 0, n) for (ns, job, gen), n in counts)
        return tuple(p for p in entries if sendable(p))

    def reported_uuids(self, pod: PodKey) -> tuple[str, ...]:
        """The GPU UUIDs ``pod``'s worker last reported (empty if none)."""
        return self._uuids.get(pod, ())

    # -- the worker endpoint's side --------------------------------------------

    def report(self, r: IterationReport) -> str | None:
        """Accept ``r`` (None) or say why not (a ``Refusal``)."""
        key = (r.namespace, r.pod)
        view = self._pods.get(key)
        if view is None:
            return UnknownPod(f"no PowerFlow pod {r.namespace}/{r.pod} on node {self.node}")
        if view.uid != r.uid:
            return Refusal(f"pod {r.namespace}/{r.pod} has another UID than {r.uid}")
        if r.gpu_uuids and self._uuids.get(key) != r.gpu_uuids:
            self._uuids[key] = r.gpu_uuids
            self._call(self.on_gpus_reported)
        self._iterations[key] = r.iterations
        job_key = self._job_of[key]
        self._counts[job_key] = max(self._counts.get(job_key, 0), r.iterations)
        job = self._jobs[job_key]
        lead = next(p for p in job.pods if p in self._iterations)
        if lead == key:
            self._boundary(job_key, job, key, r.iterations)
        return None

    def _boundary(self, job_key: JobKey, job: _Job, lead: PodKey, iterations: int) -> None:
        now_s = self.clock()
        energy: tuple[int, ...] | None = None
        clock_before: int | None = None
        if job.shape is not None and job.gpus:
            try:
                energy = tuple(self.devices.total_energy_mj(g) for g in job.gpus)
            except GpuError as e:
                log.warning("reading the energy of %s's GPUs: %s", job_key[1], e)
                self._windows.forget(job_key)
            clock_before = self._tag(job.gpus)
        stepped = self._sweeps.on_boundary(job_key, now_s, self.wall())
        if stepped:
            self._call(self.on_clock_change)
        if energy is None or job.shape is None:
            return
        sample = self._windows.observe(
            job_key,
            job.shape,
            lead,
            job.gpus,
            Reading(now_s, iterations, energy),
            frequency_mhz=clock_before,
            next_clock_mhz=self._tag(job.gpus) if stepped else clock_before,
            close=stepped,
        )
        if sample is not None:
            # The window closed now, on the agent's clock (monotonic); the wire
            # carries Unix time, comparable across nodes.
            sample = dataclasses.replace(sample, end_s=self.wall() - (now_s - sample.end_s))
        if sample is not None and self._sendable(sample):
            self.samples += 1
            if self.sender is not None:
                self.sender.put(sample)

    def _tag(self, gpus: tuple[int, ...]) -> int | None:
        """The one clock all ``gpus`` are locked at (unlocked: their top clock), or None."""
        clocks = set()
        for g in gpus:
            locked = self.locked_clock_of(g)
            clocks.add(locked if locked is not None else self._top_clock(g))
        return clocks.pop() if len(clocks) == 1 else None

    def _top_clock(self, gpu: int) -> int | None:
        if gpu not in self._max_clock:
            try:
                self._max_clock[gpu] = max(self.devices.supported_graphics_clocks_mhz(gpu))
            except (GpuError, ValueError) as e:
                log.warning("GPU %d: no supported clocks: %s", gpu, e)
                self._max_clock[gpu] = None
        return self._max_clock[gpu]

    def _sendable(self, sample: WindowSample) -> bool:
        """Whether the operator's parser accepts ``sample``: one it would refuse
        would get the whole batch rejected with it."""
        try:
            parse_batch(encode_batch(SampleBatch(self.node, (sample,))))
        except TelemetryError as e:
            log.warning("sample of %s/%s not sent: %s", sample.namespace, sample.job, e)
            return False
        return True

    @staticmethod
    def _call(hook: Callable[[], None]) -> None:
        try:
            hook()
        except Exception:  # a hook's bug must not turn a report into a 500
            log.exception("telemetry hook %r failed", hook)


def _shape(view: PodView) -> JobShape | None:
    if (
        view.generation is None
        or view.n is None
        or view.gpus_per_node is None
        or view.local_batch_size is None
    ):
        return None
    return JobShape(
        namespace=view.namespace,
        job=view.job,
        generation=view.generation,
        n=view.n,
        gpus_per_node=view.gpus_per_node,
        local_batch_size=view.local_batch_size,
    )
