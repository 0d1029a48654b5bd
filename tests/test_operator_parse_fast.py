"""``parse_dljob``'s shortcuts (``jobs._int``'s fast path, ``records.filled``) give what
the plain checks and the dataclass's own ``__init__`` give."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import pytest
from powerflow.operator import jobs
from powerflow.operator.jobs import BOUNDS, JobRequest, parse_dljob

from powerflow.core.errors import ResourceError


def plain_int(spec: dict[str, Any], path: str, default: int | None = None) -> int:
    """``_int`` without its fast path."""
    value: Any = spec
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        if default is None:
            raise ResourceError("MissingField", f"spec.{path} is required")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResourceError(
            "InvalidField", f"spec.{path} must be an integer, got {jobs._short(value)}"
        )
    low, high = BOUNDS[path]
    if not low <= value <= high:
        raise ResourceError(
            "InvalidField", f"spec.{path} must be in {low}..{high}, got {jobs._short(value)}"
        )
    return value


class Small(enum.IntEnum):
    ONE = 1


class MyInt(int):
    pass


def outcome(fn: Any, *args: Any) -> Any:
    try:
        value = fn(*args)
    except ResourceError as exc:
        return ("refused", exc.reason, str(exc))
    return ("value", type(value), value)


@pytest.mark.parametrize("path", sorted(BOUNDS))
def test_int_fast_path_answers_as_the_checks(path: str) -> None:
    low, high = BOUNDS[path]
    values: list[Any] = [
        None, True, False, 0, 1, -1, low, low - 1, high, high + 1, 10**30, 1.0, 2.5, "3",
        [], {}, Small.ONE, MyInt(1), MyInt(high + 1),
    ]  # fmt: skip
    head, _, tail = path.partition(".")
    for value in values:
        spec: dict[str, Any] = {head: {tail: value}} if tail else {head: value}
        for default in (None, 7):
            assert outcome(jobs._int, spec, path, default) == outcome(
                plain_int, spec, path, default
            ), (path, value, default)
        if tail:  # the group itself absent or not an object
            for group in (None, 5, "x"):
                assert outcome(jobs._int, {head: group}, path, 3) == outcome(
                    plain_int, {head: group}, path, 3
                )


def body(i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "globalBatchSize": 256 * (1 + i % 3),
        "iterations": 1000 + i,
        "gpus": {"requested": 1 << (i % 3), "min": 1, "max": 8},
        "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
    }
    if i % 2:
        spec.update(
            maxLocalBatchSize=512, model="gpt2", masterPort=1234 + i,
            terminationGracePeriodSeconds=i, restart={"limit": i, "backoffSeconds": 1},
        )  # fmt: skip
    meta = {"name": f"j{i}", "namespace": "ml", "uid": f"u{i}", "generation": 1 + i}
    if i % 3 == 0:
        meta["creationTimestamp"] = "2026-01-02T03:04:05Z"
    return {"metadata": meta, "spec": spec}


@pytest.mark.parametrize("i", range(12))
def test_request_is_the_dataclass_own(i: int) -> None:
    request = parse_dljob(body(i))  # type: ignore[arg-type]
    fields = {f.name for f in dataclasses.fields(JobRequest)}
    assert set(vars(request)) == fields
    plain = JobRequest(**vars(request))
    assert request == plain
    assert vars(request) == vars(plain)
    assert type(request) is JobRequest
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.name = "other"  # type: ignore[misc]
    assert hash(request) == hash(plain)
    assert request.key == f"ml/j{i}"


FIELDS = [
    ("globalBatchSize",), ("iterations",), ("gpus", "requested"), ("gpus", "min"),
    ("gpus", "max"), ("maxLocalBatchSize",), ("masterPort",),
    ("terminationGracePeriodSeconds",), ("restart", "limit"), ("restart", "backoffSeconds"),
    ("restart", "maxBackoffSeconds"),
]  # fmt: skip
ODD: list[Any] = [None, True, 0, -1, 1, 3, 64, 65535, 65536, 86400, 86401, 1 << 24, (1 << 24) + 1,
                  10**12, 10**12 + 1, 2.0, "8", Small.ONE, MyInt(2)]  # fmt: skip


def odd_body(rng: Any) -> dict[str, Any]:
    """``body`` with up to three integer fields set to odd values, removed, or their
    group replaced; a template sometimes broken too (which refusal comes first)."""
    out = body(rng.randrange(12))
    spec = out["spec"]
    for _ in range(rng.randrange(4)):
        path = rng.choice(FIELDS)
        where = spec
        if len(path) == 2:
            if rng.random() < 0.1:
                spec[path[0]] = rng.choice([None, 5, "x", MyDict()])
                continue
            where = spec.setdefault(path[0], {})
            if not isinstance(where, dict):
                continue
        if rng.random() < 0.2:
            where.pop(path[-1], None)
        else:
            where[path[-1]] = rng.choice(ODD)
    if rng.random() < 0.1:
        spec["template"] = {"spec": {"containers": []}}
    return out


class MyDict(dict):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize("seed", range(4))
def test_integer_fields_at_once_answer_as_field_by_field(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_plain_ints`` (every integer field in one call) gives ``parse_dljob`` the same
    request, or the same refusal, as ``_int`` field by field."""
    import random

    rng = random.Random(seed)
    bodies = [odd_body(rng) for _ in range(400)]
    fast = [outcome(parse_dljob, b) for b in bodies]
    monkeypatch.setattr(jobs, "_plain_ints", lambda spec: None)
    slow = [outcome(parse_dljob, b) for b in bodies]
    assert fast == slow
    assert sum(o[0] == "value" for o in fast) > 100  # both kinds of outcome are covered
    assert sum(o[0] == "refused" for o in fast) > 100
