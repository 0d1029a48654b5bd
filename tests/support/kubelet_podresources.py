"""A kubelet stand-in: the PodResources gRPC service on a unix socket, as the kubelet serves it.

Built from the same generated stubs the agent's client uses (so the wire
format is the upstream proto's), served by a real ``grpc.aio`` server on a
unix socket in a temporary directory. ``pods`` is what ``List`` answers (a
test changes it at will); ``hang`` makes ``List`` never answer, like a
kubelet that is stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc.aio
from powerflow.nodeagent.podresources_pb import api_pb2
from powerflow.nodeagent.podresources_pb.api_pb2_grpc import (
    PodResourcesListerServicer,
    add_PodResourcesListerServicer_to_server,
)


def pod(
    namespace: str,
    name: str,
    containers: Mapping[str, Mapping[str, Sequence[str]]],
    *,
    cpu_ids: Sequence[int] = (),
) -> api_pb2.PodResources:
    """A pod as the kubelet reports it: container name -> resource name -> device IDs."""
    return api_pb2.PodResources(
        namespace=namespace,
        name=name,
        containers=[
            api_pb2.ContainerResources(
                name=container,
                devices=[
                    api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
                    for resource, ids in devices.items()
                ],
                cpu_ids=list(cpu_ids),
            )
            for container, devices in containers.items()
        ],
    )


class FakeKubelet(PodResourcesListerServicer):  # type: ignore[misc]
    """``v1.PodResourcesLister`` answering ``List`` from ``pods``."""

    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.hang = False
        self.calls = 0

    async def List(  # the gRPC method's name
        self, request: api_pb2.ListPodResourcesRequest, context: Any
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


@contextlib.asynccontextmanager
async def serve(kubelet: FakeKubelet, socket_path: str) -> AsyncIterator[grpc.aio.Server]:
    """Serve ``kubelet`` on ``socket_path`` until the block ends (then stop at once)."""
    server = grpc.aio.server()
    add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=None)


@contextlib.contextmanager
def socket_dir() -> Any:
    """A short temporary directory for sockets (a unix socket path is limited to 107 bytes,
    which pytest's ``tmp_path`` for a long test name can exceed)."""
    path = tempfile.mkdtemp(prefix="kubelet-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def socket_in(directory: str) -> str:
    return os.path.join(directory, "kubelet.sock")
