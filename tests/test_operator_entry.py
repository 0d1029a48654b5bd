"""``powerflow operator`` as a user runs it: the command logs in with its kubeconfig (no
test login handler), and an unusable configuration is one line and exit code 2."""

from __future__ import annotations

import asyncio
import base64
import signal
import socket
from pathlib import Path

import httpx
import pytest
import yaml
from operator_cases import JOBS, dljob, eventually, header, pods_of, start
from powerflow.operator.connection import Source, connection_info, load_configuration
from support.kube_emulator import KubeEmulator
from support.operator_harness import free_port, write_kubeconfig

from powerflow.cli import main

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

LEASE = "/apis/coordination.k8s.io/v1/namespaces/powerflow-system/leases/powerflow-operator"


async def test_command_logs_in_with_kubeconfig_and_creates_workers(
    kmock: KubeEmulator, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The real command, token auth: kopf's watches and the loop's client both log in
    with the file's token, and a DLJob gets worker pods. A SIGTERM stops it cleanly
    (exit 0) and releases its Lease."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="s3cret")
    proc = await start(
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-port",
        "0",
        "--liveness",
        f"http://127.0.0.1:{free_port()}/healthz",
        "--profiling-window",
        "0",
    )
    try:
        await api.post(JOBS, json=dljob("resnet"))
        pods = await eventually(lambda: pods_of(api, "resnet"), timeout=60)
        assert all(p["metadata"]["name"].startswith("resnet-g1-w") for p in pods)
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, output.decode()[-2000:]
    theirs = [r for r in kmock if not (header(r, "User-Agent") or "").startswith("python-httpx")]
    agents = {(header(r, "User-Agent") or "").split("/")[0] for r in theirs}
    assert {"kopf", "powerflow-operator"} <= agents
    assert {header(r, "Authorization") for r in theirs} == {"Bearer s3cret"}
    lease = (await api.get(LEASE)).json()
    assert lease["spec"].get("holderIdentity", "") == ""  # released at shutdown


async def test_missing_kubeconfig_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    proc = await start("--kubeconfig", str(missing), "--metrics-port", "0")
    output, _ = await asyncio.wait_for(proc.communicate(), 60)
    lines = output.decode().strip().splitlines()
    assert proc.returncode == 2
    assert lines == [f"powerflow operator: error: kubeconfig {missing}: no such file"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clusters: [\n", "not a usable kubeconfig"),
        ("just a string", "not a usable kubeconfig"),
        ("apiVersion: v1\nkind: Config\n", "current-context"),
    ],
)
def test_garbage_kubeconfig_is_one_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    expected: str,
) -> None:
    """Through ``$KUBECONFIG`` (no ``--kubeconfig``), before anything starts."""
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["operator", "--metrics-port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"powerflow operator: error: {path}: ")
    assert expected in err[0]


async def test_a_busy_liveness_port_is_one_line_and_exit_2(
    kmock: KubeEmulator, tmp_path: Path
) -> None:
    """kopf's liveness server failed on its bind in a traceback, and the operator
    stopped with a line that did not name the option."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="t")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        live = f"http://127.0.0.1:{port}/healthz"
        proc = await start(
            "--kubeconfig", str(kubeconfig), "--metrics-port", "0", "--liveness", live
        )
        output, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, output.decode()[-2000:]
    last = output.decode().strip().splitlines()[-1]
    assert last.startswith(
        f"powerflow operator: error: --liveness: cannot listen on 127.0.0.1:{port}"
    )
    assert "Traceback" not in output.decode()


async def test_a_liveness_port_the_ingest_took_is_one_line_and_exit_2(
    kmock: KubeEmulator, tmp_path: Path
) -> None:
    """Checked after the ingest's bind: before it, the check passed, the ingest took the
    port and kopf's liveness server failed in a traceback."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url), token="t")
    port = free_port()
    proc = await start(
        *("--kubeconfig", str(kubeconfig), "--metrics-port", "0"),
        *("--ingest-host", "127.0.0.1", "--ingest-port", str(port)),
        *("--liveness", f"http://127.0.0.1:{port}/healthz"),
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, output.decode()[-2000:]
    last = output.decode().strip().splitlines()[-1]
    assert last.startswith(
        f"powerflow operator: error: --liveness: cannot listen on 127.0.0.1:{port}"
    )


def test_in_cluster_without_service_account_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a pod (``KUBERNETES_SERVICE_HOST`` set) the service account comes first."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    assert main(["operator", "--metrics-port", "0"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("powerflow operator: error: in-cluster service account: ")


def test_login_uses_the_same_configuration_as_the_client(tmp_path: Path) -> None:
    """kopf's credentials come from the configuration the ``kubernetes`` client uses:
    server, TLS verification, client certificate and key, bearer token."""
    path = tmp_path / "kubeconfig"
    cert = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nx\n").decode()
    key = base64.b64encode(b"-----BEGIN PRIVATE KEY-----\ny\n").decode()
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://10.0.0.1:6443",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "client-certificate-data": cert,
                            "client-key-data": key,
                            "token": "t0k",
                        },
                    }
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    cfg = load_configuration(Source(str(path)))
    info = connection_info(cfg)
    assert info.server == cfg.host == "https://10.0.0.1:6443"
    assert info.insecure is True and cfg.verify_ssl is False
    assert (info.scheme, info.token) == ("Bearer", "t0k")
    assert info.certificate_path == cfg.cert_file and info.private_key_path == cfg.key_file
    assert Path(str(info.certificate_path)).read_bytes().startswith(b"-----BEGIN CERTIFICATE")
