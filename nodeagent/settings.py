"""What every GPU of the node should be set to: one pure function, no I/O.

The agent's inputs change from many sides (the pod watch, the kubelet's
device assignments, the node's powered-down mark, the profiling sweep's
clock); ``desired_settings`` turns one snapshot of them into one target per
GPU, so that ``apply`` only has to diff and carry it out, and the rules are
tested without a cluster, a GPU or a clock:

- a GPU of an active PowerFlow pod gets the pod's clock: the sweep's clock
  while the pod profiles, else ``frequency-mhz``, else the default (reset);
  and the pod's ``power-limit-watts``, else the default limit;
- a pod whose clock or power-limit annotation is there but unreadable
  (``PodView.strict``: garbled by hand or by a hostile tenant) gets the
  lowest clock and the minimum power limit until the operator writes the
  value again: a value the agent cannot read never lifts the budget's
  backstop;
- a clock is clamped to the nearest supported clock at or below it (the
  lowest when it is below all: the GPU cannot go slower), a power limit into
  the GPU's range; every clamp is part of the target, so it can be reported
  on the pod;
- a GPU no PowerFlow pod uses and no container holds is *armed* while a
  PowerFlow pod bound to the node has fewer GPUs known than it requests (its
  container is starting, or, without PodResources, its worker has not
  reported yet): its clocks are locked to the range from the lowest supported
  clock to the lowest clock any such pod asks for, and its power limit is the
  lowest such pod's. The device plugin picks which free GPU a pod gets, so
  the agent cannot know it in advance; arming them all means a worker's first
  kernels run at no more than its plan, never at the board's defaults, so a
  new or rescaled job cannot push the node past the power budget before the
  agent has seen it (the operator plans the budget with the pod's clock and
  cap). The range lets an idle armed GPU stay at its low idle clock. A pod
  arms for at most ``ARM_S`` after the kubelet acknowledged it
  (``status.startTime``): without PodResources a worker that never reports
  (no worker library, no GPU UUIDs in its environment, a crash loop) would
  otherwise hold the node's free GPUs, foreign pods' ones included (without
  PodResources the agent cannot tell them from free ones), at its plan for
  good;
- any other GPU no PowerFlow pod uses gets default clocks and power limit,
  unless the node is marked powered down and no container at all holds it
  (the kubelet's PodResources lists every pod's devices, foreign ones too):
  then it is parked at its lowest clock and minimum power limit until used
  again.

Two pods claiming one GPU (a stale view) is resolved deterministically: the
first by ``(namespace, name)`` wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from powerflow.nodeagent.pods import PodKey, PodView

from powerflow.core.devices import PowerLimitRangeW


@dataclass(frozen=True)
class GpuLimits:
    """What one GPU accepts: its supported clocks (ascending; empty when unknown)
    and its power-limit range (None when the board has no settable limit)."""

    clocks_mhz: tuple[int, ...]
    power_range_w: PowerLimitRangeW | None


@dataclass(frozen=True)
class Clamp:
    """A request the GPU cannot honour as asked, and what it gets instead."""

    kind: Literal["clock", "power"]
    requested: float
    applied: float

    @property
    def reason(self) -> str:
        """The Event reason (``ClockClamped`` / ``PowerLimitClamped``)."""
        return "ClockClamped" if self.kind == "clock" else "PowerLimitClamped"

    def describe(self, gpu_label: str) -> str:
        if self.kind == "clock":
            return (
                f"{gpu_label}: clock {self.requested:g} MHz is not supported; "
                f"locked {self.applied:g} MHz (nearest supported clock at or below, "
                "or the lowest)"
            )
        return (
            f"{gpu_label}: power limit {self.requested:g} W is outside the GPU's range; "
            f"set {self.applied:g} W"
        )


@dataclass(frozen=True)
class GpuTarget:
    """The settings one GPU should have. ``None``: the GPU's default."""

    frequency_mhz: int | None = None
    power_limit_w: float | None = None
    parked: bool = False
    pod: PodKey | None = None
    """The PowerFlow pod using the GPU (None: idle or parked)."""
    job: str = ""
    clamps: tuple[Clamp, ...] = ()
    armed_for: tuple[PodKey, ...] = ()
    """The bound PowerFlow pods, GPUs not yet known, this free GPU is armed for."""
    clock_floor_mhz: int | None = None
    """The lower end of the clock lock (None: ``frequency_mhz`` itself): an armed GPU
    may idle below the clock it is armed with."""

    @property
    def device_settings(self) -> tuple[int | None, float | None, int | None]:
        """What is written to the GPU (the diff key: who asked does not matter)."""
        return (self.frequency_mhz, self.power_limit_w, self.clock_floor_mhz)


DEFAULT = GpuTarget()

ARM_S = 300.0
"""How long after the kubelet acknowledged a pod its unknown GPUs keep the free
GPUs armed (module docstring): a framework's start-up (image, imports, NCCL,
data loaders) before its first iteration and report is minutes at most."""


def clamp_clock_mhz(requested: int, clocks_mhz: Sequence[int]) -> int:
    """The highest supported clock at or below ``requested``; the lowest if below all.

    Without a list of supported clocks the request stands (the GPU rounds)."""
    if not clocks_mhz:
        return requested
    below = [c for c in clocks_mhz if c <= requested]
    return max(below) if below else min(clocks_mhz)


def clamp_power_w(requested: float, allowed: PowerLimitRangeW) -> float:
    """``requested`` moved into ``[min_w, max_w]``."""
    return min(max(requested, allowed.min_w), allowed.max_w)


def desired_settings(
    pods: Mapping[PodKey, PodView],
    gpus_of: Mapping[PodKey, Sequence[int]],
    limits: Mapping[int, GpuLimits],
    *,
    node_powered_down: bool = False,
    held: frozenset[int] | None = None,
    clock_overrides: Mapping[PodKey, int | None] | None = None,
    now_s: float | None = None,
) -> dict[int, GpuTarget]:
    """One target for every GPU in ``limits`` (the node's GPUs, by index).

    ``gpus_of``: the GPU indices each pod holds; ``held``: indices any
    container holds (PowerFlow's or not; None: only what ``gpus_of`` says);
    ``clock_overrides``: the profiling sweep's clock per pod (None or absent:
    follow ``frequency-mhz``); ``now_s``: Unix time, for ``ARM_S`` (None: no
    bound).
    """
    overrides = clock_overrides or {}
    owner: dict[int, PodView] = {}
    for key in sorted(pods):
        view = pods[key]
        if not view.active:
            continue
        for gpu in gpus_of.get(key, ()):
            if gpu in limits and gpu not in owner:
                owner[gpu] = view
    in_use = set(owner) | set(held or ())
    pending = [
        view
        for view in unmapped_pods(pods, gpus_of, limits)
        if now_s is None or view.started_s is None or now_s - view.started_s <= ARM_S
    ]
    targets: dict[int, GpuTarget] = {}
    for gpu, lim in sorted(limits.items()):
        user = owner.get(gpu)
        if user is not None:
            targets[gpu] = _pod_target(user, lim, overrides.get(user.key))
        elif pending and gpu not in in_use:
            targets[gpu] = _armed([_pod_target(v, lim, overrides.get(v.key)) for v in pending], lim)
        elif node_powered_down and gpu not in in_use:
            targets[gpu] = _parked(lim)
        else:
            targets[gpu] = DEFAULT
    return targets


def unmapped_pods(
    pods: Mapping[PodKey, PodView],
    gpus_of: Mapping[PodKey, Sequence[int]],
    limits: Mapping[int, GpuLimits],
) -> list[PodView]:
    """The active pods with fewer of this node's GPUs known than they request."""
    return [
        view
        for key, view in sorted(pods.items())
        if view.active and len({g for g in gpus_of.get(key, ()) if g in limits}) < view.gpus
    ]


def _armed(wanted: Sequence[GpuTarget], lim: GpuLimits) -> GpuTarget:
    """The strictest of the pending pods' targets, field by field (None: the default,
    the loosest), locked down to the lowest clock; clamps are reported on the pod
    once its GPUs are known."""
    clocks = [t.frequency_mhz for t in wanted if t.frequency_mhz is not None]
    powers = [t.power_limit_w for t in wanted if t.power_limit_w is not None]
    clock = min(clocks) if clocks else None
    lowest = min(lim.clocks_mhz) if lim.clocks_mhz else None
    floor = lowest if clock is not None and lowest is not None and lowest < clock else None
    return GpuTarget(
        clock,
        min(powers) if powers else None,
        armed_for=tuple(t.pod for t in wanted if t.pod is not None),
        clock_floor_mhz=floor,
    )


def _pod_target(view: PodView, lim: GpuLimits, sweep_mhz: int | None) -> GpuTarget:
    if view.strict:  # an unreadable clock or cap: the strictest settings (``PodView.strict``)
        parked = _parked(lim)
        return GpuTarget(parked.frequency_mhz, parked.power_limit_w, pod=view.key, job=view.job)
    clamps: list[Clamp] = []
    wanted = sweep_mhz if sweep_mhz is not None else view.frequency_mhz
    clock: int | None = None
    if wanted is not None:
        clock = clamp_clock_mhz(wanted, lim.clocks_mhz)
        if clock != wanted:
            clamps.append(Clamp("clock", wanted, clock))
    power: float | None = None
    if view.power_limit_w is not None and lim.power_range_w is not None:
        power = clamp_power_w(view.power_limit_w, lim.power_range_w)
        if power != view.power_limit_w:
            clamps.append(Clamp("power", view.power_limit_w, power))
    return GpuTarget(clock, power, pod=view.key, job=view.job, clamps=tuple(clamps))


def _parked(lim: GpuLimits) -> GpuTarget:
    clock = min(lim.clocks_mhz) if lim.clocks_mhz else None
    power = lim.power_range_w.min_w if lim.power_range_w is not None else None
    return GpuTarget(clock, power, parked=True)
