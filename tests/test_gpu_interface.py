"""The GPU interface: what every ``GpuDevices`` implementation promises.

The behaviour tests run on every implementation this machine can open (the
simulated GPUs here; on a GPU machine the read-only probe,
``scripts/nvml_probe.py``, exercises NVML). Both implementations are checked
against the Protocol's method names and parameters, so neither drifts.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
from collections.abc import Callable, Iterator

import pytest
from powerflow.nodeagent.nvml import NvmlGpus

from powerflow.core.devices import (
    GpuDevices,
    GpuError,
    GpuInvalidArgument,
    GpuUnavailable,
    energy_delta_mj,
    energy_deltas_mj,
)
from powerflow.core.errors import DataError, PowerFlowError
from powerflow.lab.simulated_gpus import SimulatedGpus

IMPLEMENTATIONS: dict[str, Callable[[], GpuDevices]] = {
    "simulated": lambda: SimulatedGpus(4, seed=3),
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def devices(request: pytest.FixtureRequest) -> Iterator[GpuDevices]:
    opened = IMPLEMENTATIONS[request.param]()
    yield opened
    opened.close()


def _protocol_methods() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(GpuDevices).items()
        if not name.startswith("_") and callable(member)
    }


@pytest.mark.parametrize("cls", [SimulatedGpus, NvmlGpus])
def test_implementation_has_every_protocol_method_with_its_parameters(cls: type) -> None:
    methods = _protocol_methods()
    assert {"total_energy_mj", "power_mw", "set_power_limit_w", "lock_clocks_mhz"} <= set(methods)
    for name, wanted in methods.items():
        got = inspect.signature(getattr(cls, name))
        assert list(got.parameters) == list(wanted.parameters), name


def test_gpus_are_listed_by_index_with_distinct_uuids(devices: GpuDevices) -> None:
    assert isinstance(devices, GpuDevices)
    gpus = devices.gpus()
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert len({g.uuid for g in gpus}) == len(gpus)
    assert all(g.uuid.startswith("GPU-") and g.name for g in gpus)
    assert gpus[0].label == f"GPU 0 ({gpus[0].uuid})"
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpus[0].index = 5  # type: ignore[misc]


def test_supported_clocks_ascend(devices: GpuDevices) -> None:
    clocks = devices.supported_graphics_clocks_mhz(0)
    assert clocks and all(0 < a < b for a, b in itertools.pairwise(clocks))


def test_locked_clock_shows_as_sm_clock_and_bad_ranges_are_refused(devices: GpuDevices) -> None:
    clocks = devices.supported_graphics_clocks_mhz(1)
    middle = clocks[len(clocks) // 2]
    devices.lock_clocks_mhz(1, middle, middle)
    assert devices.sm_clock_mhz(1) == middle
    label = devices.gpus()[1].label
    for lo, hi in ((middle, middle - 1), (0, middle), (-5, -1)):
        with pytest.raises(GpuInvalidArgument, match=r"GPU 1 \(GPU-.*\): clock range") as err:
            devices.lock_clocks_mhz(1, lo, hi)
        assert err.value.gpu == label
    assert devices.sm_clock_mhz(1) == middle  # a refused lock changes nothing
    devices.reset_clocks(1)
    assert devices.sm_clock_mhz(1) in clocks


def test_power_limit_set_refused_and_reset(devices: GpuDevices) -> None:
    allowed = devices.power_limit_range_w(0)
    assert 0 < allowed.min_w <= allowed.default_w <= allowed.max_w
    assert devices.power_limit_w(0) == allowed.default_w
    middle = round((allowed.min_w + allowed.max_w) / 2)
    devices.set_power_limit_w(0, middle)
    assert devices.power_limit_w(0) == middle
    for bad in (allowed.max_w + 1, allowed.min_w - 1, math.nan, math.inf):
        with pytest.raises(GpuInvalidArgument, match=r"GPU 0 \(GPU-.*\): power limit .* outside"):
            devices.set_power_limit_w(0, bad)
    assert devices.power_limit_w(0) == middle
    devices.reset_power_limit(0)
    assert devices.power_limit_w(0) == allowed.default_w


def test_energy_counter_never_decreases_and_power_is_positive(devices: GpuDevices) -> None:
    readings = [devices.total_energy_mj(2) for _ in range(5)]
    assert readings == sorted(readings) and all(r >= 0 for r in readings)
    assert devices.power_mw(2) > 0


@pytest.mark.parametrize("bad", [-1, 4, 99])
def test_unknown_gpu_index_is_refused_by_every_method(devices: GpuDevices, bad: int) -> None:
    calls: list[Callable[[], object]] = [
        lambda: devices.supported_graphics_clocks_mhz(bad),
        lambda: devices.lock_clocks_mhz(bad, 900, 900),
        lambda: devices.reset_clocks(bad),
        lambda: devices.power_limit_w(bad),
        lambda: devices.power_limit_range_w(bad),
        lambda: devices.set_power_limit_w(bad, 200.0),
        lambda: devices.reset_power_limit(bad),
        lambda: devices.total_energy_mj(bad),
        lambda: devices.power_mw(bad),
        lambda: devices.sm_clock_mhz(bad),
    ]
    for call in calls:
        with pytest.raises(GpuInvalidArgument, match=rf"GPU {bad}: no such GPU"):
            call()


def test_closed_devices_refuse_calls(devices: GpuDevices) -> None:
    devices.close()
    devices.close()  # idempotent
    with pytest.raises(GpuUnavailable, match="closed"):
        devices.total_energy_mj(0)


def test_gpu_errors_are_powerflow_errors() -> None:
    assert issubclass(GpuError, PowerFlowError)
    err = GpuInvalidArgument("GPU 0 (GPU-x): nope", gpu="GPU 0 (GPU-x)")
    assert isinstance(err, GpuError) and err.gpu == "GPU 0 (GPU-x)" and err.nvml_error is None


# -- energy counter deltas -----------------------------------------------------


def test_energy_delta_is_the_difference_while_the_counter_runs() -> None:
    assert energy_delta_mj(1_000, 1_250) == 250
    assert energy_delta_mj(7, 7) == 0


def test_a_counter_restart_counts_the_new_reading_from_zero() -> None:
    assert energy_delta_mj(9_000_000, 1_200) == 1_200
    assert energy_deltas_mj([100, 150, 10, 40, 40]) == [50, 10, 30, 0]
    assert energy_deltas_mj([5]) == [] and energy_deltas_mj([]) == []


def test_negative_counter_readings_are_refused() -> None:
    with pytest.raises(DataError, match="never negative"):
        energy_delta_mj(-1, 5)
    with pytest.raises(DataError, match="never negative"):
        energy_deltas_mj([5, -3])


def test_deltas_across_a_simulated_driver_restart_add_up() -> None:
    gpus = SimulatedGpus(1, seed=5)
    e0 = gpus.total_energy_mj(0)
    gpus.advance(10.0)
    e1 = gpus.total_energy_mj(0)
    gpus.restart_driver()
    gpus.advance(4.0)
    e2 = gpus.total_energy_mj(0)
    assert e2 < e1  # the counter really restarted: plain subtraction goes negative
    assert energy_deltas_mj([e0, e1, e2]) == [e1 - e0, e2]
    assert e2 == pytest.approx(4.0 * 52_500, rel=0.1)  # idle power since the restart
