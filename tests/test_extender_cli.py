"""``powerflow extender`` serves the app with uvicorn, even with no cluster to talk to."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest

from powerflow.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_serves_health_and_reports_not_ready_without_a_cluster() -> None:
    port = free_port()
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "powerflow",
            "extender",
            "--port",
            str(port),
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ) as proc:
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except httpx.TransportError:
                    assert proc.poll() is None, proc.communicate()[0].decode()
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert health.text == "ok"
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
            assert ready.status_code == 503 and "/nonexistent/kubeconfig" in ready.json()["reason"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--port", "70000"], "not a TCP port"), (["--reservation-ttl", "0"], "must be positive")],
)
def test_bad_settings_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extender", *argv]) == 2
    assert message in capsys.readouterr().err
