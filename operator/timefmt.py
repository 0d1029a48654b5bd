"""RFC 3339 timestamps as Kubernetes writes them, to and from epoch seconds."""

from __future__ import annotations

import datetime
import functools


@functools.lru_cache(maxsize=64)  # one loop pass formats the same instant many times
def format_time(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
