"""RFC 3339 timestamps as Kubernetes writes them, to and from epoch seconds."""

from __future__ import annotations

import datetime
import functools
import time


@functools.lru_cache(maxsize=64)  # one loop pass formats the same instant many times
def format_time(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_time_ms(epoch_s: float) -> str:
    """Millisecond precision, for deadlines shorter than a second (profiling windows in tests)."""
    moment = datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
