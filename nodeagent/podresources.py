"""Which physical GPUs each pod on this node holds: the kubelet's PodResources API.

The extender picks a gang's block of GPU indices, but the NVIDIA device
plugin, not the extender, decides which physical GPU a container gets; the
kubelet records that assignment and serves it on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``, gRPC
``v1.PodResourcesLister/List``). DCGM-exporter maps GPUs to pods the same
way. ``List`` answers for every pod on the node, PowerFlow's or not, so the
agent also learns which GPUs foreign containers hold (it must never park
those). The device plugin reports GPU UUIDs (``GPU-...``) as device IDs.

The stubs in ``podresources_pb`` are generated from the upstream proto
(shipped beside them with its licence; ``scripts/gen-podresources.sh``
regenerates them). Every failure to get an answer (no socket, nobody
listening, no answer within ``timeout_s``, any gRPC error) is one
``PodResourcesUnavailable`` with one line naming the socket and the cause,
so the agent can fall back to the GPU UUIDs the worker library reports.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import grpc
import grpc.aio
from powerflow.nodeagent.podresources_pb import api_pb2
from powerflow.nodeagent.podresources_pb.api_pb2_grpc import PodResourcesListerStub

from powerflow.core import contract
from powerflow.core.errors import PowerFlowError

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest List answer accepted: the kubelet's own client (and DCGM-exporter)
allow 16 MiB, gRPC's default of 4 MiB can be too little on a node with
hundreds of pods."""

SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "v1.PodResourcesLister"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "0.5s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)
"""gRPC's own retry of ``List`` (a read, safe to repeat) when the transport fails
under it: after a kubelet restart the channel's old connection can still look open,
and the first call on it fails with ``UNAVAILABLE: Stream removed (sendmsg: Broken
pipe)`` although the new kubelet answers. Retries stay within the call's deadline."""

Assignments = dict[tuple[str, str], tuple[str, ...]]
"""(namespace, pod name) -> the GPU device IDs its containers hold."""


class PodResourcesUnavailable(PowerFlowError):
    """The kubelet's PodResources API gave no answer; ``socket_path`` says where it was asked."""

    def __init__(self, message: str, *, socket_path: str) -> None:
        super().__init__(message)
        self.socket_path = socket_path


def gpu_assignments(
    response: api_pb2.ListPodResourcesResponse, resource: str = contract.GPU_RESOURCE
) -> Assignments:
    """The ``resource`` devices of each pod in a ``List`` answer, over all its containers.

    Pods that hold none are left out; other resources (NICs, other devices,
    CPUs, memory, DRA claims) are ignored. IDs keep the kubelet's order
    (containers in order), each once: a device the kubelet handed to an
    init container and then reused for an app container counts once.
    """
    out: Assignments = {}
    for pod in response.pod_resources:
        ids = _device_ids(
            device_id
            for container in pod.containers
            for devices in container.devices
            if devices.resource_name == resource
            for device_id in devices.device_ids
        )
        key = (pod.namespace, pod.name)
        if ids:
            out[key] = _device_ids((*out.get(key, ()), *ids))
    return out


def _device_ids(ids: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(i for i in ids if i))


class PodResourcesClient:
    """A client of the kubelet's PodResources socket for the agent's event loop.

    The gRPC channel is opened on first use (in the running loop, which
    ``grpc.aio`` binds it to) and reused; ``close`` releases it.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = 2.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{os.path.abspath(self.socket_path)}",
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.enable_retries", 1),
                    ("grpc.service_config", SERVICE_CONFIG),
                ],
            )
        return PodResourcesListerStub(self._channel)

    async def gpu_assignments(self) -> Assignments:
        """(namespace, pod) -> GPU device IDs (UUIDs) of every pod on the node holding GPUs.

        Raises ``PodResourcesUnavailable`` when the socket is absent, refuses,
        or does not answer within ``timeout_s``.
        """
        where = f"kubelet PodResources socket {self.socket_path}"
        if not os.path.exists(self.socket_path):
            raise PodResourcesUnavailable(
                f"{where} does not exist (is /var/lib/kubelet/pod-resources mounted into "
                f"the agent's pod?)",
                socket_path=self.socket_path,
            )
        request = api_pb2.ListPodResourcesRequest()
        try:
            response: api_pb2.ListPodResourcesResponse = await self._stub().List(
                request, timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesUnavailable(
                f"{where}: List failed: {_describe(exc, self.timeout_s)}",
                socket_path=self.socket_path,
            ) from exc
        return gpu_assignments(response)

    async def close(self) -> None:
        """Release the channel (a later call opens a new one)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


def _describe(exc: grpc.aio.AioRpcError, timeout_s: float) -> str:
    """One line for a failed call: gRPC's status and the first line of its details."""
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout_s:g} s (DEADLINE_EXCEEDED)"
    details = (exc.details() or "").strip().splitlines()
    name = code.name if code is not None else "UNKNOWN"
    return f"{name}: {details[0][:300]}" if details else name
