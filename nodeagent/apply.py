"""Carry out ``settings.desired_settings`` on a ``GpuDevices``: only what changed.

``Applier`` remembers what it last wrote to each GPU and writes only the
differences, so the agent may recompute targets as often as it likes (every
watch event, every second) without touching NVML in the steady state. A GPU
whose write failed is forgotten (its state is unknown) and retried on the
next pass; a ``GpuError`` on one GPU is logged (once per GPU and error) and
never stops the others.

Clamps (``settings.Clamp``) become Warning Events on the pod, once per pod,
kind and request: a pod whose request stays unsatisfiable is not reported
every second.

``restore_defaults`` resets clocks and power limits on every GPU: at start
(a crashed agent may have left clocks locked: the agent's memory of what it
wrote is gone with it) and on shutdown.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from powerflow.nodeagent.pods import PodKey
from powerflow.nodeagent.settings import Clamp, GpuTarget

from powerflow.core.devices import GpuDevices, GpuError, GpuInfo, GpuNotSupported

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodEvent:
    """A Kubernetes Event to post on a pod."""

    pod: PodKey
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Applied:
    """What one ``apply`` pass did: lines for logs and ``--once``, Events to post."""

    changes: tuple[str, ...]
    events: tuple[PodEvent, ...]
    errors: tuple[str, ...]


class Applier:
    """The one writer of GPU settings on this node (not thread-safe: one owner)."""

    def __init__(self, devices: GpuDevices, infos: tuple[GpuInfo, ...]) -> None:
        self.devices = devices
        self.infos = {i.index: i for i in infos}
        self._written: dict[int, tuple[int | None, float | None, int | None]] = {}
        self._reported: set[tuple[PodKey, str, float]] = set()
        self._logged: set[tuple[int, str]] = set()

    def locked_clock_mhz(self, gpu: int) -> int | None:
        """The clock this agent locked ``gpu`` to (None: default clocks or unknown)."""
        written = self._written.get(gpu)
        return written[0] if written is not None else None

    def restore_defaults(self, keep: Collection[int] = ()) -> tuple[str, ...]:
        """Reset clocks and power limits on every GPU but those in ``keep`` (errors
        logged, never raised)."""
        errors: list[str] = []
        for gpu, info in sorted(self.infos.items()):
            if gpu in keep:
                continue
            ok = True
            for action, call in (
                ("reset clocks", self.devices.reset_clocks),
                ("reset power limit", self.devices.reset_power_limit),
            ):
                try:
                    call(gpu)
                except GpuNotSupported:
                    # A board without the knob is at its default already.
                    continue
                except GpuError as exc:
                    ok = False
                    errors.append(f"{info.label}: {action}: {exc}")
                    log.error("%s: %s: %s", info.label, action, exc)
            if ok:
                self._written[gpu] = (None, None, None)
            else:
                self._written.pop(gpu, None)
        return tuple(errors)

    def apply(self, targets: Mapping[int, GpuTarget]) -> Applied:
        changes: list[str] = []
        events: list[PodEvent] = []
        errors: list[str] = []
        for gpu, target in sorted(targets.items()):
            info = self.infos.get(gpu)
            if info is None:
                continue
            events.extend(self._clamp_events(info, target))
            before = self._written.get(gpu)
            if before == target.device_settings:
                continue
            line, error = self._write(info, target, before)
            if line:
                changes.append(line)
            if error:
                errors.append(error)
        live = {t.pod for t in targets.values() if t.pod is not None}
        self._reported = {r for r in self._reported if r[0] in live}
        return Applied(tuple(changes), tuple(events), tuple(errors))

    def _clamp_events(self, info: GpuInfo, target: GpuTarget) -> list[PodEvent]:
        out: list[PodEvent] = []
        if target.pod is None:
            return out
        for clamp in target.clamps:
            key = (target.pod, clamp.kind, clamp.requested)
            if key in self._reported:
                continue
            self._reported.add(key)
            out.append(_event(target.pod, info, clamp))
        return out

    def _write(
        self,
        info: GpuInfo,
        target: GpuTarget,
        before: tuple[int | None, float | None, int | None] | None,
    ) -> tuple[str, str]:
        """Write what differs from ``before`` (None: unknown, write both)."""
        gpu = info.index
        clock, power, floor = target.device_settings
        what: list[str] = []
        try:
            if before is None or (before[0], before[2]) != (clock, floor):
                if clock is None:
                    self.devices.reset_clocks(gpu)
                    what.append("clocks reset")
                elif floor is not None:
                    self.devices.lock_clocks_mhz(gpu, floor, clock)
                    what.append(f"clocks locked to {floor}-{clock} MHz")
                else:
                    self.devices.lock_clocks_mhz(gpu, clock, clock)
                    what.append(f"clock locked at {clock} MHz")
            if before is None or before[1] != power:
                if power is None:
                    with contextlib.suppress(GpuNotSupported):  # no knob: at its default
                        self.devices.reset_power_limit(gpu)
                    what.append("power limit default")
                else:
                    self.devices.set_power_limit_w(gpu, power)
                    what.append(f"power limit {power:g} W")
        except GpuError as exc:
            self._written.pop(gpu, None)  # unknown now: the next pass writes both again
            key = (gpu, f"{type(exc).__name__}: {exc}")
            if key not in self._logged:
                self._logged.add(key)
                log.error("%s: could not apply %s: %s", info.label, _describe(target), exc)
            return "", f"{info.label}: {exc}"
        self._written[gpu] = (clock, power, floor)
        self._logged = {k for k in self._logged if k[0] != gpu}
        return f"{info.label}: {', '.join(what)} ({_describe(target)})", ""


def _describe(target: GpuTarget) -> str:
    if target.parked:
        return "parked: node powered down"
    if target.armed_for:
        pods = ", ".join(f"{ns}/{name}" for ns, name in target.armed_for)
        return f"armed for starting pod {pods}"
    if target.pod is None:
        return "unused"
    return f"pod {target.pod[0]}/{target.pod[1]}"


def _event(pod: PodKey, info: GpuInfo, clamp: Clamp) -> PodEvent:
    return PodEvent(pod, "Warning", clamp.reason, clamp.describe(info.label))
