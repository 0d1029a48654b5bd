"""The test and twin port picker: never a port the kernel may give to someone else."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from powerflow.twin import ports
from powerflow.twin.ports import ephemeral_low, free_port


def test_a_free_port_is_below_the_kernels_ephemeral_range_and_binds() -> None:
    """bind(0)-and-release picked from the ephemeral range, where an outgoing
    connection took one before kopf's liveness server could bind it (a CI failure)."""
    low = ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= port < low for port in ports)
    assert len(set(ports)) == len(ports)
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    taken, other = free_port(), free_port()
    monkeypatch.setattr(ports, "_ports", itertools.cycle([taken, other]))
    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        held.listen()
        assert [free_port() for _ in range(3)] == [other] * 3


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_low(ranges) == 40000
    ranges.write_text("junk")
    assert ephemeral_low(ranges) == 32768
    assert ephemeral_low(tmp_path / "missing") == 32768
