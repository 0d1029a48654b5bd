"""The node agent's pure decisions (``settings``) and their application (``apply``).

``desired_settings`` is checked on plain pod views; ``Applier`` against
simulated GPUs, whose lock and power limit are observed through the
``GpuDevices`` interface (a GPU with no workload runs at its locked clock).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from powerflow.nodeagent.apply import Applier
from powerflow.nodeagent.mapping import block_on_node, indices_of, placement_gpus
from powerflow.nodeagent.pods import PodView, pod_view
from powerflow.nodeagent.settings import (
    ARM_S,
    DEFAULT,
    Clamp,
    GpuLimits,
    GpuTarget,
    clamp_clock_mhz,
    clamp_power_w,
    desired_settings,
)

from powerflow.core import contract
from powerflow.core.devices import GpuLost, PowerLimitRangeW
from powerflow.core.gpus import A100
from powerflow.lab.simulated_gpus import SimulatedGpus

CLOCKS = (210, 225, 240, 1395, 1410)
RANGE = PowerLimitRangeW(100.0, 400.0, 400.0)
LIMITS = {i: GpuLimits(CLOCKS, RANGE) for i in range(4)}


def pod(name: str, gpus: int = 0, **ann: str) -> PodView:
    annotations = {k.replace("_", "-"): v for k, v in ann.items()}
    limits = {"limits": {contract.GPU_RESOURCE: str(gpus)}}
    body: dict[str, Any] = {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "labels": {contract.JOB_LABEL: "job-" + name},
            "annotations": {f"{contract.GROUP}/{k}": v for k, v in annotations.items()},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": limits}]},
        "status": {"phase": "Running"},
    }
    return pod_view(body)


def test_clamp_clock_to_nearest_supported_at_or_below_or_lowest() -> None:
    assert clamp_clock_mhz(1400, CLOCKS) == 1395
    assert clamp_clock_mhz(1410, CLOCKS) == 1410
    assert clamp_clock_mhz(9999, CLOCKS) == 1410
    assert clamp_clock_mhz(100, CLOCKS) == 210
    assert clamp_clock_mhz(1234, ()) == 1234  # unknown clocks: the GPU rounds


def test_clamp_power_into_range() -> None:
    assert clamp_power_w(50.0, RANGE) == 100.0
    assert clamp_power_w(500.0, RANGE) == 400.0
    assert clamp_power_w(250.5, RANGE) == 250.5


def test_pod_gpus_get_its_clock_and_limit_others_default() -> None:
    a = pod("a", frequency_mhz="1395", power_limit_watts="250")
    targets = desired_settings({a.key: a}, {a.key: (2,)}, LIMITS)
    assert targets[2] == GpuTarget(1395, 250.0, pod=a.key, job="job-a")
    assert [targets[i] for i in (0, 1, 3)] == [DEFAULT] * 3


def test_requests_are_clamped_and_say_so() -> None:
    a = pod("a", frequency_mhz="1400", power_limit_watts="20")
    t = desired_settings({a.key: a}, {a.key: (0,)}, LIMITS)[0]
    assert (t.frequency_mhz, t.power_limit_w) == (1395, 100.0)
    assert t.clamps == (Clamp("clock", 1400, 1395), Clamp("power", 20.0, 100.0))
    assert [c.reason for c in t.clamps] == ["ClockClamped", "PowerLimitClamped"]


def test_sweep_clock_overrides_frequency_and_none_follows_it() -> None:
    a = pod("a", frequency_mhz="1410")
    b = pod("b", frequency_mhz="1410")
    targets = desired_settings(
        {a.key: a, b.key: b},
        {a.key: (0,), b.key: (1,)},
        LIMITS,
        clock_overrides={a.key: 225, b.key: None},
    )
    assert (targets[0].frequency_mhz, targets[1].frequency_mhz) == (225, 1410)


def test_pod_without_frequency_or_finished_gets_defaults() -> None:
    a = pod("a")
    done = pod_view({**_body(pod("d", frequency_mhz="225")), "status": {"phase": "Succeeded"}})
    targets = desired_settings({a.key: a, done.key: done}, {a.key: (0,), done.key: (1,)}, LIMITS)
    assert targets[0] == GpuTarget(pod=a.key, job="job-a")
    assert targets[1] == DEFAULT


def _body(view: PodView) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": view.namespace,
            "name": view.name,
            "labels": {contract.JOB_LABEL: view.job},
            "annotations": {contract.FREQUENCY_ANNOTATION: str(view.frequency_mhz)},
        },
        "spec": {"nodeName": view.node},
    }


def test_parking_only_on_a_powered_down_node_and_only_gpus_nobody_holds() -> None:
    a = pod("a", frequency_mhz="1395")
    targets = desired_settings(
        {a.key: a}, {a.key: (0,)}, LIMITS, node_powered_down=True, held=frozenset({0, 3})
    )
    assert targets[0].frequency_mhz == 1395 and not targets[0].parked
    parked = GpuTarget(210, 100.0, parked=True)
    assert (targets[1], targets[2]) == (parked, parked)
    assert targets[3] == DEFAULT  # a foreign container holds it: never parked
    awake = desired_settings({a.key: a}, {a.key: (0,)}, LIMITS, held=frozenset({0}))
    assert all(not t.parked for t in awake.values())


def test_free_gpus_are_armed_with_the_strictest_plan_of_pods_whose_gpus_are_unknown() -> None:
    """A bound worker whose GPU is not known yet (container starting, no report yet)
    may start computing on any free GPU: every free one runs no faster and draws no
    more than the strictest such plan, idling as low as it likes; GPUs a container
    holds are left alone."""
    a = pod("a", 1, frequency_mhz="1395", power_limit_watts="250")
    b = pod("b", 1, frequency_mhz="240", power_limit_watts="300")
    c = pod("c", 2, power_limit_watts="200")  # no clock: only its cap binds
    known = {a.key: (0,)}
    targets = desired_settings(
        {a.key: a, b.key: b, c.key: c}, known, LIMITS, held=frozenset({0, 3})
    )
    assert targets[0] == GpuTarget(1395, 250.0, pod=a.key, job="job-a")
    armed = GpuTarget(240, 200.0, armed_for=(b.key, c.key), clock_floor_mhz=210)
    assert (targets[1], targets[2]) == (armed, armed)
    assert targets[3] == DEFAULT  # a foreign container holds it
    # b's GPU becomes known: it gets b's plan, the free ones stay armed for c alone.
    targets = desired_settings({a.key: a, b.key: b, c.key: c}, {**known, b.key: (1,)}, LIMITS)
    assert targets[1] == GpuTarget(240, 300.0, pod=b.key, job="job-b")
    assert targets[2] == targets[3] == GpuTarget(None, 200.0, armed_for=(c.key,))
    # One of c's two GPUs known: the other may still be any free one.
    targets = desired_settings(
        {a.key: a, b.key: b, c.key: c}, {**known, b.key: (1,), c.key: (2,)}, LIMITS
    )
    assert targets[2].pod == c.key
    assert targets[3] == GpuTarget(None, 200.0, armed_for=(c.key,))
    # A clock at the lowest supported one is locked as it is.
    low = pod("low", 1, frequency_mhz="100")
    assert desired_settings({low.key: low}, {}, LIMITS)[0] == GpuTarget(210, armed_for=(low.key,))


def test_arming_ends_arm_s_after_the_kubelet_started_the_pod() -> None:
    """A worker that never reports (no worker library, a crash loop) must not hold the
    free GPUs, which without PodResources may be foreign pods', at its plan for good."""
    started = dataclasses.replace(pod("s", 1, frequency_mhz="240"), started_s=1000.0)
    waiting = pod("w", 1, frequency_mhz="1395")  # not acknowledged by the kubelet yet
    pods = {started.key: started, waiting.key: waiting}
    early = desired_settings(pods, {}, LIMITS, now_s=1000.0 + ARM_S)
    assert early[0].armed_for == (started.key, waiting.key) and early[0].frequency_mhz == 240
    late = desired_settings(pods, {}, LIMITS, now_s=1000.0 + ARM_S + 1)
    assert late[0].armed_for == (waiting.key,) and late[0].frequency_mhz == 1395


def test_no_arming_for_pods_without_gpus_or_finished_and_arming_beats_parking() -> None:
    cpu_only = pod("cpu", 0, frequency_mhz="240")
    done = dataclasses.replace(pod("d", 1, frequency_mhz="225"), phase="Failed")
    targets = desired_settings({cpu_only.key: cpu_only, done.key: done}, {}, LIMITS)
    assert set(targets.values()) == {DEFAULT}
    # A pod bound to a node still marked powered down (the mark is lifted as it wakes):
    # its worker gets its plan, not the parked minimum.
    new = pod("n", 1, frequency_mhz="1395")
    targets = desired_settings({new.key: new}, {}, LIMITS, node_powered_down=True)
    armed = GpuTarget(1395, None, armed_for=(new.key,), clock_floor_mhz=210)
    assert set(targets.values()) == {armed}


def test_two_pods_on_one_gpu_first_by_name_wins() -> None:
    a, b = pod("a", frequency_mhz="225"), pod("b", frequency_mhz="1410")
    targets = desired_settings({b.key: b, a.key: a}, {a.key: (1,), b.key: (1,)}, LIMITS)
    assert targets[1].pod == a.key


def test_gpu_without_settable_power_limit_keeps_default() -> None:
    a = pod("a", power_limit_watts="250")
    limits = {0: GpuLimits(CLOCKS, None)}
    assert desired_settings({a.key: a}, {a.key: (0,)}, limits)[0].power_limit_w is None


# -- mapping -----------------------------------------------------------------------------


def test_placement_block_gives_pods_of_the_node_its_gpus_by_worker_index() -> None:
    ann = {
        contract.PLACEMENT_ANNOTATION: '{"node": "n1", "block": [["n0", 0], ["n1", 6], ["n1", 4]]}'
    }
    assert block_on_node(ann, "n1") == (4, 6)
    assert block_on_node({contract.PLACEMENT_ANNOTATION: "{oops"}, "n1") is None

    def worker(name: str, index: int) -> PodView:
        body = _body(pod(name))
        body["metadata"]["labels"] = {
            contract.JOB_LABEL: "j",
            contract.WORKER_INDEX_LABEL: str(index),
        }
        return pod_view(body)

    w2, w1 = worker("w2", 2), worker("w1", 1)
    pods = {w2.key: w2, w1.key: w1}
    assert placement_gpus(pods, {w1.key: (4, 6), w2.key: (4, 6)}) == {w1.key: (4,), w2.key: (6,)}


def test_indices_of_uuids_skips_unknown() -> None:
    gpus = SimulatedGpus(3)
    infos = gpus.gpus()
    assert indices_of([infos[2].uuid, "GPU-unknown", infos[0].uuid], infos) == (0, 2)


# -- apply -------------------------------------------------------------------------------


class CountingGpus(SimulatedGpus):
    """Simulated GPUs that count writes and fail every write to ``broken``."""

    def __init__(self, count: int, broken: int | None = None) -> None:
        super().__init__(count)
        self.writes = 0
        self.broken = broken

    def _write(self, gpu: int) -> None:
        self.writes += 1
        if gpu == self.broken:
            raise GpuLost(f"GPU {gpu}: fell off the bus", gpu=f"GPU {gpu}")

    def lock_clocks_mhz(self, gpu: int, lo_mhz: int, hi_mhz: int) -> None:
        self._write(gpu)
        super().lock_clocks_mhz(gpu, lo_mhz, hi_mhz)

    def reset_clocks(self, gpu: int) -> None:
        self._write(gpu)
        super().reset_clocks(gpu)

    def set_power_limit_w(self, gpu: int, watts: float) -> None:
        self._write(gpu)
        super().set_power_limit_w(gpu, watts)

    def reset_power_limit(self, gpu: int) -> None:
        self._write(gpu)
        super().reset_power_limit(gpu)


def test_applier_writes_only_differences() -> None:
    gpus = CountingGpus(2)
    applier = Applier(gpus, gpus.gpus())
    applier.restore_defaults()
    assert gpus.writes == 4
    target = GpuTarget(1200, 250.0, pod=("ns", "a"))
    first = applier.apply({0: target, 1: DEFAULT})
    assert gpus.writes == 6 and len(first.changes) == 1
    assert gpus.sm_clock_mhz(0) == 1200 and gpus.power_limit_w(0) == 250.0
    again = applier.apply({0: target, 1: DEFAULT})
    assert gpus.writes == 6 and again.changes == ()
    applier.apply({0: GpuTarget(1200, None, pod=("ns", "a")), 1: DEFAULT})
    assert gpus.writes == 7 and gpus.power_limit_w(0) == A100.max_power_w
    assert applier.locked_clock_mhz(0) == 1200 and applier.locked_clock_mhz(1) is None


def test_a_failing_gpu_never_stops_the_others_and_is_retried() -> None:
    gpus = CountingGpus(3, broken=1)
    applier = Applier(gpus, gpus.gpus())
    assert len(applier.restore_defaults()) == 2  # clocks and power limit of GPU 1
    targets = {i: GpuTarget(600, None, pod=("ns", f"p{i}")) for i in range(3)}
    applied = applier.apply(targets)
    assert [gpus.sm_clock_mhz(i) for i in (0, 2)] == [600, 600]
    assert len(applied.errors) == 1 and "GPU 1" in applied.errors[0]
    before = gpus.writes
    applier.apply(targets)
    assert gpus.writes == before + 1  # only the broken GPU is tried again
    gpus.broken = None
    applier.apply(targets)
    assert gpus.sm_clock_mhz(1) == 600


def test_each_clamp_is_reported_once_per_pod_and_request() -> None:
    gpus = SimulatedGpus(1)
    applier = Applier(gpus, gpus.gpus())
    clamp = Clamp("clock", 1400, 1395)
    target = GpuTarget(1395, None, pod=("ns", "a"), clamps=(clamp,))
    (event,) = applier.apply({0: target}).events
    assert (event.pod, event.type, event.reason) == (("ns", "a"), "Warning", "ClockClamped")
    assert "1400 MHz" in event.message and "1395 MHz" in event.message
    assert applier.apply({0: target}).events == ()
    applier.apply({0: DEFAULT})  # the pod went away: a new pod of that name is told again
    assert len(applier.apply({0: target}).events) == 1


@pytest.mark.parametrize("parked", [True, False])
def test_parked_target_is_lowest_clock_and_min_limit(parked: bool) -> None:
    gpus = SimulatedGpus(1)
    applier = Applier(gpus, gpus.gpus())
    lim = {0: GpuLimits(A100.clocks_mhz, gpus.power_limit_range_w(0))}
    targets = desired_settings({}, {}, lim, node_powered_down=parked, held=frozenset())
    applier.apply(targets)
    want = (A100.clocks_mhz[0], A100.min_power_limit_w) if parked else (None, None)
    assert (applier.locked_clock_mhz(0), targets[0].power_limit_w) == want
    expected_limit = A100.min_power_limit_w if parked else A100.max_power_w
    assert gpus.power_limit_w(0) == expected_limit
