"""Samples refuse what a fit would misread; slicing and joining keep them valid."""

from __future__ import annotations

import numpy as np
import pytest

from powerflow.core.errors import DataError
from powerflow.core.models.samples import Samples

FIELDS = ("n", "r", "bs", "f", "step_time_s", "energy_j")


def _valid(m: int, seed: int) -> Samples:
    rng = np.random.default_rng(seed)
    n = 2.0 ** rng.integers(0, 5, m)
    r = np.minimum(n, 2.0 ** rng.integers(0, 4, m))
    return Samples(
        n, r, rng.uniform(1, 64, m), rng.uniform(210, 1410, m), *rng.uniform(0.1, 1, (2, m))
    )


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        (1, np.nan, "NaN"),
        (4, np.inf, "infinite"),
        (5, 0.0, "positive"),
        (2, -1.0, "positive"),
        (1, 64.0, "cannot exceed"),
    ],
)
def test_bad_values_are_refused(column: int, value: float, message: str) -> None:
    cols = [np.asarray(getattr(_valid(8, 0), name)).copy() for name in FIELDS]
    cols[column][3] = value
    with pytest.raises(DataError, match=message):
        Samples(*cols)


def test_columns_of_different_length_are_refused() -> None:
    cols = [getattr(_valid(8, 0), name) for name in FIELDS]
    cols[2] = cols[2][:-1]
    with pytest.raises(DataError, match="length"):
        Samples(*cols)


@pytest.mark.parametrize(
    "index",
    [slice(2, 7), slice(None, None, 2), np.array([5, 0, 3]), np.arange(10) % 3 == 0],
)
def test_take_is_the_rows_of_every_column(index: object) -> None:
    s = _valid(10, 1)
    part = s.take(index)  # type: ignore[arg-type]
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(part, name), getattr(s, name)[index])
    Samples(*(getattr(part, name) for name in FIELDS))  # still valid when checked


def test_take_refuses_an_index_that_is_not_rows() -> None:
    s = _valid(10, 1)
    with pytest.raises(DataError, match="1-D"):
        s.take(3)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="1-D"):
        s.take(np.array([[0, 1], [2, 3]]))


def test_concat_joins_every_column_in_order() -> None:
    parts = [_valid(4, 2), _valid(7, 3), _valid(1, 4)]
    whole = Samples.concat(parts)
    assert len(whole) == 12
    for name in FIELDS:
        np.testing.assert_array_equal(
            getattr(whole, name), np.concatenate([getattr(p, name) for p in parts])
        )
