"""``powerflow budget what-if`` through the command line: the demo queue, and the live
queue of an emulated cluster (its DLJobs, nodes and budget ConfigMap)."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from operator_cases import node
from powerflow.operator.learning import params_status
from support.api_faults import Answer
from support.kube_emulator import KubeEmulator
from support.operator_harness import free_port, write_kubeconfig

from powerflow.cli import main
from powerflow.core import contract
from powerflow.core.gpu_facts import GpuFacts, GpuReport, encode_record
from powerflow.core.gpus import A100, gpu_spec
from powerflow.core.models.priors import load_prior
from powerflow.kubeapi import client as client_module

NS = "ml"
SYSTEM = "powerflow-system"
JOBS = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{NS}/{contract.PLURAL}"
CMS = f"/api/v1/namespaces/{SYSTEM}/configmaps"
PNG = b"\x89PNG\r\n\x1a\n"


def test_demo_predicts_each_budget_as_a_table_json_and_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "whatif.png"
    argv = ["budget", "what-if", "--demo", "--jobs", "12", "--nodes", "2", "--pmax-watts", "300"]
    argv += ["--etas", "0.3,1", "--json", "--plot", str(plot)]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["jobs"]) == 12 and (out["nodes"], out["gpus_per_node"]) == (2, 8)
    low, high = out["predictions"]
    # eta * G * P_max: the budget the simulator planned against
    assert low["limit_w"] == pytest.approx(0.3 * 16 * 300)
    assert high["limit_w"] == pytest.approx(1.0 * 16 * 300)
    # a lower budget: less energy, longer jobs, a later end
    assert low["total_energy_j"] < high["total_energy_j"]
    assert low["avg_jct_s"] > high["avg_jct_s"]
    assert low["completion_s"] >= high["completion_s"]
    assert plot.read_bytes().startswith(PNG)
    watts = ["budget", "what-if", "--demo", "--jobs", "12", "--nodes", "2", "--watts", "1500"]
    assert main(watts) == 0
    table = capsys.readouterr().out
    assert "1500 W" in table and "JCT h" in table
    rows = [line for line in table.splitlines() if line[:1] in "┏┃┡│└"]
    assert rows and max(map(len, rows)) <= 80  # piped: 140 columns, the table in 80


def test_the_scheduler_the_operator_runs_is_the_one_predicted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--scheduler powerflow+`` predicts PowerFlow+ (the operator's ``--scheduler``):
    at the same eta its floor on returns spends less energy than the paper's greedy."""
    argv = ["budget", "what-if", "--demo", "--jobs", "12", "--nodes", "2", "--pmax-watts", "300"]
    argv += ["--etas", "0.6", "--json"]
    energy = {}
    for name in ("powerflow", "powerflow+"):
        assert main([*argv, "--scheduler", name]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["scheduler"] == name
        energy[name] = out["predictions"][0]["total_energy_j"]
    assert energy["powerflow+"] < energy["powerflow"]


def test_a_budget_too_low_for_any_job_is_named_and_the_others_predicted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An admin scanning a range may go below what one job draws: that budget never
    finishes the queue, which the what-if says, and it predicts the rest."""
    argv = ["budget", "what-if", "--demo", "--jobs", "3", "--nodes", "2"]
    assert main([*argv, "--watts", "1,20000", "--json"]) == 0
    captured = capsys.readouterr()
    (only,) = json.loads(captured.out)["predictions"]
    assert only["power_limit_w"] == 20000
    assert "1 W: the queue never finishes under it" in captured.err
    assert main([*argv, "--watts", "1"]) == 2
    assert "no budget lets the queue finish" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--etas", "0.3,x"], "numbers separated by commas"),
        (["--etas", "1.5"], "every eta must be in (0, 1]"),
        (["--watts", "-3"], "every limit must be a positive finite number"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--gpu", "Z900"], "unknown GPU type 'Z900'; known: A10, A100"),
    ],
)
def test_demo_refuses_bad_budgets_in_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    assert main(["budget", "what-if", "--demo", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("whatif", "has no file type"),  # matplotlib would write whatif.png
        ("whatif.xyz", "'.xyz' is not a figure type matplotlib writes"),
        ("a-file/whatif.png", "a-file is a file, not a folder"),
    ],
)
def test_a_plot_that_cannot_be_written_is_refused_before_predicting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, words: str
) -> None:
    (tmp_path / "a-file").write_text("")
    plot = tmp_path / where
    assert main(["budget", "what-if", "--demo", "--jobs", "2", "--plot", str(plot)]) == 2
    captured = capsys.readouterr()
    assert words in captured.err and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""  # refused before the prediction, not after its table
    assert list(tmp_path.iterdir()) == [tmp_path / "a-file"]


# ------------------------------------------------------------------ live queue


@pytest.fixture
async def api(kmock: KubeEmulator) -> AsyncIterator[httpx.AsyncClient]:
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    async with httpx.AsyncClient(base_url=str(kmock.url)) as client:
        for name in ("n1", "n2"):
            assert (await client.post("/api/v1/nodes", json=node(name, 4))).status_code == 201
        yield client


def dljob(name: str, model: str, iterations: int = 100000) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {
            "model": model,
            "globalBatchSize": 64,
            "iterations": iterations,
            "gpus": {"requested": 4, "min": 1, "max": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "pytorch"}]}},
        },
    }


async def add_job(api: httpx.AsyncClient, body: dict[str, Any], status: dict[str, Any]) -> None:
    assert (await api.post(JOBS, json=body)).status_code == 201
    if status:
        url = f"{JOBS}/{body['metadata']['name']}/status"
        current = (await api.get(url)).json()
        current["status"] = status
        assert (await api.put(url, json=current)).is_success


async def what_if(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    argv = ["budget", "what-if", "--kubeconfig", str(kubeconfig), "--etas", "0.4,1", "--json"]
    code = await asyncio.to_thread(main, argv)  # the emulator serves from this loop
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out: dict[str, Any] = json.loads(captured.out)
    out["stderr"] = captured.err
    return out


@pytest.mark.kmock(cls=KubeEmulator)
async def test_the_live_queue_uses_the_cluster_the_budget_in_force_and_status_models(
    kmock: KubeEmulator, api: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two jobs wait or run, one is done and one is invalid (left out, said on stderr);
    the cluster's 2 x 4 GPUs and the ConfigMap's pMaxWatts make the limits, and the
    budget in force (a window of its schedule covering the whole day but one second)
    is added and marked. A job's ``status.model.params`` is its model: a slower one
    there lengthens the predicted JCT."""
    cm = {
        "metadata": {"name": contract.BUDGET_CONFIGMAP},
        "data": {
            "eta": "0.9",
            "pMaxWatts": "300",
            "schedule": "- {start: '00:00:01', end: '00:00:00', eta: 0.5}",
        },
    }
    assert (await api.post(CMS, json=cm)).status_code == 201
    await add_job(api, dljob("a", "resnet50"), {"progress": {"iterations": 5000}})
    await add_job(api, dljob("b", "resnet50"), {})
    await add_job(api, dljob("done", "resnet50"), {"phase": "Succeeded"})
    bad = dljob("bad", "resnet50")
    bad["spec"]["globalBatchSize"] = 0
    await add_job(api, bad, {})
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(kmock.url))

    out = await what_if(kubeconfig, capsys)
    assert out["jobs"] == [f"{NS}/a", f"{NS}/b"]
    assert (out["nodes"], out["gpus_per_node"]) == (2, 4)
    assert f"{NS}/bad left out" in out["stderr"]
    by_eta = {p["eta"]: p for p in out["predictions"]}
    assert set(by_eta) == {0.4, 1.0, 0.5}
    assert by_eta[0.5]["in_force"] and not by_eta[0.4]["in_force"]
    assert by_eta[0.4]["limit_w"] == pytest.approx(0.4 * 8 * 300)

    slower = {"params": {**params_status(load_prior("vgg16")), "model": "vgg16"}, "fits": 3}
    url = f"{JOBS}/b/status"
    current = (await api.get(url)).json()
    current["status"] = {"model": slower}
    assert (await api.put(url, json=current)).is_success
    again = await what_if(kubeconfig, capsys)
    jct = {p["eta"]: p["avg_jct_s"] for p in again["predictions"]}
    assert jct[1.0] > 1.05 * by_eta[1.0]["avg_jct_s"]  # the same prior: equal


def test_an_unreachable_cluster_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server)
    assert main(["budget", "what-if", "--kubeconfig", str(kubeconfig)]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach the API server at {server}" in err and err.count("\n") == 1, err


@pytest.mark.kmock(cls=KubeEmulator)
async def test_a_cluster_that_does_not_answer_is_one_line_not_a_hang(
    kmock: KubeEmulator,
    api: httpx.AsyncClient,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "REQUEST_TIMEOUT_S", (1.0, 0.2))
    kmock.faults.inject("list", "nodes", Answer(delay_s=30.0))  # as a hung API server
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(kmock.url))
    argv = ["budget", "what-if", "--kubeconfig", str(kubeconfig)]
    code = await asyncio.wait_for(asyncio.to_thread(main, argv), 20)
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot reach the API server at {kmock.url}".rstrip("/") in err, err
    assert "timed out" in err and err.count("\n") == 1, err


@pytest.mark.kmock(cls=KubeEmulator)
async def test_a_budget_in_force_that_stops_every_job_is_named_not_predicted(
    kmock: KubeEmulator, api: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """A zero budget is valid (the peak window of a site that stops training then): the
    queue never finishes under it, so the what-if says so and predicts the others."""
    cm = {"metadata": {"name": contract.BUDGET_CONFIGMAP}, "data": {"powerLimitWatts": "0"}}
    assert (await api.post(CMS, json=cm)).status_code == 201
    await add_job(api, dljob("a", "resnet50"), {})
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(kmock.url))

    out = await what_if(kubeconfig, capsys)
    assert [p["eta"] for p in out["predictions"]] == [0.4, 1.0]
    assert not any(p["in_force"] for p in out["predictions"])
    assert "the budget in force (powerLimitWatts 0 W) stops every job" in out["stderr"]


def test_validate_runs_the_a100_trace_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "what-if", "--validate", "--gpu", "H100-SXM"]) == 2
    err = capsys.readouterr().err
    assert "powerflow simulate --gpu runs another type" in err and err.count("\n") == 1


def test_validate_compares_with_the_simulator_run_anyone_can_repeat(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--validate``'s simulated side is ``powerflow simulate``'s own run (ground
    truth, fitted models) of the same trace and cluster."""
    window = ["--hours", "0.5", "--nodes", "8"]
    argv = ["budget", "what-if", "--validate", *window, "--etas", "0.5", "--json"]
    assert main([*argv, "--workers", "1"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    simulate = ["simulate", "--scheduler", "powerflow", "--eta", "0.5", *window, "--json"]
    assert main(simulate) == 0
    run = json.loads(capsys.readouterr().out)
    assert row["simulated_avg_jct_s"] == run["avg_jct_s"]
    assert row["simulated_energy_j"] == run["total_energy_j"]
    assert row["simulated_completion_s"] == run["makespan_s"]
    for what in ("avg_jct_s", "energy_j", "completion_s"):
        assert row[f"predicted_{what}"] > 0


# ------------------------------------------------------------------ GPU types

H100 = gpu_spec("H100-SXM")
H100_LABEL = "NVIDIA-H100-80GB-HBM3"


def test_the_demo_predicts_on_the_gpu_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    """``--gpu``: the simulated cluster and the priors on that type, so the budget's
    ``P_max`` is that type's (here no ``--pmax-watts`` says otherwise)."""
    argv = ["budget", "what-if", "--demo", "--jobs", "6", "--nodes", "2", "--etas", "1"]
    limits = {}
    for gpu in (None, "H100-SXM"):
        assert main([*argv, "--json", *(["--gpu", gpu] if gpu else [])]) == 0
        out = json.loads(capsys.readouterr().out)
        limits[out["gpu"]] = out["predictions"][0]["limit_w"]
    assert limits == {"A100": pytest.approx(16 * A100.p_max_w), "H100-SXM": 16 * H100.p_max_w}


async def relabel(api: httpx.AsyncClient, node: str, product: str, **annotations: str) -> None:
    meta: dict[str, Any] = {"labels": {contract.GPU_PRODUCT_LABEL: product}}
    if annotations:
        meta["annotations"] = annotations
    patch = {"metadata": meta}
    headers = {"Content-Type": "application/merge-patch+json"}
    assert (await api.patch(f"/api/v1/nodes/{node}", json=patch, headers=headers)).is_success


@pytest.mark.kmock(cls=KubeEmulator)
async def test_the_live_queue_is_predicted_on_the_pools_gpu_type(
    kmock: KubeEmulator, api: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """An H100 cluster is simulated as H100s (its ``P_max``, the priors carried over to
    it), and a job's params fitted on another type give way to its prior there, as in
    the operator; a node of another product is left out and named, as the operator
    plans one pool."""
    for name in ("n1", "n2"):
        await relabel(api, name, H100_LABEL)
    third = node("n3", 2)  # an A100 node: another pool
    assert (await api.post("/api/v1/nodes", json=third)).status_code == 201
    a100_fit = {"params": params_status(load_prior("vgg16")), "fits": 3}
    await add_job(api, dljob("a", "resnet50"), {"model": a100_fit})
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(kmock.url))
    out = await what_if(kubeconfig, capsys)
    assert (out["nodes"], out["gpus_per_node"], out["gpu"]) == (2, 4, "H100-SXM")
    by_eta = {p["eta"]: p for p in out["predictions"]}
    assert by_eta[1.0]["limit_w"] == pytest.approx(8 * H100.p_max_w)
    assert "model fitted on A100 GPUs, the pool is now H100-SXM" in out["stderr"]
    assert "n3 (NVIDIA-A100-SXM4-40GB)" in out["stderr"]


@pytest.mark.kmock(cls=KubeEmulator)
async def test_a_pool_the_catalogue_lacks_is_predicted_from_its_records_or_refused(
    kmock: KubeEmulator, api: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nodes labelled with a product the catalogue lacks: with the GPU records the
    operator keeps on them, the pool's discovered type (H100s here); without, the
    simulator has no clocks or power to run: one line that names ``--gpu``, and with
    ``--gpu`` the type it names."""
    for name in ("n1", "n2"):
        await relabel(api, name, "NVIDIA-Z900")
    await add_job(api, dljob("a", "resnet50"), {})
    kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig", str(kmock.url))
    argv = ["budget", "what-if", "--kubeconfig", str(kubeconfig), "--etas", "1", "--json"]
    assert await asyncio.to_thread(main, argv) == 2
    err = capsys.readouterr().err
    assert "GPU type is unknown (product label 'NVIDIA-Z900'" in err and "--gpu" in err
    assert err.count("\n") == 1
    assert await asyncio.to_thread(main, [*argv, "--gpu", "L40S"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["gpu"] == "L40S"
    assert "predicted as L40S (--gpu)" in captured.err
    facts = GpuFacts(0, "NVIDIA H100 80GB HBM3", H100.clocks_mhz, 700.0, 200.0, 700.0)
    for name in ("n1", "n2"):
        record = encode_record(GpuReport(name, (facts,)), time.time())
        await relabel(api, name, "NVIDIA-Z900", **{contract.GPU_REPORT_ANNOTATION: record})
    out = await what_if(kubeconfig, capsys)
    assert out["gpu"] == "H100-SXM"
    assert await asyncio.to_thread(main, [*argv, "--gpu", "H100-SXM"]) == 0
    assert "(--gpu)" not in capsys.readouterr().err  # the pool's own type, as reported


def test_the_validation_table_fits_80_columns_with_large_figures() -> None:
    from rich.console import Console

    from powerflow.commands.budget import validation_table

    row = {"eta": 0.55}
    for what, value in (("avg_jct_s", 99.99 * 3600), ("energy_j", 123_456 * 3.6e6)):
        row |= {f"predicted_{what}": value, f"simulated_{what}": value * 1.25}
    row |= {"predicted_completion_s": 999.9 * 3600, "simulated_completion_s": 888.8 * 3600}
    for width in (140, 80):
        console = Console(record=True, width=width)
        console.print(validation_table([row], "validation on the default trace"))
        text = console.export_text()
        assert max(map(len, text.splitlines())) <= 80
        for cell in ("99.99", "124.99", "123,456", "154,320", "999.9", "888.8", "+12.5%"):
            assert cell in text
        assert text.count("-20.0%") == 2
