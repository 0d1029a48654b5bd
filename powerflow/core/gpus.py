"""GPU types: the hardware facts the models and the policy depend on.

A ``GpuSpec`` is plain data. The A100 is a constant here because the
simulator's ground truth and every evaluation are built on it; every other type
comes from the catalogue ``powerflow/data/gpus.json``, read once at import.
The catalogue is a data file rather than Python constants so that each number
sits beside the public source it comes from (``powerflow/data/README.md``
lists them), and the loader refuses a number whose source is neither listed
nor "estimated". What no source publishes is estimated by the rules below,
each a ratio of the A100's measured facts, and the spec names the estimated
fields in ``estimated``. Nothing else in the core names a GPU.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

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
    # The product names NVML reports for this type (``nvmlDeviceGetName``, as
    # ``nvidia-smi -q`` prints "Product Name"): ``gpu_spec`` finds the type by them.
    nvml_names: tuple[str, ...] = ()
    # The fields whose values no public source gives, estimated by this
    # module's rules (``ESTIMATION_RULES``); empty for a fully measured type.
    estimated: tuple[str, ...] = ()

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
    nvml_names=("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
)

# The estimation rules: where no public source gives a fact, it is the
# A100's ratio applied to the type's published board limit or max clock. The
# ratios hold the A100's own facts, so a rule never changes the A100.
IDLE_FRACTION = A100.idle_power_w / A100.max_power_w
"""Idle power at the lowest clock per watt of board limit (A100: 52.5 / 400)."""
MIN_LIMIT_FRACTION = (A100.min_power_limit_w or 0.0) / A100.max_power_w
"""Lowest accepted power limit per watt of board limit (A100: 100 / 400)."""
KNEE_FRACTION = A100.f0_mhz / A100.max_clock_mhz
"""Voltage knee f0 per MHz of max clock (A100: 1095 / 1410), rounded to a supported clock."""
REFERENCE_FRACTION = A100.p_max_w / A100.max_power_w
"""The budget's P_max per watt of board limit (A100: 300.1 / 400): the A100's rule
(typical training power at the top clock) needs measured throughput tables no other
type has (on the H100's synthetic ground truth it gives this same ratio)."""

ESTIMATION_RULES: Mapping[str, str] = {
    "idle_power_w": f"board limit x {IDLE_FRACTION:.4f} (the A100's idle / board limit)",
    "min_power_limit_w": f"board limit x {MIN_LIMIT_FRACTION:.2f} (the A100's min / board limit)",
    "f0_mhz": f"the supported clock nearest max clock x {KNEE_FRACTION:.4f} (the A100's f0 / max)",
    "reference_power_w": (
        f"board limit x {REFERENCE_FRACTION:.4f} (the A100's reference power / board limit)"
    ),
    "max_power_w": "the highest per-GPU power in the samples (no board limit known)",
    "clocks_mhz": "the architecture's lowest clock and step, up to the published max clock",
}
"""Each estimated field's rule, as ``GpuSpec.estimated`` names the fields."""

CATALOGUE_FILE = "gpus.json"
ESTIMATED = "estimated"


def knee_clock(clocks_mhz: Sequence[int]) -> int:
    """The estimated voltage knee: the clock nearest the A100's fraction of the max."""
    target = KNEE_FRACTION * clocks_mhz[-1]
    return min(clocks_mhz, key=lambda f: (abs(f - target), f))


def estimated_spec(
    name: str,
    clocks_mhz: Sequence[int],
    max_power_w: float,
    *,
    idle_power_w: float | None = None,
    min_power_limit_w: float | None = None,
    nvml_names: tuple[str, ...] = (),
    estimated: tuple[str, ...] = (),
) -> GpuSpec:
    """A type from its clocks and board limit, the rest by ``ESTIMATION_RULES``.

    The default clock is the max clock, as the A100's: GPU Boost runs training
    at the top clock unless power or heat hold it back.
    """
    clocks = tuple(clocks_mhz)
    if not clocks:
        raise DataError(f"{name}: no clocks")
    guessed = [*estimated, "f0_mhz", "reference_power_w"]
    if idle_power_w is None:
        idle_power_w = round(IDLE_FRACTION * max_power_w, 1)
        guessed.append("idle_power_w")
    if min_power_limit_w is None:
        min_power_limit_w = round(MIN_LIMIT_FRACTION * max_power_w, 1)
        guessed.append("min_power_limit_w")
    return GpuSpec(
        name=name,
        clocks_mhz=clocks,
        default_clock_mhz=clocks[-1],
        idle_power_w=idle_power_w,
        max_power_w=max_power_w,
        f0_mhz=knee_clock(clocks),
        min_power_limit_w=min_power_limit_w,
        reference_power_w=round(REFERENCE_FRACTION * max_power_w, 1),
        nvml_names=nvml_names,
        estimated=tuple(f for f in ESTIMATION_RULES if f in guessed),
    )


def clock_range(lowest_mhz: float, highest_mhz: int, step_mhz: float) -> tuple[int, ...]:
    """Graphics clocks ``step`` apart, rounded down to whole MHz as NVML lists them.

    Volta's list is 7.5 MHz apart (1530, 1522, 1515, ...); the later
    architectures' 15 MHz. The highest must lie on the step grid.
    """
    count = (highest_mhz - lowest_mhz) / step_mhz
    if count < 0 or count != int(count):
        raise DataError(f"max clock {highest_mhz} is not {lowest_mhz} + k x {step_mhz} MHz")
    return tuple(math.floor(lowest_mhz + k * step_mhz) for k in range(int(count) + 1))


def _fact(entry: Mapping[str, Any], key: str, sources: Mapping[str, str], where: str) -> Any:
    """A cited value: ``{"value", "source"}``; None where the source says estimated."""
    fact = entry.get(key)
    if not isinstance(fact, dict) or "source" not in fact:
        raise DataError(f"{where}: {key} needs a source")
    source = fact["source"]
    if source != ESTIMATED and source not in sources:
        raise DataError(f"{where}: {key} cites {source!r}, not a listed source")
    if source != ESTIMATED and "value" not in fact:
        raise DataError(f"{where}: {key} cites {source!r} but has no value")
    return fact.get("value") if source != ESTIMATED else None


def _clock_fact(arch: Mapping[str, Any], key: str, sources: Mapping[str, str], where: str) -> Any:
    """An architecture's clock fact: estimated ones carry their value too."""
    value = _fact(arch, key, sources, where)
    return value if value is not None else arch[key].get("value")


def parse_catalogue(doc: Mapping[str, Any]) -> list[GpuSpec]:
    """The catalogue's specs, every number checked against its listed source."""
    try:
        sources: Mapping[str, str] = doc["sources"]
        archs: Mapping[str, Any] = doc["architectures"]
        specs: list[GpuSpec] = []
        for entry in doc["gpus"]:
            name = str(entry["name"])
            where = f"{CATALOGUE_FILE}: {name}"
            arch = archs[entry["architecture"]]
            lowest = _clock_fact(arch, "lowest_clock_mhz", sources, where)
            step = _clock_fact(arch, "step_mhz", sources, where)
            top = _fact(entry, "max_clock_mhz", sources, where)
            board = _fact(entry, "max_power_w", sources, where)
            if lowest is None or step is None or top is None or board is None:
                raise DataError(f"{where}: clocks and the board limit need values")
            guessed = (
                ["clocks_mhz"]
                if ESTIMATED in {arch["lowest_clock_mhz"]["source"], arch["step_mhz"]["source"]}
                else []
            )
            idle = _fact(entry, "idle_power_w", sources, where)
            low = _fact(entry, "min_power_limit_w", sources, where)
            specs.append(
                estimated_spec(
                    name,
                    clock_range(lowest, int(top), step),
                    float(board),
                    idle_power_w=None if idle is None else float(idle),
                    min_power_limit_w=None if low is None else float(low),
                    nvml_names=tuple(str(n) for n in entry["nvml_names"]),
                    estimated=tuple(guessed),
                )
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{CATALOGUE_FILE}: malformed ({exc!r})") from exc
    return specs


def load_catalogue() -> list[GpuSpec]:
    """The package's catalogue (package data, no other I/O)."""
    text = resources.files("powerflow").joinpath("data", CATALOGUE_FILE).read_text("utf-8")
    return parse_catalogue(json.loads(text))


def _registry(specs: Sequence[GpuSpec]) -> dict[str, GpuSpec]:
    """Specs by name, every name and NVML name unique (case-insensitive)."""
    seen: set[str] = set()
    for spec in specs:
        for key in {k.lower() for k in (spec.name, *spec.nvml_names)}:
            if key in seen:
                raise DataError(f"GPU name {key!r} names two catalogue types")
            seen.add(key)
    return {spec.name: spec for spec in specs}


GPU_SPECS: dict[str, GpuSpec] = _registry([A100, *load_catalogue()])


def gpu_spec(name: str) -> GpuSpec:
    """A type by its name or an NVML product name (case-insensitive), with a clear error."""
    wanted = name.strip().lower()
    for spec in GPU_SPECS.values():
        if wanted in (key.lower() for key in (spec.name, *spec.nvml_names)):
            return spec
    raise DataError(f"unknown GPU type {name!r}; known: {', '.join(sorted(GPU_SPECS))}")


def _label_key(text: str) -> str:
    return "-".join(text.split()).lower()


SHARED_SUFFIX = "-shared"
"""What GPU feature discovery appends to the product label of a time-sliced GPU
(``renameByDefault: false``): the same board, so the same type."""


def gpu_for_product(label: str | None) -> GpuSpec | None:
    """The catalogue type of a node's ``nvidia.com/gpu.product`` label, or None.

    GPU feature discovery writes the NVML product name with every space replaced
    by a dash (``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``), so the
    label is compared with each type's name and NVML names in that form,
    case-insensitively, whole: a label that merely contains a type's name
    (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``, a MIG slice with clocks and limits
    of its own) is not that type. None: no label, or a product the catalogue
    does not know.
    """
    key = _label_key(label or "")
    if key.endswith(SHARED_SUFFIX):
        key = key[: -len(SHARED_SUFFIX)]
    if not key:
        return None
    for spec in GPU_SPECS.values():
        if key in (_label_key(k) for k in (spec.name, *spec.nvml_names)):
            return spec
    return None


UNKNOWN_GPU = "unknown"
"""The name of ``unknown_gpu``'s placeholder spec."""
UNKNOWN_CLOCK_MHZ = A100.max_clock_mhz
"""The one clock the placeholder plans at: the profiled type's top clock, where the
shipped priors predict time and power. It is never written to a GPU."""
LARGEST_P_MAX_W = max(spec.max_power_w for spec in GPU_SPECS.values())
"""The catalogue's largest board limit: what a GPU of unknown power counts in the budget."""


def unknown_gpu(board_limit_w: float | None = None) -> GpuSpec:
    """The placeholder a GPU of unknown type is planned as: GPU counts only.

    One clock (``UNKNOWN_CLOCK_MHZ``), so the policy chooses none; no power-limit
    range, so it sets no cap; and ``P_max`` (``p_max_w``, the budget's per-GPU
    power) at the GPU's board limit where the node agent reported it, else the
    catalogue's largest (``LARGEST_P_MAX_W``): a GPU left at its defaults may draw
    up to its board limit, so the budget counts it at the most it can be.
    The components write no clock or cap for it (``tunes``).
    """
    limit = LARGEST_P_MAX_W if board_limit_w is None else board_limit_w
    return GpuSpec(
        name=UNKNOWN_GPU,
        clocks_mhz=(UNKNOWN_CLOCK_MHZ,),
        default_clock_mhz=UNKNOWN_CLOCK_MHZ,
        idle_power_w=round(IDLE_FRACTION * limit, 1),
        max_power_w=limit,
        f0_mhz=UNKNOWN_CLOCK_MHZ,
        reference_power_w=limit,
        estimated=tuple(ESTIMATION_RULES),
    )


def tunes(spec: GpuSpec) -> bool:
    """Whether PowerFlow sets clocks and power limits on this type (not the placeholder)."""
    return spec.name != UNKNOWN_GPU


def planned_gpu(product: str | None, discovered: GpuSpec | None = None) -> GpuSpec:
    """The type a node is planned as: what its agent ``discovered``, else its product
    label's catalogue type, else ``unknown_gpu`` (GPU counts only). No type is guessed
    from another, so one type's clocks never reach another's GPUs."""
    if discovered is not None:
        return discovered
    known = gpu_for_product(product)
    return known if known is not None else unknown_gpu()
