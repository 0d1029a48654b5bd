"""The kubelet PodResources client against a real gRPC server on a unix socket.

The server (``support.kubelet_podresources``) is built from the same
generated stubs and serves ``v1.PodResourcesLister`` as the kubelet does.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import pytest
from powerflow.nodeagent.podresources import (
    PodResourcesClient,
    PodResourcesUnavailable,
    gpu_assignments,
)
from powerflow.nodeagent.podresources_pb import api_pb2
from support.kubelet_podresources import FakeKubelet, pod, serve, socket_dir, socket_in

from powerflow.core import contract
from powerflow.core.errors import PowerFlowError

GPU = contract.GPU_RESOURCE
U = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)]


@pytest.fixture
def sock() -> Iterator[str]:
    with socket_dir() as directory:
        yield socket_in(directory)


@pytest.fixture
async def kubelet(sock: str) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet()
    async with serve(fake, sock):
        yield fake


@pytest.fixture
async def client(sock: str) -> AsyncIterator[PodResourcesClient]:
    c = PodResourcesClient(sock, timeout_s=2.0)
    yield c
    await c.close()


async def test_every_pods_gpus_over_all_containers(
    kubelet: FakeKubelet, client: PodResourcesClient
) -> None:
    kubelet.pods = [
        pod("ml", "job-g1-w0", {"trainer": {GPU: [U[3]]}}),
        # A foreign pod with two GPU containers, a sidecar holding a NIC, and CPUs.
        pod(
            "other",
            "inference",
            {"a": {GPU: [U[0], U[1]], "example.com/nic": ["nic0"]}, "b": {GPU: [U[5]]}},
            cpu_ids=[2, 3],
        ),
        pod("kube-system", "coredns", {"coredns": {}}),  # no devices at all
    ]
    assert await client.gpu_assignments() == {
        ("ml", "job-g1-w0"): (U[3],),
        ("other", "inference"): (U[0], U[1], U[5]),
    }
    assert kubelet.calls == 1


async def test_unknown_resources_are_ignored(
    kubelet: FakeKubelet, client: PodResourcesClient
) -> None:
    kubelet.pods = [
        pod("a", "nics", {"c": {"example.com/nic": ["nic0", "nic1"]}}),
        pod("a", "mig", {"c": {"nvidia.com/mig-1g.10gb": ["MIG-1"], GPU: [U[2]]}}),
    ]
    assert await client.gpu_assignments() == {("a", "mig"): (U[2],)}


async def test_an_empty_node_has_no_assignments(
    kubelet: FakeKubelet, client: PodResourcesClient
) -> None:
    assert await client.gpu_assignments() == {}


async def test_the_answer_follows_the_kubelet(
    kubelet: FakeKubelet, client: PodResourcesClient
) -> None:
    kubelet.pods = [pod("ml", "w0", {"t": {GPU: [U[0]]}})]
    assert await client.gpu_assignments() == {("ml", "w0"): (U[0],)}
    kubelet.pods = [pod("ml", "w1", {"t": {GPU: [U[1]]}})]
    assert await client.gpu_assignments() == {("ml", "w1"): (U[1],)}  # one channel, reused
    assert kubelet.calls == 2


def test_a_device_reused_across_containers_counts_once() -> None:
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[pod("ns", "p", {"init": {GPU: [U[0]]}, "main": {GPU: [U[0], U[1], ""]}})]
    )
    assert gpu_assignments(response) == {("ns", "p"): (U[0], U[1])}


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text
    return text


async def test_absent_socket_is_one_clear_line(sock: str) -> None:
    client = PodResourcesClient(sock)
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.gpu_assignments()
    text = _one_line(info.value)
    assert sock in text and "does not exist" in text
    assert isinstance(info.value, PowerFlowError) and info.value.socket_path == sock
    await client.close()


async def test_a_socket_nobody_listens_on_refuses(sock: str) -> None:
    # What a crashed kubelet leaves behind: the socket file, no listener.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(sock)
    client = PodResourcesClient(sock, timeout_s=5.0)
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.gpu_assignments()
    text = _one_line(info.value)
    assert sock in text and "UNAVAILABLE" in text
    await client.close()


async def test_a_kubelet_that_hangs_times_out(kubelet: FakeKubelet, sock: str) -> None:
    kubelet.hang = True
    client = PodResourcesClient(sock, timeout_s=0.2)
    with pytest.raises(PodResourcesUnavailable) as info:
        await client.gpu_assignments()
    text = _one_line(info.value)
    assert sock in text and "DEADLINE_EXCEEDED" in text and "0.2 s" in text
    await client.close()


async def test_a_restarted_kubelet_is_found_again(sock: str) -> None:
    """The first call after a kubelet restart answers. The channel's connection to the
    old kubelet could still look open, and that call failed with ``UNAVAILABLE: Stream
    removed (sendmsg: Broken pipe)``: in one process in 13 on the first restart, rarely
    on later ones; 500 restarts (1 s) caught it in 2 runs of 5 before gRPC's retry."""
    client = PodResourcesClient(sock, timeout_s=2.0)
    for restart in range(500):
        kubelet = FakeKubelet()
        kubelet.pods = [pod("ml", "w0", {"t": {GPU: [U[restart % 8]]}})]
        async with serve(kubelet, sock):
            assert await client.gpu_assignments() == {("ml", "w0"): (U[restart % 8],)}
        with pytest.raises(PodResourcesUnavailable):  # down: the socket may linger or not
            await client.gpu_assignments()
    await client.close()


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        PodResourcesClient("/nonexistent", timeout_s=0)
