"""The emulated API server (``emulator.KubeEmulator``) on a real port.

kmock serves from an asyncio loop, and every watch (kopf's, the agents', the
extender's) is served from it: it must not share a process's interpreter lock
with the twin's busy threads (simulated GPUs, kubelet, agents), or every API
call waits seconds. ``ApiServerProcess`` runs it as
``python -m powerflow.lab.twin.apiserver`` with the tokens it must know (TokenReview);
``ApiServer`` runs it in a thread of this process (tests that need the emulator
object itself). ``--fault-control`` opens the emulator's fault routes
(``/_twin/faults``, ``/_twin/compact``) for a test to inject API faults into the
process from outside it; ``FaultControl`` is their client. ``--enforce-rbac``
(``ApiServer(enforce_rbac=True)``) makes it authenticate tokens and authorize
ServiceAccounts' requests by the RBAC objects stored in it, as a real API server
does (``KubeEmulator.enforce_rbac``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from powerflow.core import contract
from powerflow.lab.twin.emulator import CONTROL, KubeEmulator
from powerflow.lab.twin.stop_signal import on_sigterm

T = TypeVar("T")
FAULTS = f"{CONTROL}faults"


def write_kubeconfig(path: Path, server: str, token: str | None = None) -> Path:
    """A kubeconfig with one cluster (plain HTTP, as the emulator serves) and one user:
    what a user hands each component with ``--kubeconfig``."""
    user = {"token": token} if token else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "twin", "cluster": {"server": server}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "twin", "context": {"cluster": "twin", "user": "user"}}],
        "current-context": "twin",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class ApiServer:
    """``with ApiServer() as api:`` serves a ``KubeEmulator`` with the built-in resources
    and the DLJob resource on ``api.url`` until the block ends."""

    def __init__(
        self,
        port: int | None = None,
        keep_requests: int | None = 20,
        *,
        kubelets: bool = False,
        toleration_s: int | None = None,
        fault_control: bool = False,
        enforce_rbac: bool = False,
        extended_resource_toleration: bool = False,
    ) -> None:
        self.port = port
        self.extended_resource_toleration = extended_resource_toleration
        self.keep_requests = keep_requests
        self.kubelets, self.toleration_s = kubelets, toleration_s
        self.fault_control = fault_control
        self.enforce_rbac = enforce_rbac
        self.emulator: KubeEmulator | None = None
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="twin-apiserver", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        from kmock._internal.apps import Server

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        emulator = KubeEmulator(
            keep_requests=self.keep_requests,
            kubelets=self.kubelets,
            not_ready_toleration_s=self.toleration_s,
            unreachable_toleration_s=self.toleration_s,
            fault_control=self.fault_control,
            enforce_rbac=self.enforce_rbac,
            extended_resource_toleration=self.extended_resource_toleration,
        )
        async with emulator, Server(emulator, port=self.port) as server:
            emulator.load_builtins()
            emulator.declare(
                f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND
            )
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def start(self) -> ApiServer:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the emulated API server did not start")
        if self._error is not None:
            raise RuntimeError(f"the emulated API server failed: {self._error!r}") from self._error
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        """Run ``coro`` on the server's loop (for the emulator's async methods)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FaultControl:
    """The client of an API server's fault routes (``--fault-control``): ``inject`` takes
    ``ApiFaults.inject``'s keywords, ``rules`` reads them back with their ``hits`` (how
    many requests each answered: the faults actually served)."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def inject(self, *rules: dict[str, Any], seed: int | None = None) -> list[dict[str, Any]]:
        """Add ``rules`` (all or none: a rule the server refuses raises); every rule now."""
        body: dict[str, Any] = {"rules": list(rules)}
        if seed is not None:
            body["seed"] = seed
        return self._answer(self.client.post(FAULTS, json=body))

    def rules(self) -> list[dict[str, Any]]:
        return self._answer(self.client.get(FAULTS))

    def clear(self) -> list[dict[str, Any]]:
        """Remove every rule; returns them as they were, with their final ``hits``."""
        return self._answer(self.client.delete(FAULTS))

    def compact(self) -> int:
        answer = self.client.post(f"{CONTROL}compact")
        answer.raise_for_status()
        return int(answer.json()["revision"])

    @staticmethod
    def _answer(answer: httpx.Response) -> list[dict[str, Any]]:
        if answer.is_error:
            raise ValueError(f"{answer.status_code}: {answer.text}")
        rules: list[dict[str, Any]] = answer.json()["rules"]
        return rules


def serve_forever(
    port: int,
    tokens: Path | None,
    *,
    kubelets: bool = False,
    toleration_s: int | None = None,
    fault_control: bool = False,
    enforce_rbac: bool = False,
    extended_resource_toleration: bool = False,
) -> None:
    """The process's body: serve on ``port`` until killed, knowing ``tokens`` (a JSON list
    of ``register_token`` keyword arguments); ``kubelets``, ``toleration_s`` and
    ``enforce_rbac``: see ``KubeEmulator.kubelets``, its ``DefaultTolerationSeconds``
    and ``KubeEmulator.enforce_rbac``."""
    import json

    server = ApiServer(
        port,
        kubelets=kubelets,
        toleration_s=toleration_s,
        fault_control=fault_control,
        enforce_rbac=enforce_rbac,
        extended_resource_toleration=extended_resource_toleration,
    )
    server.start()
    if tokens is not None:
        assert server.emulator is not None
        for entry in json.loads(tokens.read_text()):
            entry["groups"] = tuple(entry.get("groups", ()))
            entry["audiences"] = tuple(entry["audiences"])
            server.emulator.register_token(**entry)
    print(server.url, flush=True)
    done = on_sigterm()
    with contextlib.suppress(KeyboardInterrupt):
        while not done.wait(0.5):
            pass
    server.stop()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="the twin's emulated API server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=Path)
    parser.add_argument(
        "--kubelets", action="store_true", help="bound pods wait for their kubelet's delete"
    )
    parser.add_argument(
        "--default-toleration-seconds",
        type=int,
        help="kube-apiserver's --default-not-ready-toleration-seconds and "
        "--default-unreachable-toleration-seconds (unset: no such admission)",
    )
    parser.add_argument(
        "--fault-control",
        action="store_true",
        help="serve /_twin/faults and /_twin/compact (fault injection by tests)",
    )
    parser.add_argument(
        "--enforce-rbac",
        action="store_true",
        help="401 for unknown tokens; ServiceAccounts get what the stored RBAC objects grant",
    )
    parser.add_argument(
        "--extended-resource-toleration",
        action="store_true",
        help="the ExtendedResourceToleration admission plugin (GPU pods tolerate "
        "nvidia.com/gpu taints)",
    )
    options = parser.parse_args()
    serve_forever(
        options.port,
        options.tokens,
        kubelets=options.kubelets,
        toleration_s=options.default_toleration_seconds,
        fault_control=options.fault_control,
        enforce_rbac=options.enforce_rbac,
        extended_resource_toleration=options.extended_resource_toleration,
    )
