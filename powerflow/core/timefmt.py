"""RFC 3339 timestamps as Kubernetes writes them, to and from epoch seconds.

In the core because more than one component reads them (the operator its
status times, the node agent a pod's ``status.startTime``), and components
never import each other."""

from __future__ import annotations

import datetime
import functools
import time

LATEST_S = 253402300799.0
"""9999-12-31T23:59:59Z: the last instant RFC 3339 (four-digit years) can write."""


def _clamp(epoch_s: float) -> float:
    """Within 1970..9999: an estimate far in the future (a job of 10**12 slow
    iterations) is written as the latest instant instead of raising."""
    if epoch_s != epoch_s:  # NaN (math.isnan would raise on an int past float range)
        return 0.0
    return min(max(epoch_s, 0.0), LATEST_S)


@functools.lru_cache(maxsize=64)  # one loop pass formats the same instant many times
def format_time(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_clamp(epoch_s)))


def parse_time(text: object) -> float | None:
    """Epoch seconds of an RFC 3339 string; ``None`` for anything else (absent or junk)."""
    if not text or not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):
        return None


def format_time_ms(epoch_s: float) -> str:
    """Millisecond precision, for deadlines shorter than a second (profiling windows in tests)."""
    moment = datetime.datetime.fromtimestamp(_clamp(epoch_s), tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
