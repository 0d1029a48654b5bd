"""A read-only look at this machine's GPUs through ``GpuDevices`` (``scripts/nvml_probe.py``).

What it prints is what the node agent will rely on: GPUs and their UUIDs,
the supported clocks, the current SM clock, the power-limit range, and the
energy counter read twice one interval apart (delta and mean power). It
never sets a clock or a limit: safe on a shared or borrowed GPU machine.
A feature one GPU lacks prints as such and the probe goes on; no GPU at all
is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from powerflow.core.devices import GpuDevices, GpuError, GpuUnavailable, energy_delta_mj

EXIT_NO_GPU = 2


def _clocks(devices: GpuDevices, gpu: int) -> str:
    clocks = devices.supported_graphics_clocks_mhz(gpu)
    steps = sorted({b - a for a, b in itertools.pairwise(clocks)})
    step = f", steps {'/'.join(map(str, steps))} MHz" if steps else ""
    return f"{len(clocks)} supported, {clocks[0]}-{clocks[-1]} MHz{step}"


def _sm_clock(devices: GpuDevices, gpu: int) -> str:
    return f"{devices.sm_clock_mhz(gpu)} MHz"


def _power(devices: GpuDevices, gpu: int) -> str:
    return f"{devices.power_mw(gpu) / 1000:.1f} W"


def _limits(devices: GpuDevices, gpu: int) -> str:
    r = devices.power_limit_range_w(gpu)
    limit = devices.power_limit_w(gpu)
    return f"{limit:g} W (range {r.min_w:g}-{r.max_w:g} W, default {r.default_w:g} W)"


FIELDS: tuple[tuple[str, Callable[[GpuDevices, int], str]], ...] = (
    ("graphics clocks", _clocks),
    ("SM clock now", _sm_clock),
    ("power now", _power),
    ("power limit", _limits),
)


def _field(read: Callable[[GpuDevices, int], str], devices: GpuDevices, gpu: int) -> str:
    """One reading, or why it is missing (the probe goes on)."""
    try:
        return read(devices, gpu)
    except GpuError as err:
        return f"unavailable: {err}"


def probe(
    devices: GpuDevices,
    out: TextIO,
    *,
    interval_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Print what ``devices`` reports, reading only (every GPU's energy twice)."""
    gpus = devices.gpus()
    for info in gpus:
        print(f"GPU {info.index}  {info.uuid}  {info.name}", file=out)
        for title, read in FIELDS:
            print(f"  {title}: {_field(read, devices, info.index)}", file=out)

    first: dict[int, tuple[int, float] | GpuError] = {}
    for info in gpus:
        try:
            first[info.index] = (devices.total_energy_mj(info.index), monotonic())
        except GpuError as err:
            first[info.index] = err
    sleep(interval_s)
    for info in gpus:
        start = first[info.index]
        if isinstance(start, GpuError):
            print(f"GPU {info.index} energy: unavailable: {start}", file=out)
            continue
        e0, t0 = start
        try:
            e1, t1 = devices.total_energy_mj(info.index), monotonic()
        except GpuError as err:
            print(f"GPU {info.index} energy: unavailable: {err}", file=out)
            continue
        delta = energy_delta_mj(e0, e1)
        mean = f"{delta / 1000 / (t1 - t0):.1f} W" if t1 > t0 else "n/a"
        print(
            f"GPU {info.index} energy: {e0} mJ -> {e1} mJ over {t1 - t0:.2f} s:"
            f" {delta} mJ, mean power {mean}",
            file=out,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Probe the NVIDIA GPUs of this machine; 2 when there are none."""
    from powerflow.nodeagent.nvml import NvmlGpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--interval-s", type=float, default=1.0, help="between energy readings")
    args = parser.parse_args(argv)
    try:
        devices = NvmlGpus()
    except GpuUnavailable as err:
        print(err, file=sys.stderr)
        return EXIT_NO_GPU
    with devices:
        probe(devices, sys.stdout, interval_s=args.interval_s)
    return 0
