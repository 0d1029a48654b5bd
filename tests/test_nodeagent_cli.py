"""``powerflow nodeagent`` as a user runs it: ``--once``, bad settings, no GPU, SIGTERM,
and the metrics it exports."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from operator_cases import clean_env
from powerflow.nodeagent.metrics import GpuMetrics
from prometheus_client import generate_latest
from support.kube_emulator import KubeEmulator
from support.nodeagent_harness import DLJOB_RESOURCE, NODE, create_worker, worker_pod
from support.nvml_library import has_nvml_library
from support.operator_harness import free_port, write_kubeconfig

from powerflow.cli import main
from powerflow.core import contract
from powerflow.core.devices import Workload
from powerflow.lab.simulated_gpus import SimulatedGpus

pytestmark = pytest.mark.kmock(cls=KubeEmulator)


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    kmock.declare(DLJOB_RESOURCE, contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        assert (
            await client.post("/api/v1/nodes", json={"metadata": {"name": NODE}})
        ).status_code == 201
        yield client


@pytest.fixture
def kubeconfig(kmock: KubeEmulator, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))


async def test_once_applies_prints_and_exits(
    api: httpx.AsyncClient, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = worker_pod("a", 2, frequency_mhz="1400")
    assert (await create_worker(api, body)).status_code == 201
    argv = ["nodeagent", "--kubeconfig", str(kubeconfig), "--node-name", NODE]
    argv += ["--simulate", "4", "--once"]
    assert await asyncio.to_thread(main, argv) == 0
    out = capsys.readouterr().out.splitlines()
    (locked,) = [line for line in out if line.startswith("GPU 2 ")]
    assert "clock locked at 1395 MHz" in locked and "pod ns/a" in locked
    assert sum("clocks reset" in line for line in out) == 3  # the other GPUs
    assert any(line.startswith("ClockClamped on ns/a:") for line in out)


async def test_without_a_gpu_and_without_simulate_is_one_line_and_exit_2(
    api: httpx.AsyncClient, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if has_nvml_library():  # a GPU machine: this path would open real GPUs
        return
    argv = ["nodeagent", "--kubeconfig", str(kubeconfig), "--node-name", NODE, "--once"]
    assert await asyncio.to_thread(main, argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("powerflow nodeagent: error: NVML: ")
    assert "libnvidia-ml.so.1" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--node-name", ""], "--node-name is required (or set NODE_NAME)"),
        (["--node-name", NODE, "--metrics-port", "70000"], "--metrics-port is not a TCP port"),
        (["--node-name", NODE, "--window", "0"], "--window must be > 0 s"),
        (
            ["--node-name", NODE, "--ingest-url", "powerflow-ingest:9443"],
            "--ingest-url 'powerflow-ingest:9443': expected http(s)://HOST[:PORT]",
        ),
        (
            ["--node-name", NODE, "--ingest-url", "http://"],
            "--ingest-url 'http://': expected http(s)://HOST[:PORT]",
        ),
        (
            ["--node-name", NODE, "--ingest-url", "http://h:1", "--ingest-ca", "/dev/null"],
            "--ingest-ca needs an https:// --ingest-url",
        ),
        (
            ["--node-name", NODE, "--ingest-url", "https://h:1", "--ingest-ca", "/nonexistent"],
            "--ingest-ca /nonexistent: [Errno 2] No such file or directory",
        ),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["nodeagent", "--simulate", "1", *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"powerflow nodeagent: error: {message}"
    ]


def test_missing_kubeconfig_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    argv = ["nodeagent", "--kubeconfig", str(missing), "--node-name", NODE, "--simulate", "1"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"powerflow nodeagent: error: kubeconfig {missing}: no such file"


def test_node_name_defaults_to_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from powerflow.cli import build_parser

    monkeypatch.setenv("NODE_NAME", "gpu-7")
    args = build_parser().parse_args(["nodeagent"])
    assert args.node_name == "gpu-7"
    assert (args.metrics_port, args.worker_port) == (
        contract.AGENT_METRICS_PORT,
        contract.AGENT_WORKER_PORT,
    )


async def _scrape(port: int) -> str:
    async with httpx.AsyncClient() as client:
        try:
            return (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        except httpx.TransportError:
            return ""


async def test_sigterm_restores_defaults_and_metrics_show_the_locked_clock(
    api: httpx.AsyncClient, kubeconfig: Path
) -> None:
    """The real command in a process of its own: metrics label the pod's GPU with the
    pod and job and show its locked clock; SIGTERM restores defaults and exits 0."""
    assert (
        await create_worker(api, worker_pod("a", 1, job="j", frequency_mhz="1200"))
    ).status_code == 201
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "powerflow", "nodeagent", "--kubeconfig", str(kubeconfig)),
        *("--node-name", NODE, "--simulate", "2", "--metrics-port", str(port)),
        *("--worker-port", "0"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(),
    )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        want = "powerflow_gpu_locked_clock_hertz{"
        text = ""
        while loop.time() < deadline:
            text = await _scrape(port)
            if any(
                line.startswith(want) and 'worker_pod="a"' in line and line.endswith(" 1.2e+09")
                for line in text.splitlines()
            ):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"no locked clock in the metrics:\n{text}")
        line = next(x for x in text.splitlines() if x.startswith(want) and 'worker_pod="a"' in x)
        assert 'dljob="j"' in line and 'dljob_namespace="ns"' in line and f'node="{NODE}"' in line
        assert "powerflow_gpu_power_watts{" in text
        assert "powerflow_gpu_energy_joules_total{" in text
        assert "powerflow_gpu_sm_clock_hertz{" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(proc.communicate(), 30)
    log = output.decode()
    assert proc.returncode == 0, log[-2000:]
    assert log.count("default clocks and power limits restored on 2 GPU(s)") == 2, log[-2000:]


def test_energy_counter_survives_a_driver_restart() -> None:
    gpus = SimulatedGpus(2, node=NODE)
    gpus.assign(0, Workload("resnet50", 1, 1, 32))
    metrics = GpuMetrics(NODE)
    infos = gpus.gpus()
    users = {0: ("ns", "j", "a")}
    labels = {"node": NODE, "gpu": infos[0].uuid, "dljob_namespace": "ns", "dljob": "j"}
    labels["worker_pod"] = "a"

    def energy() -> float:
        value = metrics.registry.get_sample_value("powerflow_gpu_energy_joules_total", labels)
        assert value is not None
        return value

    metrics.sample(gpus, infos, users, lambda _gpu: None)
    assert energy() == 0.0
    gpus.advance(10.0)
    metrics.sample(gpus, infos, users, lambda _gpu: None)
    before = energy()
    assert before > 10 * 52  # more than idle power for 10 s
    gpus.advance(5.0)
    gpus.restart_driver()  # the counter starts again from 0
    gpus.advance(5.0)
    metrics.sample(gpus, infos, users, lambda _gpu: None)
    after = energy()
    assert before < after < before + 10 * 400  # never backwards; at most 5 s lost
    power = metrics.registry.get_sample_value("powerflow_gpu_power_watts", labels)
    assert power == gpus.power_mw(0) / 1000.0
    idle = {
        "node": NODE,
        "gpu": infos[1].uuid,
        "dljob_namespace": "",
        "dljob": "",
        "worker_pod": "",
    }
    assert metrics.registry.get_sample_value("powerflow_gpu_sm_clock_hertz", idle) is not None
    metrics.sample(gpus, infos, {}, lambda _gpu: 1200)  # the pod left: its series go
    exposition = generate_latest(metrics.registry).decode()
    assert 'worker_pod="a"' not in exposition
    empty = {**labels, "dljob_namespace": "", "dljob": "", "worker_pod": ""}
    assert metrics.registry.get_sample_value("powerflow_gpu_locked_clock_hertz", empty) == 1.2e9


def test_simulated_gpus_tick_in_10_ms_steps() -> None:
    """``--simulate``: a burst of reads within one tick sees one instant (one noisy draw
    per GPU), so a metrics sample of 8 GPUs costs 8 draws, not 24 x 8."""
    from powerflow.commands.nodeagent import SIM_TICK_S, ticks

    readings = iter([10.0, 10.0049, 10.0101, 12.34567])
    now = ticks(lambda: next(readings), SIM_TICK_S)
    assert [round(now(), 9) for _ in range(4)] == [10.0, 10.0, 10.01, 12.34]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clusters: [\n", "not a usable kubeconfig"),
        ("apiVersion: v1\nkind: Config\n", "current-context"),
    ],
)
def test_garbage_kubeconfig_from_env_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    expected: str,
) -> None:
    """Through ``$KUBECONFIG`` (no ``--kubeconfig``), as the operator reads it."""
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["nodeagent", "--node-name", NODE, "--simulate", "1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"powerflow nodeagent: error: {path}: ") and expected in line


def test_in_a_pod_the_service_account_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", "http://x:1")))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    assert main(["nodeagent", "--node-name", NODE, "--simulate", "1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("powerflow nodeagent: error: in-cluster service account: ")
