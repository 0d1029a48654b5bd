"""``powerflow extender`` serves the app with uvicorn, even with no cluster to talk to."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from powerflow.cli import main
from powerflow.lab.twin.ports import free_port

BAD_KUBECONFIGS = {
    "missing": (None, "does not exist"),
    "garbage": ("a: [unclosed\n  - :", "not valid YAML"),
    "no-context": (
        "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
        "current-context",
    ),
}


def bad_kubeconfig(tmp_path: Path, kind: str) -> str:
    text, _ = BAD_KUBECONFIGS[kind]
    path = tmp_path / f"{kind}.yaml"
    if text is not None:
        path.write_text(text)
    return str(path)


@pytest.mark.parametrize("kind", sorted(BAD_KUBECONFIGS))
def test_serves_health_and_reports_not_ready_with_a_bad_kubeconfig(
    kind: str, tmp_path: Path
) -> None:
    """Started as a user starts it: one clear log line at start, no traceback, /readyz says why."""
    kubeconfig = bad_kubeconfig(tmp_path, kind)
    port = free_port()
    argv = [sys.executable, "-m", "powerflow", "extender", "--port", str(port)]
    argv += ["--kubeconfig", kubeconfig, "--log-level", "warning"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
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
            reason = ready.json()["reason"]
            assert ready.status_code == 503 and kubeconfig in reason
            assert BAD_KUBECONFIGS[kind][1] in reason
        finally:
            proc.terminate()
            output = proc.communicate(timeout=30)[0].decode()
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if kubeconfig in line]
    assert len(lines) == 1 and lines[0].startswith("ERROR powerflow.extender.app: not ready: ")
    assert BAD_KUBECONFIGS[kind][1] in lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "70000"], "not a TCP port"),
        (["--metrics-port", "-1"], "--metrics-port -1 is not a TCP port"),
        (["--reservation-ttl", "0"], "must be positive"),
        (["--max-body-bytes", "0"], "must be positive"),
    ],
)
def test_bad_settings_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extender", *argv]) == 2
    assert message in capsys.readouterr().err
