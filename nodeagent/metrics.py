"""The node agent's Prometheus metrics, in a registry of its own (one per agent).

Per GPU, labelled ``node``, ``gpu`` (UUID), ``dljob_namespace``, ``dljob`` (the
DLJob) and ``worker_pod`` (the pod's name; empty strings for a GPU no PowerFlow
pod uses), sampled at 1 Hz by ``GpuMetrics.sample``. Not ``namespace``, ``job``
or ``pod``: Prometheus sets those on every series it scrapes (the target's: the
agent's own pod) and would rename ours to ``exported_*``; the names match the
operator's per-job gauges, so the dashboard joins them by (dljob_namespace, dljob):

- ``powerflow_gpu_power_watts``: board power now;
- ``powerflow_gpu_energy_joules_total``: energy since the agent started
  watching the GPU under these labels. NVML's counter restarts with the driver;
  the increments come from ``powerflow.core.devices.energy_delta_mj``, so this
  counter never goes backwards (what a restart hides is at most one interval);
- ``powerflow_gpu_sm_clock_hertz``: the SM clock now;
- ``powerflow_gpu_locked_clock_hertz``: the clock the agent locked (0: not
  locked, the GPU picks its clock).

When a GPU changes hands its old series are removed (a pod's series end with
the pod), so the registry holds one series per GPU and metric.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from powerflow.core.devices import GpuDevices, GpuError, GpuInfo, energy_delta_mj

log = logging.getLogger(__name__)
LABELS = ("node", "gpu", "dljob_namespace", "dljob", "worker_pod")
MHZ = 1_000_000.0


class GpuMetrics:
    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.power = Gauge("powerflow_gpu_power_watts", "GPU board power.", LABELS, registry=r)
        self.energy = Counter(
            "powerflow_gpu_energy_joules",
            "GPU energy (robust to driver counter restarts).",
            LABELS,
            registry=r,
        )
        self.sm_clock = Gauge("powerflow_gpu_sm_clock_hertz", "GPU SM clock.", LABELS, registry=r)
        self.locked_clock = Gauge(
            "powerflow_gpu_locked_clock_hertz",
            "Clock the agent locked the GPU to (0: not locked).",
            LABELS,
            registry=r,
        )
        self._labels: dict[int, tuple[str, ...]] = {}
        self._energy_mj: dict[int, int] = {}
        self._failed: set[int] = set()

    def sample(
        self,
        devices: GpuDevices,
        infos: tuple[GpuInfo, ...],
        users: Mapping[int, tuple[str, str, str]],
        locked_mhz: Callable[[int], int | None],
    ) -> float:
        """Read every GPU once; ``users`` maps a GPU index to ``(namespace, job, pod)``.
        Returns the board power of the GPUs read (W): the node's measured
        power, which the sample sender carries to the operator."""
        total_w = 0.0
        for info in infos:
            namespace, job, pod = users.get(info.index, ("", "", ""))
            labels = (self.node, info.uuid, namespace, job, pod)
            old = self._labels.get(info.index)
            if old is not None and old != labels:
                for metric in (self.power, self.energy, self.sm_clock, self.locked_clock):
                    metric.remove(*old)
            self._labels[info.index] = labels
            try:
                power_mw = devices.power_mw(info.index)
                energy_mj = devices.total_energy_mj(info.index)
                sm_mhz = devices.sm_clock_mhz(info.index)
            except GpuError as exc:
                if info.index not in self._failed:
                    self._failed.add(info.index)
                    log.warning("%s: metrics: %s", info.label, exc)
                continue
            self._failed.discard(info.index)
            self.power.labels(*labels).set(power_mw / 1000.0)
            total_w += power_mw / 1000.0
            previous = self._energy_mj.get(info.index)
            counter = self.energy.labels(*labels)
            if previous is not None:
                counter.inc(energy_delta_mj(previous, energy_mj) / 1000.0)
            self._energy_mj[info.index] = energy_mj
            self.sm_clock.labels(*labels).set(sm_mhz * MHZ)
            self.locked_clock.labels(*labels).set((locked_mhz(info.index) or 0) * MHZ)
        return total_w
