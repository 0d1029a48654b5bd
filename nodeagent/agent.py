"""The node agent's control loop: watch, map, decide, apply, measure.

One ``Agent`` per node, all on one event loop (the GPU interface is not
thread-safe; NVML calls take microseconds). Each pass:

1. the PowerFlow pods bound to this node and the node's powered-down mark
   (``kube``'s two watches keep them current);
2. which GPUs each pod holds (``mapping``: the kubelet's PodResources, else
   what workers reported, else in ``--simulate`` the extender's placement);
3. telemetry learns the pods and their GPUs (``Telemetry.sync``) and says the
   profiling sweep's clock per pod (``clock_for``);
4. ``settings.desired_settings`` -> ``apply.Applier`` writes the differences
   and clamps become Events on the pods;
5. in ``--simulate`` the simulated GPUs run each pod's workload (the ground
   truth of its model, size, placement and batch).

A pass runs as soon as anything changes (a watch event, a sweep step) and at
least every ``resync_s`` (the kubelet's assignments change without an event
the agent could watch). GPU metrics are sampled at 1 Hz beside it. Defaults
are restored at start and when the loop ends (SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from powerflow.nodeagent.apply import Applied, Applier, PodEvent
from powerflow.nodeagent.mapping import block_on_node, indices_of, placement_gpus
from powerflow.nodeagent.metrics import GpuMetrics
from powerflow.nodeagent.podresources import PodResourcesUnavailable
from powerflow.nodeagent.pods import PodKey, PodView, pod_view
from powerflow.nodeagent.settings import (
    ARM_S,
    GpuLimits,
    GpuTarget,
    desired_settings,
    unmapped_pods,
)

from powerflow.core import contract
from powerflow.core.devices import (
    GpuDevices,
    GpuError,
    GpuInfo,
    GpuNotSupported,
    RunsWorkloads,
    Workload,
)
from powerflow.core.errors import PowerFlowError
from powerflow.core.gpu_facts import GpuFacts, GpuReport

log = logging.getLogger(__name__)
Obj = dict[str, Any]


class PodResourcesSource(Protocol):
    """``powerflow.nodeagent.podresources.PodResourcesClient``: GPU UUIDs of every pod
    on the node (foreign ones too); raises when the kubelet socket is unreachable."""

    async def gpu_assignments(self) -> Mapping[PodKey, tuple[str, ...]]: ...

    async def close(self) -> None: ...


class TelemetryPart(Protocol):
    """What the loop uses of ``powerflow.nodeagent.telemetry.Telemetry``."""

    on_clock_change: Callable[[], None]

    def sync(
        self, pods: Mapping[PodKey, PodView], gpus_of: Mapping[PodKey, tuple[int, ...]]
    ) -> None: ...

    def clock_for(self, pod: PodKey) -> int | None: ...

    def reported_uuids(self, pod: PodKey) -> tuple[str, ...]: ...


class NoTelemetry:
    """No worker endpoint, no sweeps: clocks follow ``frequency-mhz`` only."""

    def __init__(self) -> None:
        self.on_clock_change: Callable[[], None] = lambda: None

    def sync(
        self, pods: Mapping[PodKey, PodView], gpus_of: Mapping[PodKey, tuple[int, ...]]
    ) -> None:
        pass

    def clock_for(self, pod: PodKey) -> int | None:
        return None

    def reported_uuids(self, pod: PodKey) -> tuple[str, ...]:
        return ()


EventPoster = Callable[[PodEvent, str], None]
"""``(event, pod uid)``: post a Kubernetes Event (blocking; runs in a thread)."""


def gpu_limits(devices: GpuDevices, infos: tuple[GpuInfo, ...]) -> dict[int, GpuLimits]:
    """Supported clocks and power ranges, read once (they do not change while up)."""
    out: dict[int, GpuLimits] = {}
    for info in infos:
        try:
            clocks = tuple(sorted(devices.supported_graphics_clocks_mhz(info.index)))
        except GpuError as exc:
            log.warning(
                "%s: supported clocks unknown (%s); requests are not clamped", info.label, exc
            )
            clocks = ()
        try:
            power = devices.power_limit_range_w(info.index)
        except GpuNotSupported:
            power = None
        except GpuError as exc:
            log.warning("%s: power-limit range unknown (%s); limits are not set", info.label, exc)
            power = None
        out[info.index] = GpuLimits(clocks, power)
    return out


def gpu_report(
    node: str, infos: tuple[GpuInfo, ...], limits: Mapping[int, GpuLimits]
) -> GpuReport | None:
    """What the agent tells the operator of its GPUs (``powerflow.core.gpu_facts``): each
    one's NVML name, supported clocks and power-limit constraints as ``gpu_limits`` read
    them. GPUs whose clocks NVML did not give are left out; None when none is left."""
    facts = []
    for info in infos:
        known = limits.get(info.index)
        if known is None or not known.clocks_mhz:
            continue
        power = known.power_range_w
        facts.append(
            GpuFacts(
                index=info.index,
                name=info.name,
                clocks_mhz=known.clocks_mhz,
                default_limit_w=None if power is None else power.default_w,
                min_limit_w=None if power is None else power.min_w,
                max_limit_w=None if power is None else power.max_w,
            )
        )
    return GpuReport(node, tuple(facts)) if facts else None


class Agent:
    def __init__(
        self,
        node: str,
        devices: GpuDevices,
        *,
        post_event: EventPoster | None = None,
        podresources: PodResourcesSource | None = None,
        telemetry: TelemetryPart | None = None,
        simulate: bool = False,
        metrics: GpuMetrics | None = None,
        resync_s: float = 1.0,
    ) -> None:
        self.node = node
        self.devices = devices
        self.infos = devices.gpus()
        self.limits = gpu_limits(devices, self.infos)
        self.applier = Applier(devices, self.infos)
        self.post_event = post_event
        self.podresources = podresources
        self.telemetry: TelemetryPart = telemetry or NoTelemetry()
        self.on_power: Callable[[float], None] | None = None
        """Called with the node's measured GPU power (W) at every metrics sample."""
        self.telemetry.on_clock_change = self.wake
        self.simulated = devices if simulate and isinstance(devices, RunsWorkloads) else None
        self.metrics = metrics
        self.resync_s = resync_s
        self.pods: dict[PodKey, PodView] = {}
        self.blocks: dict[PodKey, tuple[int, ...]] = {}
        self.powered_down = False
        self.targets: dict[int, GpuTarget] = {}
        self.passes = 0
        self.pods_listed = asyncio.Event()
        self.node_listed = asyncio.Event()
        self._wake = asyncio.Event()
        self._podresources_ok: bool | None = None
        self._bad_workloads: set[tuple[int, Workload]] = set()
        self._first_seen: dict[str, float] = {}
        """When a bound pod without ``status.startTime`` was first seen, by UID (``_keep``)."""
        self._unarmed: set[PodKey] = set()
        """Pods whose GPUs are still unknown ``ARM_S`` after they started (warned once)."""
        self._foreign: set[str] = set()
        """UIDs of pods with the job label that no DLJob of that name controls (warned
        once each; forgotten when they go)."""

    # -- news from the watches (on the loop) ----------------------------------------------

    async def listed(self) -> None:
        """Until both watches delivered their first LIST."""
        await self.pods_listed.wait()
        await self.node_listed.wait()

    def wake(self) -> None:
        self._wake.set()

    def on_pods_listed(self, items: list[Obj]) -> None:
        self.pods.clear()
        self.blocks.clear()
        listed = {str((b.get("metadata") or {}).get("uid") or "") for b in items}
        self._foreign &= listed
        for body in items:
            self._keep(body)
        for uid in set(self._first_seen) - {v.uid for v in self.pods.values()}:
            del self._first_seen[uid]
        self.pods_listed.set()
        self.wake()

    def on_pod_event(self, kind: str, body: Obj) -> None:
        if kind == "DELETED":
            meta = body.get("metadata") or {}
            key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
            gone = self.pods.pop(key, None)
            self.blocks.pop(key, None)
            self._foreign.discard(str(meta.get("uid") or ""))
            if gone is not None:
                self._first_seen.pop(gone.uid, None)
        else:
            self._keep(body)
        self.wake()

    def _keep(self, body: Obj) -> None:
        try:
            view = pod_view(body)
        except Exception as exc:  # a body the API would never send; the others go on
            log.warning("skipping a pod that cannot be read: %s: %s", type(exc).__name__, exc)
            return
        if view.node != self.node:
            return
        if not view.controlled:
            # The job label without its DLJob as controller: another workload's pod,
            # whose annotations set nothing and whose reports count for no job.
            if self.pods.pop(view.key, None) is not None or view.uid not in self._foreign:
                log.warning(
                    "pod %s/%s has the job label %r but no DLJob of that name as its "
                    "controller: not a PowerFlow worker, its annotations are ignored",
                    view.namespace, view.name, view.job,
                )  # fmt: skip
            self._foreign.add(view.uid)
            self.blocks.pop(view.key, None)
            return
        if view.started_s is None and view.active:
            # No ``status.startTime`` (yet, or unreadable): the arming bound (``ARM_S``)
            # counts from when this agent first saw the pod bound here, so a pod the
            # kubelet never starts cannot keep the free GPUs armed for ever.
            first = self._first_seen.setdefault(view.uid, time.time())
            view = dataclasses.replace(view, started_s=first)
        if view.problems and self.pods.get(view.key, view).problems != view.problems:
            log.warning("pod %s/%s: %s", view.namespace, view.name, "; ".join(view.problems))
        self.pods[view.key] = view
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        block = block_on_node(annotations, self.node)
        if block is None:
            self.blocks.pop(view.key, None)
        else:
            self.blocks[view.key] = block

    def on_node_listed(self, items: list[Obj]) -> None:
        self.powered_down = any(_powered_down(n) for n in items)
        self.node_listed.set()
        self.wake()

    def on_node_event(self, kind: str, body: Obj) -> None:
        was = self.powered_down
        self.powered_down = kind != "DELETED" and _powered_down(body)
        if was != self.powered_down:
            log.info(
                "node %s %s",
                self.node,
                "powered down: parking idle GPUs"
                if self.powered_down
                else "in use again: GPUs unparked",
            )
        self.wake()

    # -- one pass --------------------------------------------------------------------------

    async def mapping(self) -> tuple[dict[PodKey, tuple[int, ...]], frozenset[int] | None]:
        """GPU indices per pod and the indices any container holds (None: unknown)."""
        assignments: Mapping[PodKey, tuple[str, ...]] | None = None
        if self.podresources is not None:
            try:
                assignments = await self.podresources.gpu_assignments()
            except (
                PodResourcesUnavailable
            ) as exc:  # no socket, kubelet down: fall back, say so once
                if self._podresources_ok is not False:
                    log.warning(
                        "kubelet PodResources unavailable (%s): GPUs from worker reports", exc
                    )
                self._podresources_ok = False
            else:
                if self._podresources_ok is False:
                    log.info("kubelet PodResources available again")
                self._podresources_ok = True
        if assignments is not None:
            held = frozenset(
                i for uuids in assignments.values() for i in indices_of(uuids, self.infos)
            )
            gpus_of = {
                key: indices_of(uuids, self.infos)
                for key, uuids in assignments.items()
                if key in self.pods
            }
            return gpus_of, held
        gpus_of = {}
        for key in self.pods:
            reported = indices_of(self.telemetry.reported_uuids(key), self.infos)
            if reported:
                gpus_of[key] = reported
        if self.simulated is not None:
            placed = placement_gpus(
                {k: v for k, v in self.pods.items() if k not in gpus_of}, self.blocks
            )
            gpus_of.update(placed)
        return gpus_of, None

    async def step(self) -> Applied:
        """One pass: decide every GPU's settings and apply what changed."""
        gpus_of, held = await self.mapping()
        active = {k: v for k, v in self.pods.items() if v.active}
        self.telemetry.sync(active, {k: g for k, g in gpus_of.items() if k in active})
        overrides = {k: self.telemetry.clock_for(k) for k in active}
        now = time.time()
        self.targets = desired_settings(
            active,
            gpus_of,
            self.limits,
            node_powered_down=self.powered_down,
            held=held,
            clock_overrides=overrides,
            now_s=now,
        )
        self._warn_unmapped(unmapped_pods(active, gpus_of, self.limits), now)
        if self.simulated is not None:
            self._run_workloads(self.simulated)
        applied = self.applier.apply(self.targets)
        self.passes += 1
        if applied.events and self.post_event is not None:
            poster = self.post_event
            uids = {k: v.uid for k, v in self.pods.items()}
            await asyncio.gather(
                *(asyncio.to_thread(poster, e, uids.get(e.pod, "")) for e in applied.events)
            )
        return applied

    def _warn_unmapped(self, unmapped: list[PodView], now: float) -> None:
        """Say once per pod that its GPUs are still unknown past ``ARM_S``: the free
        GPUs are no longer armed for it, and its own GPUs get no settings."""
        late = {v.key for v in unmapped if v.started_s is not None and now - v.started_s > ARM_S}
        for ns, name in sorted(late - self._unarmed):
            log.warning(
                "pod %s/%s: its GPUs are still unknown more than %.0f s after it started "
                "(no PodResources assignment, no worker report): free GPUs no longer armed "
                "for it, its clock and power limit not applied",
                ns,
                name,
                ARM_S,
            )
        self._unarmed = late

    def _run_workloads(self, gpus: RunsWorkloads) -> None:
        """``--simulate``: each GPU runs its pod's ground truth; GPUs no pod holds idle."""
        for gpu, target in self.targets.items():
            view = self.pods.get(target.pod) if target.pod is not None else None
            workload = _workload(view) if view is not None else None
            if gpus.workload(gpu) == workload:
                continue
            if workload is None:
                gpus.clear(gpu)
                continue
            try:
                gpus.assign(gpu, workload)
            except PowerFlowError as exc:  # e.g. a model the ground truth does not know
                if (gpu, workload) not in self._bad_workloads:
                    self._bad_workloads.add((gpu, workload))
                    log.warning("GPU %d: cannot simulate %s: %s", gpu, workload, exc)
                gpus.clear(gpu)

    def users(self) -> dict[int, tuple[str, str, str]]:
        """``(namespace, job, pod)`` per GPU a PowerFlow pod uses (metric labels)."""
        return {
            gpu: (t.pod[0], t.job, t.pod[1]) for gpu, t in self.targets.items() if t.pod is not None
        }

    def sample_metrics(self) -> None:
        if self.metrics is not None:
            watts = self.metrics.sample(
                self.devices, self.infos, self.users(), self.applier.locked_clock_mhz
            )
            if self.on_power is not None:
                self.on_power(watts)

    # -- the loop --------------------------------------------------------------------------

    def restore_defaults(self, *, keep_workers: bool = False) -> None:
        """Every GPU back to its default clock and power limit; with ``keep_workers``, not
        those a PowerFlow pod holds (their settings stay until the next agent applies
        its own: ``powerflow nodeagent --daemonset``)."""
        keep = {g for g, t in self.targets.items() if t.pod is not None} if keep_workers else set()
        errors = self.applier.restore_defaults(keep)
        log.info(
            "default clocks and power limits restored on %d GPU(s)%s%s",
            len(self.infos) - len(errors) - len(keep),
            f"; {len(errors)} failed" if errors else "",
            f"; {len(keep)} held by workers kept as set for the next agent" if keep else "",
        )

    async def run(self, stop: asyncio.Event, *, on_pass: Callable[[], None] | None = None) -> None:
        """Pass after pass until ``stop``; the caller restores defaults before and after."""
        sampler = asyncio.create_task(self._sample_forever(stop))
        try:
            # The first pass waits for the first LISTs: before them every GPU is
            # at its default already (restored at start), and a pass would only
            # mistake a powered-down node for an awake one.
            listed = asyncio.ensure_future(self.listed())
            await _first(listed, stop)
            while not stop.is_set():
                try:
                    for line in (await self.step()).changes:  # --once prints them instead
                        log.info("%s", line)
                except Exception:  # one failed pass (a bug, a surprise) never ends the agent
                    log.exception("pass failed; retrying")
                if on_pass is not None:
                    on_pass()
                if not self._wake.is_set():
                    await _first(asyncio.ensure_future(self._wake.wait()), stop, self.resync_s)
                self._wake.clear()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

    async def _sample_forever(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not stop.is_set():
            self.sample_metrics()
            next_at += 1.0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_at - loop.time())):
                    await stop.wait()


async def _first(
    waiting: asyncio.Future[Any], stop: asyncio.Event, timeout: float | None = None
) -> None:
    """Until ``waiting`` is done or ``stop`` is set, at most ``timeout`` s; ``waiting``
    is cancelled if it is not done."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait(
            [waiting, stopping], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiting.cancel()
        stopping.cancel()


def _powered_down(node: Obj) -> bool:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return contract.POWERED_DOWN_ANNOTATION in annotations


def _workload(view: PodView) -> Workload | None:
    if (
        view.model_name is None
        or view.n is None
        or view.gpus_per_node is None
        or view.local_batch_size is None
    ):
        return None
    return Workload(view.model_name, view.n, view.gpus_per_node, view.local_batch_size)
