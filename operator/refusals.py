"""Writes the API server refused for one job, and the backoff before trying again.

A pod or Service create can be refused for reasons only the cluster knows:
admission (PodSecurity, quota: 403), validation (422), a name taken by an
object PowerFlow did not create (409). Retrying at once would hammer the API
server and flood the job with events, and failing the whole pass would stop
every other job. So ``Kube.apply`` returns the refusals, the next pass
(``reconcile``, pure) turns them into a condition and a Warning event on that
job and records the backoff in its status (``createRefusals``,
``lastCreateRefusalTime``), where a restarted operator finds it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

BACKOFF_S = 10.0
"""Wait after the first refused create; doubles with each refusal in a row."""
MAX_BACKOFF_S = 300.0


@dataclass(frozen=True)
class Refusal:
    """One write of one job's object that the API server answered with a 4xx Status."""

    namespace: str
    job: str
    verb: str  # create | delete | patch
    kind: str  # Pod | Service | DLJob
    name: str
    code: int
    reason: str
    message: str

    @property
    def job_key(self) -> str:
        return f"{self.namespace}/{self.job}"


def by_job(refusals: Iterable[Refusal]) -> dict[str, list[Refusal]]:
    out: dict[str, list[Refusal]] = defaultdict(list)
    for refusal in refusals:
        out[refusal.job_key].append(refusal)
    return dict(out)


def backoff_s(refusals_in_a_row: int) -> float:
    """Exponential in the refusals in a row, capped (the exponent too: any count is safe)."""
    return min(MAX_BACKOFF_S, BACKOFF_S * 2.0 ** min(max(refusals_in_a_row - 1, 0), 32))
