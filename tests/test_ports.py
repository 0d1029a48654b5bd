"""The test and twin port picker: never a port the kernel may give to someone else."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from powerflow.lab.twin import ports
from powerflow.lab.twin.ports import ephemeral_range, free_port, outside


def test_a_free_port_is_outside_the_kernels_ephemeral_range_and_binds() -> None:
    """bind(0)-and-release picked from the ephemeral range, where an outgoing
    connection took one before kopf's liveness server could bind it (a CI failure)."""
    low, high = ephemeral_range()
    taken = [free_port() for _ in range(50)]
    assert all(1024 <= port < 65536 and not low <= port <= high for port in taken)
    assert len(set(taken)) == len(taken)
    for port in taken[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    held_port, other = free_port(), free_port()
    monkeypatch.setattr(ports._walk, "_next", iter([held_port, other, held_port, other]))
    with socket.socket() as held:
        held.bind(("127.0.0.1", held_port))
        held.listen()
        assert [free_port(), free_port()] == [other, other]


@pytest.mark.parametrize(
    ("kernel", "chosen"),
    [
        ((32768, 60999), range(16384, 32768)),  # Linux's default: below it
        ((49152, 65535), range(32768, 49152)),  # the IANA range: below it
        ((1024, 40000), range(40001, 56385)),  # above it
        ((2000, 65535), range(1024, 2000)),  # what little is below it
        ((1024, 65535), range(0)),  # nothing outside it: bind(0) it is
        ((1100, 65400), range(0)),  # too little outside it
    ],
)
def test_the_ports_outside_the_ephemeral_range(kernel: tuple[int, int], chosen: range) -> None:
    assert outside(*kernel) == chosen


def test_with_no_room_outside_it_any_free_port_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports._walk, "ports", range(0))
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_range(ranges) == (40000, 60999)
    ranges.write_text("junk")
    assert ephemeral_range(ranges) == (32768, 60999)
    assert ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_a_forked_child_walks_from_a_new_start() -> None:
    """A child that kept its parent's walk would hand out the ports the parent hands
    out next, both believing them theirs."""
    free_port()  # the parent's walk has begun
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: whether its walk starts anew, to the parent
        os.close(read)
        os.write(write, b"new" if ports._walk._next is None else b"parent's")
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    assert ports._walk._next is not None
    assert said == "new"
