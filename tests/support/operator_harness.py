"""Run the PowerFlow operator against the emulator: its own thread and event loop.

kopf in pytest's loop costs seconds per test at teardown; in a thread with a
stop flag it stops in milliseconds (TESTING.md).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf
import kubernetes
from powerflow.operator.controller import Controller, OperatorConfig
from powerflow.operator.handlers import build_registry
from powerflow.operator.kube import Kube
from powerflow.operator.reconcile import ModelFactory

from powerflow.policy.snapshot import Policy


class OperatorThread:
    def __init__(
        self, url: str, policy: Policy, models: ModelFactory, config: OperatorConfig
    ) -> None:
        self.url = url
        self.policy = policy
        self.models = models
        self.config = config
        self.controller: Controller | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url))

    def _make(self) -> Controller:
        kube = Kube(self._api, self.config.namespace)
        self.controller = Controller(kube, self.config, self.policy, self.models)
        return self.controller

    def _main(self) -> None:
        registry = build_registry(self._make)

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=self.url, insecure=True)

        asyncio.run(
            kopf.operator(
                registry=registry,
                clusterwide=True,
                standalone=True,
                stop_flag=self._stop,
                ready_flag=self._ready,
            )
        )

    async def __aenter__(self) -> OperatorThread:
        """Start, and return once the first allocation pass is done.

        Waits in a worker thread: the emulator serves from the caller's loop,
        which must stay free while the operator talks to it.
        """
        self._thread.start()
        if not await asyncio.to_thread(self._ready.wait, 10):
            raise RuntimeError("operator did not start")
        for _ in range(500):
            if self.controller is not None and self.controller.passes > 0:
                break
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 10)
        self._api.close()
