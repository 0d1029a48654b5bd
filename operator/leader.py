"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection.

Two replicas of the operator must never both act: each would create, delete
and patch on its own plan. kopf's peering pauses only kopf's own watchers,
not the allocation loop (an asyncio task), so the operator runs kopf
standalone and elects a leader itself; only the leader runs allocation
passes, a follower only tries to acquire.

The Lease's ``spec`` is the election record: ``holderIdentity``,
``leaseDurationSeconds``, ``acquireTime``, ``renewTime``,
``leaseTransitions``. As in client-go:

- A candidate takes the Lease when it is free (no holder: released) or
  expired. Expiry is judged on the candidate's own clock: the record must not
  change for ``leaseDurationSeconds`` after this candidate first saw it, so
  clock skew between machines does not matter.
- Every write carries the ``resourceVersion`` read just before (a ``PUT``):
  of two candidates racing for the same record, the API server lets one win
  (409 for the other).
- The leader renews every ``retry_period_s``; when no renewal succeeded for
  ``renew_deadline_s`` (< the lease duration), it steps down at once:
  ``wait_lost`` returns and the controller cancels its pass, before any other
  candidate may consider the Lease expired. As in client-go, a renewal counts
  from the START of its try (the Lease was written some time after), a leader
  waits for a try only as long as its last renewal still covers, and a success
  that arrives later than the deadline counts for nothing: the leader stops
  acting at ``last renewal + renew_deadline_s`` at the latest, however the API
  server behaves.
- On a clean shutdown the leader releases the Lease (empty holder, duration
  1 s), so a successor takes over without waiting for the expiry.

Calls of the synchronous ``kubernetes`` client run in a thread of the elector's
own (one try at a time), not in asyncio's shared pool: a pass's writes (hundreds of
pod creations behind a slow admission webhook) fill that pool, and a renewal queued
behind them would miss its deadline and step a healthy leader down. A call that
outlives the renew deadline cannot be interrupted, but the loop stops acting
regardless.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import kubernetes
from powerflow.operator.kube import call_json as _json

T = TypeVar("T")
log = logging.getLogger(__name__)


def default_identity() -> str:
    """``<hostname>_<random>``: the pod name, unique across restarts (as client-go)."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    duration_s: int = 15
    """``leaseDurationSeconds``: how long followers wait for a silent leader."""
    renew_deadline_s: float = 10.0
    """The leader steps down when it could not renew for this long."""
    retry_period_s: float = 2.0
    """How often candidates try to acquire and the leader renews."""

    @classmethod
    def scaled(cls, namespace: str, name: str, identity: str, duration_s: int) -> LeaseConfig:
        """client-go's ratios (15 s / 10 s / 2 s) for another lease duration."""
        return cls(namespace, name, identity, duration_s, duration_s * 2 / 3, duration_s / 7.5)


def _micro_time(now: datetime.datetime) -> str:
    """A ``MicroTime`` as the API server writes it."""
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate. ``run`` forever (cancel to stop: a leader releases the Lease)."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        config: LeaseConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.coordination = kubernetes.client.CoordinationV1Api(api)
        self.clock = clock
        self.transitions = 0
        """How often this candidate became leader."""
        self._leading = asyncio.Event()
        self._following = asyncio.Event()
        self._following.set()
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="powerflow-lease"
        )
        """Where the Lease's calls run (see the module): never behind other work."""
        self._observed: tuple[Any, float] | None = None  # (record, when first seen)

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    async def wait_leading(self) -> None:
        await self._leading.wait()

    async def wait_lost(self) -> None:
        await self._following.wait()

    # -- the loop --------------------------------------------------------------------------

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the elector's own thread."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    async def run(self) -> None:
        cfg = self.config
        last_renew = 0.0  # when the last renewal that counts STARTED (the write came after)
        attempt: asyncio.Future[bool] | None = None
        late = False
        started = 0.0
        try:
            while True:
                # One try at a time, never cancelled: a try that outlives the deadline
                # still ends (its thread cannot be stopped); the next round waits for it,
                # and so does the release below rather than racing it.
                if attempt is None or attempt.done():
                    if attempt is not None and late:  # ended after its deadline, unread
                        self._outcome(attempt)
                    started = self.clock()
                    attempt = asyncio.ensure_future(self._in_thread(self._try_acquire_or_renew))
                # A leader waits only for the time its last renewal still covers, not for
                # a whole deadline from this try's start (as client-go's renew context).
                left = (
                    max(0.0, last_renew + cfg.renew_deadline_s - self.clock())
                    if self.is_leader
                    else None
                )
                # asyncio.wait neither cancels the try nor swallows a cancel of this
                # task (wait_for on 3.11 can: pyproject's ruff), and a try that ends in
                # the deadline's tick still counts, as it did with wait_for.
                done, _ = await asyncio.wait({attempt}, timeout=left)
                late = not done  # the wait ended at the deadline: read it when it ends
                ok = self._outcome(attempt) if done else False
                now = self.clock()
                # The Lease was written somewhere between the try's start and now: count
                # from the start, and a success older than the deadline counts for nothing.
                if ok and now - started < cfg.renew_deadline_s:
                    last_renew = started
                    if not self.is_leader:
                        self._become(leader=True)
                if self.is_leader and now - last_renew >= cfg.renew_deadline_s:
                    log.warning("lease %s/%s: not renewed in time, stepping down", *self._where())
                    self._become(leader=False)
                pause = cfg.retry_period_s
                if self.is_leader:  # wake up by the deadline at the latest, to step down
                    pause = min(pause, max(0.0, last_renew + cfg.renew_deadline_s - now))
                await asyncio.sleep(pause)
        finally:
            self._become(leader=False)
            if attempt is not None:  # an acquire in flight may still win: release after it
                await asyncio.wait({attempt})
                if not attempt.cancelled():
                    attempt.exception()  # retrieved: its failure was logged or is moot
            with contextlib.suppress(Exception):
                await self._in_thread(self._release)

    def _outcome(self, attempt: asyncio.Future[bool]) -> bool:
        """A finished try's answer; its failure logged in one line (the API is
        unreachable or refuses: the loop retries)."""
        try:
            return attempt.result()
        except Exception as exc:
            log.warning("lease %s/%s: %s", *self._where(), _reason(exc))
            return False

    def _where(self) -> tuple[str, str]:
        return self.config.namespace, self.config.name

    def _become(self, *, leader: bool) -> None:
        if leader:
            self.transitions += 1
            self._following.clear()
            self._leading.set()
            log.info("lease %s/%s: %s is the leader", *self._where(), self.config.identity)
        elif self.is_leader:
            self._leading.clear()
            self._following.set()

    # -- one try (worker thread) -----------------------------------------------------------

    def _call(self, call: Callable[..., Any], *args: Any) -> Any:
        """One API call, bounded by the renew deadline (a hung connection is a failure)."""
        return _json(call, *args, _request_timeout=self.config.renew_deadline_s)

    def _get(self) -> dict[str, Any] | None:
        try:
            return self._call(self.coordination.read_namespaced_lease, *reversed(self._where()))
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _record(self, old: dict[str, Any] | None, now: datetime.datetime) -> dict[str, Any]:
        me = self.config.identity
        spec = {
            "holderIdentity": me,
            "leaseDurationSeconds": self.config.duration_s,
            "acquireTime": _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": 0,
        }
        if old is not None:
            transitions = int(old.get("leaseTransitions") or 0)
            if old.get("holderIdentity") == me:
                spec["acquireTime"] = old.get("acquireTime") or spec["acquireTime"]
                spec["leaseTransitions"] = transitions
            else:
                spec["leaseTransitions"] = transitions + 1
        return spec

    def _try_acquire_or_renew(self) -> bool:
        """client-go's ``tryAcquireOrRenew``: True when this candidate holds the Lease."""
        now = datetime.datetime.now(tz=datetime.UTC)
        namespace, name = self._where()
        lease = self._get()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": self._record(None, now),
            }
            try:
                self._call(self.coordination.create_namespaced_lease, namespace, body)
            except kubernetes.client.ApiException as exc:
                if exc.status == 409:  # another candidate created it first
                    return False
                raise
            self._observed = (body["spec"], self.clock())
            return True
        spec = lease.get("spec") or {}
        if self._observed is None or self._observed[0] != spec:
            self._observed = (spec, self.clock())
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.config.duration_s)
        valid = self._observed[1] + duration > self.clock()
        if holder and holder != self.config.identity and valid:
            return False
        new = {**lease, "spec": self._record(spec, now)}
        try:
            self._call(self.coordination.replace_namespaced_lease, name, namespace, new)
        except kubernetes.client.ApiException as exc:
            if exc.status == 409:  # someone wrote in between: read again next time
                return False
            raise
        self._observed = (new["spec"], self.clock())
        return True

    def _release(self) -> None:
        """Hand the Lease back if this candidate still holds it (client-go's release)."""
        namespace, name = self._where()
        for _ in range(3):  # a conflict means it changed since read: read again
            lease = self._get()
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.config.identity:
                return
            now = _micro_time(datetime.datetime.now(tz=datetime.UTC))
            released = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            }
            try:
                self._call(
                    self.coordination.replace_namespaced_lease,
                    name,
                    namespace,
                    {**lease, "spec": released},
                )
            except kubernetes.client.ApiException as exc:
                if exc.status == 409:
                    continue
                raise
            log.info("lease %s/%s: released by %s", namespace, name, self.config.identity)
            return


def _reason(exc: BaseException) -> str:
    if isinstance(exc, kubernetes.client.ApiException):
        return f"{exc.status} {exc.reason}"
    if isinstance(exc, TimeoutError):
        return "no answer before the renew deadline"
    return f"{type(exc).__name__}: {exc}"
