"""Fitted parameters of the performance models, as frozen data with a JSON form.

Why a fixed, flat layout: the fitting code packs each parameter group into one
numpy vector for ``scipy.optimize.least_squares`` and unpacks it again, and the
operator stores the result in a ConfigMap as JSON. Field order is the vector
order; ``BOUNDS`` gives each field's admissible range (the bounds are what keep
every prediction finite and positive, see ``tests/test_models_properties.py``).

Units: times in seconds, the core clock in GHz inside the throughput terms
(so that ``k_grad / f`` and ``b_grad`` have similar magnitudes), powers in
watts, the energy shape parameters dimensionless.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Self, TypeVar

import numpy as np

from powerflow.core.errors import ModelError
from powerflow.core.models.protocol import FloatArray

SCHEMA_VERSION = 4
"""Version 4: the energy model charges the fixed per-step time ``a_grad`` at
the light (synchronisation) power instead of the compute power
(``throughput.power_phases``); the fields are version 3's. Version 3 added
``ThroughputParams.sync_hop_s`` (the latency of each hop of the intra-node
ring) to the ring all-reduce form of version 2 (``throughput.t_sync``).
Parameters of versions 2 and 3 were fitted with ``a_grad`` at compute power,
so their energy parameters mean something else, and version 1 held the
paper's linear sync form: ``ModelParams.from_dict`` refuses all three with a
clear error, and the operator then refits the job from its prior."""


_NAMES: dict[type, tuple[str, ...]] = {}
"""Each parameter group's field names in vector order (``_Vector.names``), looked
up once: every fit builds, validates and packs its two groups, where
``dataclasses.fields`` cost more than the rest of that. With ``_CHECKS``, one
``ModelParams`` takes 3.7-3.8 us to build from its two vectors instead of 6.4 us
(``timeit`` of ``ModelParams("A100", ThroughputParams.from_vector(t),
EnergyParams.from_vector(e))``, best of 5)."""
_CHECKS: dict[type, tuple[tuple[str, float, float], ...]] = {}
"""``(name, lo, hi)`` per field of each parameter group (``_Vector.validate``)."""


class _Vector:
    """Packing into and out of the optimiser's flat vector."""

    BOUNDS: ClassVar[dict[str, tuple[float, float]]]
    SCALE_FLOOR: ClassVar[dict[str, float]]

    def to_vector(self) -> FloatArray:
        return np.array([getattr(self, name) for name in self.names()], dtype=np.float64)

    @classmethod
    def from_vector(cls, x: FloatArray) -> Self:
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        if len(x) != len(names):
            raise ModelError(f"{cls.__name__}: expected {len(names)} values, got {len(x)}")
        return cls(**{k: float(v) for k, v in zip(names, x, strict=True)})

    @classmethod
    def names(cls) -> tuple[str, ...]:
        names = _NAMES.get(cls)
        if names is None:
            names = _NAMES[cls] = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        return names

    @classmethod
    def bounds(cls) -> tuple[FloatArray, FloatArray]:
        lo = np.array([cls.BOUNDS[k][0] for k in cls.names()])
        hi = np.array([cls.BOUNDS[k][1] for k in cls.names()])
        return lo, hi

    @classmethod
    def scale_floor(cls) -> FloatArray:
        """Smallest scale of each parameter, for the relative pull to a prior."""
        return np.array([cls.SCALE_FLOOR[k] for k in cls.names()])

    def validate(self) -> None:
        cls = type(self)
        checks = _CHECKS.get(cls)
        if checks is None:
            checks = _CHECKS[cls] = tuple((name, *cls.BOUNDS[name]) for name in cls.names())
        for name, lo, hi in checks:
            value = getattr(self, name)
            if not (math.isfinite(value) and lo <= value <= hi):
                raise ModelError(f"{type(self).__name__}.{name}={value} outside [{lo}, {hi}]")


_V = TypeVar("_V", bound="_Vector")


@dataclass(frozen=True)
class ThroughputParams(_Vector):
    """Step-time model of paper §4.1 (times in s, ``f`` in GHz, ``bs`` in samples).

    ``T_IO = a_io + b_io*bs*r``; ``T_grad = a_grad + (b_grad + k_grad/f)*bs``;
    ``T_sync = (sync_local_s*2(r-1)/r + sync_node_s*2(k-1)/k + sync_step_s*log2(n)
    + sync_hop_s*2(r-1)) * ((1 - sync_clock_share) + sync_clock_share/f)`` on
    ``n`` GPUs over ``k = ceil(n/r)`` nodes (0 on one GPU): a hierarchical ring
    all-reduce's traffic inside and across nodes, a per-doubling latency, and
    the latency of the intra-node ring's ``2(r-1)`` hops, in seconds at 1 GHz
    (see ``throughput.t_sync`` for why this replaces the paper's linear form);
    ``gamma1``/``gamma2`` blend sum and max. ``sync_hop_s`` comes last (and
    defaults to 0) so that version 2 vectors keep their positions.
    """

    a_io: float
    b_io: float
    a_grad: float
    b_grad: float
    k_grad: float
    sync_local_s: float
    sync_node_s: float
    sync_step_s: float
    sync_clock_share: float
    gamma1: float
    gamma2: float
    sync_hop_s: float = 0.0

    # k_grad > 0 keeps T_grad, hence T_iter, strictly positive for bs > 0.
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "a_io": (0.0, math.inf),
        "b_io": (0.0, math.inf),
        "a_grad": (0.0, math.inf),
        "b_grad": (0.0, math.inf),
        "k_grad": (1e-9, math.inf),
        "sync_local_s": (0.0, math.inf),
        "sync_node_s": (0.0, math.inf),
        "sync_step_s": (0.0, math.inf),
        "sync_clock_share": (0.0, 1.0),
        "gamma1": (1.0, 12.0),
        "gamma2": (1.0, 12.0),
        "sync_hop_s": (0.0, math.inf),
    }
    SCALE_FLOOR: ClassVar[dict[str, float]] = {
        **{
            k: 1e-3
            for k in ("a_io", "a_grad", "sync_local_s", "sync_node_s", "sync_step_s", "sync_hop_s")
        },
        **{k: 1e-5 for k in ("b_io", "b_grad", "k_grad")},
        "sync_clock_share": 0.1,
        "gamma1": 1.0,
        "gamma2": 1.0,
    }


@dataclass(frozen=True)
class EnergyParams(_Vector):
    """Power model of paper §4.2 (powers in W at the knee ``f0``, shapes dimensionless).

    ``P_grad = p_grad_w * kappa_grad(f) * (1 + grad_log_alpha*log(bs + grad_log_theta))``
    ``P_sync = p_sync_w * kappa_sync(f)``
    ``P_static = p_static_w`` below ``f0``, ``p_static_w*(1 + static_high_slope*(f/f0-1))``
    above, where ``kappa(f) = (1-s) + s*f/f0`` below ``f0`` and
    ``1 + s*x + c2*x**2 + c3*x**3`` with ``x = f/f0 - 1`` above (see ``energy.py``).
    """

    p_grad_w: float
    grad_log_alpha: float
    grad_log_theta: float
    grad_low_slope: float
    grad_high_c2: float
    grad_high_c3: float
    p_sync_w: float
    sync_low_slope: float
    sync_high_c2: float
    sync_high_c3: float
    p_static_w: float
    static_high_slope: float

    # Non-negative shapes and a static floor of 1 W keep every power positive.
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "p_grad_w": (0.0, math.inf),
        "grad_log_alpha": (0.0, math.inf),
        "grad_log_theta": (1.0, 1e4),
        "grad_low_slope": (0.0, 1.0),
        "grad_high_c2": (0.0, math.inf),
        "grad_high_c3": (0.0, math.inf),
        "p_sync_w": (0.0, math.inf),
        "sync_low_slope": (0.0, 1.0),
        "sync_high_c2": (0.0, math.inf),
        "sync_high_c3": (0.0, math.inf),
        "p_static_w": (1.0, math.inf),
        "static_high_slope": (0.0, math.inf),
    }
    SCALE_FLOOR: ClassVar[dict[str, float]] = {
        "p_grad_w": 10.0,
        "grad_log_alpha": 0.1,
        "grad_log_theta": 1.0,
        "grad_low_slope": 0.1,
        "grad_high_c2": 0.5,
        "grad_high_c3": 0.5,
        "p_sync_w": 10.0,
        "sync_low_slope": 0.1,
        "sync_high_c2": 0.5,
        "sync_high_c3": 0.5,
        "p_static_w": 10.0,
        "static_high_slope": 0.1,
    }


@dataclass(frozen=True)
class ModelParams:
    """Everything needed to predict one job on one GPU type.

    ``gpu`` names the ``GpuSpec`` whose knee ``f0`` the energy terms use;
    ``model`` is an optional label (the DNN the parameters were fitted to).
    """

    gpu: str
    throughput: ThroughputParams
    energy: EnergyParams
    model: str | None = None

    def __post_init__(self) -> None:
        self.throughput.validate()
        self.energy.validate()

    def vectors(self) -> tuple[FloatArray, FloatArray]:
        """The throughput and energy groups as the kernels' flat vectors."""
        return self.throughput.to_vector(), self.energy.to_vector()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            "gpu": self.gpu,
            "model": self.model,
            "throughput": asdict(self.throughput),
            "energy": asdict(self.energy),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelParams:
        try:
            version = data.get("version")
            if version == 1:
                raise ModelError(
                    "parameters of version 1 (the paper's linear sync form) do not "
                    f"translate to version {SCHEMA_VERSION} (ring all-reduce sync): refit them"
                )
            if version in (2, 3):
                raise ModelError(
                    f"parameters of version {version} charge the per-step overhead at "
                    f"compute power; their energy terms do not translate to version "
                    f"{SCHEMA_VERSION}: refit them"
                )
            if version != SCHEMA_VERSION:
                raise ModelError(f"unsupported parameter version {version!r}")
            tp = _group(ThroughputParams, data["throughput"])
            ep = _group(EnergyParams, data["energy"])
            model = data.get("model")
            return cls(
                gpu=str(data["gpu"]),
                throughput=tp,
                energy=ep,
                model=None if model is None else str(model),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ModelError(f"malformed model parameters: {exc!r}") from exc

    @classmethod
    def from_json(cls, text: str) -> ModelParams:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelError(f"model parameters are not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ModelError("model parameters must be a JSON object")
        return cls.from_dict(data)


def _group(cls: type[_V], data: dict[str, Any]) -> _V:
    names = cls.names()
    missing = set(names) - set(data)
    extra = set(data) - set(names)
    if missing or extra:
        raise ModelError(f"{cls.__name__}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    return cls.from_vector(np.array([float(data[k]) for k in names]))
