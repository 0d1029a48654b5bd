"""Run ``powerflow nodeagent`` against the emulator as a user does, in a thread of its own.

The agent is started through ``powerflow.commands.nodeagent.serve``, the
function the command runs, with arguments parsed by the real parser and a
kubeconfig file pointing at the emulator. The seams are ``serve``'s own: the
GPUs (``RecordingGpus``: simulated A100s that also remember what was
locked, as ``nvidia-smi -q`` would show), the kubelet's PodResources and the
telemetry side.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from powerflow.cli import build_parser
from powerflow.commands.nodeagent import RunControl, serve
from powerflow.core import contract
from powerflow.core.devices import GpuLost
from powerflow.lab.simulated_gpus import SimulatedGpus

NODE = "n1"
PODS = "/api/v1/namespaces/ns/pods"


class RecordingGpus(SimulatedGpus):
    """Simulated GPUs that keep each GPU's lock and the order of writes; writes to a
    GPU in ``broken`` raise ``GpuLost`` as a GPU that fell off the bus does."""

    def __init__(self, count: int = 4, **kwargs: Any) -> None:
        super().__init__(count, node=NODE, **kwargs)
        self.locks: dict[int, tuple[int, int] | None] = dict.fromkeys(range(count))
        self.calls: list[tuple[str, int]] = []
        self.broken: set[int] = set()

    def _write(self, what: str, gpu: int) -> None:
        if gpu in self.broken:
            raise GpuLost(f"GPU {gpu}: fell off the bus", gpu=f"GPU {gpu}")
        self.calls.append((what, gpu))

    def lock_clocks_mhz(self, gpu: int, lo_mhz: int, hi_mhz: int) -> None:
        self._write("lock", gpu)
        super().lock_clocks_mhz(gpu, lo_mhz, hi_mhz)
        self.locks[gpu] = (lo_mhz, hi_mhz)

    def reset_clocks(self, gpu: int) -> None:
        self._write("reset", gpu)
        super().reset_clocks(gpu)
        self.locks[gpu] = None

    def set_power_limit_w(self, gpu: int, watts: float) -> None:
        self._write("limit", gpu)
        super().set_power_limit_w(gpu, watts)

    def reset_power_limit(self, gpu: int) -> None:
        self._write("reset-limit", gpu)
        super().reset_power_limit(gpu)

    def locked(self, gpu: int) -> int | None:
        lock = self.locks[gpu]
        return None if lock is None else lock[1]


def agent_args(kubeconfig: Path, *options: str) -> argparse.Namespace:
    """``powerflow nodeagent --kubeconfig FILE --node-name n1`` without ports, plus options."""
    argv = ["nodeagent", "--kubeconfig", str(kubeconfig), "--node-name", NODE]
    argv += ["--metrics-port", "0", "--worker-port", "0", "--simulate", "4"]
    # No kubelet here: a socket path that cannot exist, whatever the host has.
    argv += ["--pod-resources-socket", "/nonexistent/pod-resources/kubelet.sock", *options]
    return build_parser().parse_args(argv)


DLJOBS = f"/apis/{contract.API_VERSION}/namespaces/ns/{contract.PLURAL}"
DLJOB_RESOURCE = f"{contract.API_VERSION}/{contract.PLURAL}"
"""What ``KubeEmulator.declare`` takes to serve DLJobs (``create_worker`` makes them)."""


async def create_worker(api: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    """Create a worker pod as the operator does: its DLJob first (named by the pod's job
    label; the emulator's garbage collector, like the real one, deletes a pod whose
    owner does not exist), then the pod, its controller reference carrying that
    DLJob's UID. The emulator must serve DLJobs (``DLJOB_RESOURCE``)."""
    job = body["metadata"]["labels"][contract.JOB_LABEL]
    got = await api.get(f"{DLJOBS}/{job}")
    if got.status_code == 404:
        dljob = {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "metadata": {"name": job},
        }
        got = await api.post(DLJOBS, json=dljob)
    assert got.status_code in (200, 201), got.text
    pod = copy.deepcopy(body)
    pod["metadata"]["ownerReferences"] = [
        {**dljob_owner(job), "uid": got.json()["metadata"]["uid"]}
    ]
    return await api.post(PODS, json=pod)


def dljob_owner(job: str) -> dict[str, Any]:
    """The controller reference the operator gives its workers (the DLJob ``job``)."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "name": job,
        "uid": f"uid-{job}",
        "controller": True,
    }


def worker_pod(
    name: str,
    gpu: int | None = None,
    *,
    job: str = "j",
    index: int = 0,
    node: str = NODE,
    **annotations: str,
) -> dict[str, Any]:
    """A PowerFlow worker pod bound to ``node``; ``gpu``: its placement block entry."""
    ann = {f"{contract.GROUP}/{k.replace('_', '-')}": v for k, v in annotations.items()}
    ann.setdefault(contract.WORKERS_ANNOTATION, "1")
    if gpu is not None:
        ann[contract.PLACEMENT_ANNOTATION] = f'{{"node": "{node}", "block": [["{node}", {gpu}]]}}'
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {contract.JOB_LABEL: job, contract.WORKER_INDEX_LABEL: str(index)},
            "annotations": ann,
            "ownerReferences": [dljob_owner(job)],
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "trainer",
                    "image": "trainer",
                    "env": [{"name": "LOCAL_BATCH_SIZE", "value": "32"}],
                    "resources": {"limits": {contract.GPU_RESOURCE: "1"}},
                }
            ],
        },
    }


class NodeAgent:
    """``async with NodeAgent(args, gpus):`` runs ``serve(args, ...)`` until the block ends."""

    def __init__(self, args: argparse.Namespace, devices: Any, **seams: Any) -> None:
        self.args = args
        self.devices = devices
        self.seams = seams
        self.agent: Any = None
        self.error: BaseException | None = None
        self.code: int | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _started(self, agent: Any) -> None:
        self.agent = agent

    def _main(self) -> None:
        try:
            self.code = serve(
                self.args,
                control=RunControl(self._stop, self._ready, self._started),
                devices=self.devices,
                **self.seams,
            )
        except BaseException as exc:  # surfaced by __aenter__
            self.error = exc
            self._ready.set()

    async def __aenter__(self) -> NodeAgent:
        """Start; return after the first pass. Waits in a thread: the emulator serves
        from the caller's loop, which must stay free."""
        self._thread.start()
        if not await asyncio.to_thread(self._ready.wait, 20):
            raise RuntimeError("node agent did not start")
        if self.error is not None:
            raise RuntimeError(f"node agent failed: {self.error!r}") from self.error
        return self

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 20)
        assert not self._thread.is_alive(), "node agent did not stop"

    async def __aexit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            await self.stop()


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll ``check`` (sync) until it is truthy; generous, never a speed assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"condition not met in {timeout} s: {check}")
        await asyncio.sleep(0.02)
