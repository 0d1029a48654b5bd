"""How long a component waits before it asks a failing API server again.

A retry at a fixed second is what keeps an API server down: when it answers 429
or 500 because it is overloaded (an etcd leader election, an upgrade, API
Priority and Fairness shedding load), every node agent's watch and the
operator's pass would come back each second, a thousand nodes' agents two
thousand requests a second. client-go's informers back off instead (the
reflector: 800 ms doubling to 30 s, with jitter) and its REST client waits out
a ``Retry-After``; ``Backoff`` does both for the loops that use the
``kubernetes`` client here (the shared watch, the operator's allocation pass).
That client (urllib3's default ``Retry``) already waits out the ``Retry-After`` of
up to three 413, 429 or 503 answers within one GET, PUT or DELETE (not a PATCH or
a POST, which it never sends twice); what it raises after carries the last
answer's, which ``asked_wait_s`` reads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

RETRY_AFTER_MAX_S = 30
"""The longest one ``Retry-After`` is waited out: a header asking for more is read as
this (an API server asks for 1 s, or a few)."""


def retry_after_s(status: int | None, header: str | None) -> int | None:
    """The whole seconds a 429 or 5xx answer's ``Retry-After`` asks to wait (at most
    ``RETRY_AFTER_MAX_S``), or None: another status, no header, or not a number of
    seconds (an HTTP date, which kube-apiserver never sends, is not waited for)."""
    if status is None or (status != 429 and status // 100 != 5):
        return None
    raw = (header or "").strip()
    if not (raw.isascii() and raw.isdecimal()):  # ``isdigit`` would take "²"
        return None
    if len(raw) > 9:  # more than ``RETRY_AFTER_MAX_S``, and ``int`` refuses 5,000 digits
        return RETRY_AFTER_MAX_S
    return min(int(raw), RETRY_AFTER_MAX_S)


def asked_wait_s(exc: BaseException) -> int | None:
    """The ``Retry-After`` of the API server's answer that ``exc`` carries (a
    ``kubernetes`` client ``ApiException``: its ``status`` and ``headers``), or the
    longest among the errors of an ``errors`` list it carries (the operator's
    ``WritesFailed``); None when none asks."""
    errors = getattr(exc, "errors", None)
    asked: list[int] = []
    for one in [exc, *(errors if isinstance(errors, list) else ())]:
        headers = getattr(one, "headers", None)
        status = getattr(one, "status", None)
        if headers is None or not isinstance(status, int):
            continue
        wait = retry_after_s(status, headers.get("Retry-After"))
        if wait is not None:
            asked.append(wait)
    return max(asked, default=None)


@dataclass
class Backoff:
    """Waits between the tries of one thing that keeps failing.

    The first wait is ``first_s``; each failure in a row doubles it, up to
    ``max_s``; a success starts over. A wait is drawn from ``[w, w * (1 +
    jitter)]`` (``rng``), so that many clients that failed together do not come
    back together; a ``Retry-After`` longer than the wait is waited out instead.
    """

    first_s: float = 1.0
    max_s: float = 30.0
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0
    """Failures in a row so far."""

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s or self.jitter < 0:
            raise ValueError(
                f"back-off needs 0 < first_s <= max_s and jitter >= 0, got first_s"
                f" {self.first_s}, max_s {self.max_s}, jitter {self.jitter}"
            )

    def failed(self, asked_s: float | None = None) -> float:
        """One more failure: the seconds to wait before the next try (``asked_s``: what
        the server's ``Retry-After`` asked for, if anything)."""
        self.failures += 1
        wait = min(self.first_s * 2.0 ** min(self.failures - 1, 64), self.max_s)
        if self.jitter:
            wait *= 1.0 + self.jitter * self.rng.random()
        return max(wait, float(asked_s)) if asked_s is not None else wait

    def succeeded(self) -> None:
        """A try went through: the next failure waits ``first_s`` again."""
        self.failures = 0
