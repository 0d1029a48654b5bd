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
