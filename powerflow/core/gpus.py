"""GPU types: the hardware facts the models and the policy depend on.

A ``GpuSpec`` is plain data. Adding a GPU type means adding one constant and
registering it in ``GPU_SPECS``; nothing else in the core names a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from powerflow.core.errors import DataError


@dataclass(frozen=True)
class GpuSpec:
    """Static facts of one GPU type.

    ``f0_mhz`` is the voltage knee of the paper's energy model: below it the
    core voltage is flat (dynamic power linear in f), above it voltage rises
    with f (dynamic power cubic in f).
    """

    name: str
    clocks_mhz: tuple[int, ...]
    default_clock_mhz: int
    idle_power_w: float
    max_power_w: float
    f0_mhz: int
    # Lowest board power limit the driver accepts (NVML's power-limit
    # constraints); the highest is ``max_power_w``, also the default limit.
    # None: unknown, and the simulated GPU then refuses power limits as NVML
    # does on a board without power management.
    min_power_limit_w: float | None = None
    # The budget's P_max (``eta * G * P_max``): a training job's typical
    # per-GPU power at the top clock, a constant of the GPU type so that the
    # same eta means the same watts whatever the scheduler's models or the job
    # mix (``powerflow.core.policy.budget``). None: the board limit ``max_power_w``.
    reference_power_w: float | None = None

    def __post_init__(self) -> None:
        if not self.clocks_mhz or list(self.clocks_mhz) != sorted(set(self.clocks_mhz)):
            raise DataError(f"{self.name}: clocks must be strictly increasing")
        if self.default_clock_mhz not in self.clocks_mhz:
            raise DataError(f"{self.name}: default clock {self.default_clock_mhz} not supported")
        if not self.clocks_mhz[0] <= self.f0_mhz <= self.clocks_mhz[-1]:
            raise DataError(f"{self.name}: f0 {self.f0_mhz} outside the clock range")
        if not 0 < self.idle_power_w < self.max_power_w:
            raise DataError(f"{self.name}: need 0 < idle power < max power")
        low = self.min_power_limit_w
        if low is not None and not 0 < low <= self.max_power_w:
            raise DataError(f"{self.name}: need 0 < min power limit <= max power")
        ref = self.reference_power_w
        if ref is not None and not self.idle_power_w < ref <= self.max_power_w:
            raise DataError(f"{self.name}: need idle power < reference power <= max power")

    @property
    def p_max_w(self) -> float:
        """The budget's per-GPU ``P_max``: the reference power, else the board limit."""
        return self.max_power_w if self.reference_power_w is None else self.reference_power_w

    @property
    def min_clock_mhz(self) -> int:
        return self.clocks_mhz[0]

    @property
    def max_clock_mhz(self) -> int:
        return self.clocks_mhz[-1]


# A100 SXM4 40GB: 15 MHz steps from 210 to 1410 MHz, 52-53 W idle at the
# lowest clock, 400 W board limit (nvidia-smi -q, see powerflow/data/README.md).
# f0 = 1095 MHz is where the Perseus A100 sweep's dynamic power (power minus
# idle) bends from slope 0.99 to 2.55 in log-log (flat voltage below, rising
# above); powerflow.lab.groundtruth.frequency.voltage_knee_mhz recomputes it and
# tests/test_groundtruth.py checks the two agree.
A100 = GpuSpec(
    name="A100",
    clocks_mhz=tuple(range(210, 1411, 15)),
    default_clock_mhz=1410,
    idle_power_w=52.5,
    max_power_w=400.0,
    f0_mhz=1095,
    min_power_limit_w=100.0,
    # Mean per-GPU power of the six reference workloads (the shipped A100
    # throughput tables' models), each averaged over its table's global batch
    # sizes on one GPU at 1410 MHz, from the ground truth built on the shipped
    # profiles; ``powerflow.lab.groundtruth.reference_power_w`` recomputes it and
    # tests/test_policy_budget.py checks the two agree.
    reference_power_w=300.1,
)

GPU_SPECS: dict[str, GpuSpec] = {A100.name: A100}


def gpu_spec(name: str) -> GpuSpec:
    """Look up a GPU type by name (case-insensitive), with a clear error."""
    for key, spec in GPU_SPECS.items():
        if key.lower() == name.lower():
            return spec
    raise DataError(f"unknown GPU type {name!r}; known: {', '.join(sorted(GPU_SPECS))}")
