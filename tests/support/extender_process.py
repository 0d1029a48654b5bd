"""``powerflow extender`` started as a user starts it, and the objects it mirrors.

The extender's entry, fuzz and API-fault tests all run the real command in a
subprocess (``python -m powerflow extender --kubeconfig FILE``) against the emulated
API server, and seed the cluster it mirrors the way kubelets and users write it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from support.operator_harness import free_port

MERGE = {"Content-Type": "application/merge-patch+json"}
SERVER_SET = ("uid", "resourceVersion", "creationTimestamp")
"""Metadata the API server sets: a body read back from it carries them, a create must not."""


async def create(api: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create ``body`` at ``path`` as its owner does, and return it as stored: without the
    metadata the server sets, then its ``status`` (if any) through the status subresource,
    as a kubelet reports a node's (a real server ignores ``status`` on create)."""
    fresh = json.loads(json.dumps(body))
    status = fresh.pop("status", None)
    for key in SERVER_SET:
        fresh["metadata"].pop(key, None)
    response = await api.post(path, json=fresh)
    assert response.status_code == 201, response.text
    made: dict[str, Any] = response.json()
    if status is not None:
        name = fresh["metadata"]["name"]
        patched = await api.patch(f"{path}/{name}/status", json={"status": status}, headers=MERGE)
        assert patched.status_code == 200, patched.text
        made = patched.json()
    return made


@dataclass
class ExtenderProcess:
    """A running ``powerflow extender``: its app's and its metrics' ports, and once it
    has stopped, what it logged."""

    port: int
    metrics_port: int
    proc: asyncio.subprocess.Process
    output: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def extender_process(kubeconfig: Path) -> AsyncIterator[ExtenderProcess]:
    """Start the command on free ports and yield once ``/readyz`` answers 200; on the way
    out stop it and fail if its log holds a traceback."""
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "powerflow", "extender", "--port", str(port)]
    argv += ["--kubeconfig", str(kubeconfig), "--log-level", "warning"]
    argv += ["--metrics-port", str(metrics_port)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    running = ExtenderProcess(port, metrics_port, proc)
    logged: list[bytes] = []

    async def drain() -> None:
        """Read the log as it comes: a pipe left full blocks the extender's next log line
        (and with it every request), as a container runtime never would."""
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(1 << 16):
            logged.append(chunk)

    reader = asyncio.create_task(drain())
    try:
        async with httpx.AsyncClient(base_url=running.url) as ext:
            for _ in range(600):  # the emulator serves from this loop: wait without blocking it
                try:
                    if (await ext.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    assert proc.returncode is None
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the extender never became ready")
        yield running
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        await reader
        running.output = b"".join(logged).decode()
    assert "Traceback" not in running.output, running.output[-3000:]
