"""Faults of a Kubernetes API server, programmable, for the emulator (``KubeEmulator.faults``).

A real API server throttles, conflicts, fails and slows down; components must
ride through each without losing work. This module holds the rules and what
each fault answers; the emulator (``powerflow.lab.twin.emulator``) only asks it, at
three points: before serving a request (``ApiFaults.before``), inside a watch
stream (``ApiFaults.watch_end``) and when rendering the error
(``Injected.response``). It is kept apart so that the emulator can move
(the twin may promote it to a package module) and the faults go with it.

A rule (``ApiFaults.inject``) matches requests by RBAC verb (``get``,
``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``, or
``*``), resource as RBAC names it (``pods``, ``pods/status``,
``pods/binding``, ``dljobs``, or ``*``), object name and client
(``User-Agent``; both ``fnmatch`` patterns) and namespace; it fires
``times`` times (``None``: always), each matching request with
``probability`` drawn from a generator seeded by ``ApiFaults(seed=...)``
(the draws are reproducible; which request gets which draw follows the
order the requests arrive in). What it does is its ``Answer``, as
kube-apiserver does it:

- ``delay_s``: the answer comes that many seconds late (an overloaded server,
  a slow etcd); with no ``status`` the request is then served normally;
- ``status=429``: the max-in-flight / API Priority and Fairness filter's
  answer (``filters/maxinflight.go`` ``tooManyRequests``): a plain-text body
  ``Too many requests, please try again later.`` and ``Retry-After``
  (``retry_after_s``, default 1 s); nothing is done;
- ``status=409``: a ``Conflict`` ``Status`` ("the object has been modified;
  please apply your changes to the latest version"), nothing written;
- ``status=500`` (or any other code): an ``InternalError`` ``Status``
  ("Internal error occurred: ..."); with ``committed=True`` the write is
  carried out first and the error answered after, as when etcd commits but
  the answer times out: the client cannot tell whether it happened;
- ``status=410`` on ``watch``: the watch is answered (200) and, after
  ``after_events`` events, ends with an ``ERROR`` event carrying an
  ``Expired`` ``Status`` (``too old resource version: X (Y)``), as the watch
  cache and etcd's compaction end a watch (``watch.go``/``cacher.go``:
  ``newErrWatcher``); the client must relist. The rule catches a watch when
  it starts or, if it is already open, at its next event (a probability is
  then drawn per event until one catches it).

The twin's API server runs in a process of its own, so a test there reaches the
rules over HTTP (``KubeEmulator(fault_control=True)``, ``python -m
powerflow.lab.twin.apiserver --fault-control``): ``ApiFaults.add_json`` takes the
rules of a ``POST /_twin/faults`` body, checked as strictly as a call of
``inject`` (unknown keys, wrong types and bad values refused, nothing added),
and ``ApiFaults.as_json`` gives them back with their ``hits``.

``KubeEmulator.compact()`` is the other half of 410: etcd compaction at the
current revision. A watch from an older ``resourceVersion`` then gets the
same ``ERROR`` event at once, continue tokens of lists begun before are
``410 Expired``, and so is a list at an exact older ``resourceVersion``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import random
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
import pydantic
import pydantic.dataclasses

VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "*"})
_STRICT = pydantic.ConfigDict(strict=True)
THROTTLED = "Too many requests, please try again later."
"""The body of kube-apiserver's 429 (``maxinflight.go``), plain text, not a ``Status``."""


@attrs.frozen
class Injected(kmock.KubernetesError):
    """An injected answer: a ``Status`` (or ``text``) with extra ``headers``."""

    headers: Mapping[str, str] = attrs.field(factory=dict)
    text: str | None = None

    def response(self) -> aiohttp.web.Response:
        if self.text is not None:
            return aiohttp.web.Response(status=self.status, text=self.text, headers=self.headers)
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details or {},
            "code": self.status,
        }
        return aiohttp.web.json_response(body, status=self.status, headers=self.headers)


def classify(request: kmock.Request) -> tuple[str, str, str | None, str] | None:
    """(verb, resource, namespace, name) of an API request as RBAC sees it; None for
    discovery and other requests that are no resource's."""
    res = request.resource
    plural = getattr(res, "plural", None) if res is not None else None
    if not plural:
        return None
    method = request.method
    if method == kmock.method.GET:
        verb = {"WATCH": "watch", "LIST": "list"}.get(
            str(getattr(request.action, "value", "")), "get"
        )
    elif method == kmock.method.POST:
        verb = "create"
    elif method == kmock.method.PUT:
        verb = "update"
    elif method == kmock.method.PATCH:
        verb = "patch"
    elif method == kmock.method.DELETE:
        verb = "delete"
    else:
        return None
    name = request.name
    if name is None and verb == "create" and isinstance(request.data, dict):
        meta = request.data.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
    resource = str(plural) + (f"/{request.subresource}" if request.subresource else "")
    return verb, resource, request.namespace, str(name or "")


_FIELDS = pydantic.ConfigDict(strict=True, extra="forbid")


@pydantic.dataclasses.dataclass(frozen=True, kw_only=True, config=_FIELDS)
class Answer:
    """What a fault does to a request it catches (see the module): the answer's
    ``status``, a ``delay_s`` before it, a ``committed`` write, a watch's
    ``after_events``, a 429's ``retry_after_s``, the ``message``. Checked strictly
    when made (a JSON string is not a number, an unknown key is refused), so a
    control request's rule is refused as a call of ``ApiFaults.inject`` is."""

    status: int | None = None
    delay_s: float = 0.0
    committed: bool = False
    after_events: int = 0
    retry_after_s: int = 1
    message: str | None = None


ANSWER_KEYS = frozenset(f.name for f in dataclasses.fields(Answer))
"""The keys of a control request's rule that make its ``Answer``; the others are
``inject``'s (which requests it catches, how often)."""


@attrs.define
class Fault:
    """One rule of ``ApiFaults.inject``; ``hits`` counts the requests it answered."""

    verb: str
    resource: str
    answer: Answer
    name: str = "*"
    namespace: str | None = None
    times: int | None = None
    probability: float = 1.0
    user_agent: str = "*"
    hits: int = 0

    @property
    def in_stream(self) -> bool:
        """Whether it ends a watch stream (410) rather than answering the request."""
        return self.verb == "watch" and self.answer.status == 410

    def covers(
        self, verb: str, resource: str, namespace: str | None, name: str, agent: str
    ) -> bool:
        return (
            (self.times is None or self.hits < self.times)
            and fnmatch.fnmatchcase(agent, self.user_agent)
            and self.verb in ("*", verb)
            and self.resource in ("*", resource)
            and self.namespace in (None, namespace)
            and fnmatch.fnmatchcase(name, self.name)
        )

    def error(self, resource: str, name: str, since: str = "", current: int = 0) -> Injected:
        """The answer kube-apiserver sends for this fault (see the module)."""
        answer = self.answer
        plural = resource.split("/", 1)[0]
        details: dict[str, Any] = {"name": name, "kind": plural} if name else {"kind": plural}
        status = answer.status or 500
        if status == 429:
            headers = {"Retry-After": str(answer.retry_after_s)}
            return Injected(status=429, reason="TooManyRequests", headers=headers, text=THROTTLED)
        if status == 409:
            message = answer.message or (
                f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                "modified; please apply your changes to the latest version"
            )
            return Injected(status=409, reason="Conflict", message=message, details=details)
        if status == 410:
            message = answer.message or f"too old resource version: {since or 0} ({current})"
            return Injected(status=410, reason="Expired", message=message)
        cause = answer.message or "etcdserver: request timed out"
        details["causes"] = [{"message": cause}]
        return Injected(
            status=status,
            reason="InternalError" if status == 500 else "ServiceUnavailable",
            message=f"Internal error occurred: {cause}",
            details=details,
        )


@attrs.define
class ApiFaults:
    """The fault rules of one emulated API server (see the module)."""

    seed: int = 0
    rules: list[Fault] = attrs.field(factory=list)
    compacted: int = 0
    """The revision etcd was last compacted at (``KubeEmulator.compact``)."""
    _rng: random.Random = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def reseed(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def inject(
        self,
        verb: str,
        resource: str,
        answer: Answer,
        *,
        name: str = "*",
        namespace: str | None = None,
        times: int | None = None,
        probability: float = 1.0,
        user_agent: str = "*",
    ) -> Fault:
        """Add a rule (see the module): ``answer`` for the requests of ``verb`` on
        ``resource`` (``name``, ``namespace``, ``user_agent`` narrow them), ``times`` at
        most, each with ``probability``; returns it, to read its ``hits`` or ``remove``
        it."""
        if verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r}: one of {sorted(VERBS)}")
        if answer.status is None and answer.delay_s <= 0:
            raise ValueError("a fault needs a status, a delay, or both")
        if answer.committed and verb in ("get", "list", "watch"):
            raise ValueError("committed applies to writes only")
        if answer.status == 410 and verb != "watch":
            raise ValueError("410 on lists comes from compact(); inject it on watch")
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability {probability} is not in [0, 1]")
        fault = Fault(verb, resource, answer, name, namespace, times, probability, user_agent)
        self.rules.append(fault)
        return fault

    def add_json(self, body: Any) -> list[Fault]:
        """Add the rules of a control request's body, ``{"rules": [{...}], "seed": N}``
        (``seed`` optional: reseeds the draws first); a rule's keys are ``inject``'s
        keywords and its ``Answer``'s, side by side (``as_json``'s shape). Every rule is
        checked before any is added (``inject``'s signature and ``Answer``, strictly: a
        JSON string is not a number): a ``ValueError`` naming the bad rule, and nothing
        changed."""
        if not isinstance(body, dict) or set(body) - {"rules", "seed"}:
            raise ValueError('the body must be {"rules": [...], "seed": N} (seed optional)')
        rules, seed = body.get("rules"), body.get("seed")
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise ValueError('"rules" must be a list of objects (inject\'s keywords)')
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f'"seed" must be an integer, not {seed!r}')
        scratch = pydantic.validate_call(config=_STRICT)(ApiFaults().inject)
        calls: list[dict[str, Any]] = []
        for i, rule in enumerate(rules):
            try:
                if "answer" in rule:
                    raise ValueError("unexpected key 'answer': its keys go beside the others")
                answer = Answer(**{k: v for k, v in rule.items() if k in ANSWER_KEYS})
                call = {k: v for k, v in rule.items() if k not in ANSWER_KEYS}
                call["answer"] = answer
                scratch(**call)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"rule {i}: {exc}") from exc
            calls.append(call)
        if seed is not None:
            self.reseed(seed)
        return [self.inject(**call) for call in calls]

    def as_json(self) -> dict[str, Any]:
        """The rules as ``GET /_twin/faults`` answers: each with its ``hits``."""
        rules = [
            {**attrs.asdict(rule, recurse=False, filter=lambda a, _: a.name != "answer"),
             **dataclasses.asdict(rule.answer)}
            for rule in self.rules
        ]  # fmt: skip
        return {"seed": self.seed, "compacted": self.compacted, "rules": rules}

    def remove(self, fault: Fault) -> None:
        if fault in self.rules:
            self.rules.remove(fault)

    def clear(self) -> None:
        self.rules.clear()

    def _pick(self, request: kmock.Request, *, in_stream: bool) -> tuple[Fault, str, str] | None:
        what = classify(request)
        if what is None:
            return None
        verb, resource, namespace, name = what
        agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), "")
        for rule in self.rules:
            if rule.in_stream != in_stream:
                continue
            if not rule.covers(verb, resource, namespace, name, agent):
                continue
            if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                continue
            rule.hits += 1
            return rule, resource, name
        return None

    async def before(self, request: kmock.Request) -> Injected | None:
        """Before the emulator serves ``request``: wait out a delay, raise an error the
        server answers without doing anything; returns the error of a ``committed``
        fault, for the emulator to raise once the write is done."""
        picked = self._pick(request, in_stream=False)
        if picked is None:
            return None
        rule, resource, name = picked
        if rule.answer.delay_s > 0:
            await asyncio.sleep(rule.answer.delay_s)
        if rule.answer.status is None:
            return None
        error = rule.error(resource, name)
        if rule.answer.committed:
            return error
        raise error

    def watch_end(self, request: kmock.Request, current: int) -> tuple[int, Injected] | None:
        """For a watch: after how many events it ends, and the ``ERROR`` it ends with
        (``current``: the server's revision, which the message names)."""
        picked = self._pick(request, in_stream=True)
        if picked is None:
            return None
        rule, resource, name = picked
        since = str(request.params.get("resourceVersion") or "0")
        return rule.answer.after_events, rule.error(resource, name, since, current)
