"""``--tolerate``: the node taints PowerFlow's pools accept, on the extender and the operator.

A cluster whose GPU nodes carry ``dedicated=gpu:NoSchedule`` had an empty pool:
the extender reported every PowerFlow pod unresolvable and the operator
planned 0 GPUs, whatever the DLJobs' pods tolerated, and nothing let the
admin change it. Both components are started here through the command-line
parser a user runs (``powerflow.cli.build_parser``) and the functions their
commands call, against the emulated API server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from extender_bodies import args, go_json, node, pod
from operator_cases import JOBS, NS, ThresholdPolicy, dljob, eventually, models, pods_of
from operator_cases import node as operator_node
from powerflow.extender import create_app
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args, write_kubeconfig

from powerflow.cli import build_parser, main
from powerflow.commands.extender import app_options
from powerflow.core import contract
from powerflow.core.taints import GPU_TOLERATIONS, parse_toleration, pool_tolerations

DEDICATED = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("text", "toleration"),
    [
        ("dedicated=gpu:NoSchedule", {"key": "dedicated", "operator": "Equal", "value": "gpu",
                                      "effect": "NoSchedule"}),
        ("nvidia.com/gpu", {"key": "nvidia.com/gpu", "operator": "Exists"}),
        ("example.com/pool:NoExecute", {"key": "example.com/pool", "operator": "Exists",
                                        "effect": "NoExecute"}),
        ("team=ml", {"key": "team", "operator": "Equal", "value": "ml"}),
        ("team=:NoSchedule", {"key": "team", "operator": "Equal", "value": "",
                              "effect": "NoSchedule"}),
    ],
)  # fmt: skip
def test_kubectl_taint_syntax_reads_as_a_toleration(text: str, toleration: dict[str, str]) -> None:
    assert parse_toleration(text) == toleration


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "key '' is not a valid label key"),
        (":NoSchedule", "key '' is not a valid label key"),
        ("bad key:NoSchedule", "key 'bad key' is not a valid label key"),
        ("a=b c:NoSchedule", "value 'b c' is not a valid label value"),
        ("dedicated=gpu:Never", "effect 'Never' is not one of NoSchedule, PreferNoSchedule"),
        ("dedicated=gpu:", "effect '' is not one of"),
    ],
)
def test_bad_toleration_syntax_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match="syntax: KEY") as caught:
        parse_toleration(text)
    assert why in str(caught.value) and "\n" not in str(caught.value)


def test_no_option_keeps_the_gpu_taint_and_options_replace_it() -> None:
    assert pool_tolerations(None) == GPU_TOLERATIONS
    assert pool_tolerations(["dedicated=gpu:NoSchedule", "nvidia.com/gpu"]) == (
        parse_toleration("dedicated=gpu:NoSchedule"),
        *GPU_TOLERATIONS,
    )


@pytest.mark.parametrize("command", ["extender", "operator"])
def test_a_bad_tolerate_option_is_one_line_and_exit_code_2(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    argv = [command, "--kubeconfig", str(kubeconfig), "--tolerate", "dedicated=gpu:Sometimes"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"powerflow {command}: error: --tolerate: toleration ")
    assert "effect 'Sometimes' is not one of" in err


def test_both_commands_take_repeated_tolerate_options() -> None:
    parser = build_parser()
    for command in ("extender", "operator"):
        parsed = parser.parse_args([command, "--tolerate", "a=b:NoSchedule", "--tolerate", "c"])
        assert parsed.tolerate == ["a=b:NoSchedule", "c"]
        assert parser.parse_args([command]).tolerate is None


def tainted_gpu_node(name: str) -> dict[str, Any]:
    body = node(name, 8)
    body["spec"]["taints"] = [dict(DEDICATED)]
    return body


def gang_worker(tolerate: bool) -> dict[str, Any]:
    body = pod("j-0", job="j", workers=16, gpus=1)
    if tolerate:
        toleration = {"key": "dedicated", "operator": "Equal", "value": "gpu"}
        body["spec"]["tolerations"].append({**toleration, "effect": "NoSchedule"})
    return body


async def start_extender(kmock: KubeEmulator, tmp_path: Path, *options: str) -> Any:
    """The app ``powerflow extender --kubeconfig FILE OPTIONS`` serves, its mirror running."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))
    parsed = build_parser().parse_args(["extender", "--kubeconfig", str(kubeconfig), *options])
    app = create_app(**app_options(parsed))
    await app.state.extender.start()
    return app


async def filter_gang(app: Any, worker: dict[str, Any]) -> dict[str, Any]:
    nodes = [tainted_gpu_node("a"), tainted_gpu_node("b")]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ext") as ext:
        for _ in range(500):
            if (await ext.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        body = go_json(args(worker, nodes, cache_capable=True))
        answer: dict[str, Any] = (await ext.post("/filter", content=body, headers=JSON)).json()
        return answer


@pytest.mark.kmock(cls=KubeEmulator)
async def test_extender_places_gangs_on_nodes_with_a_tolerated_taint(
    kmock: KubeEmulator, tmp_path: Path
) -> None:
    kmock.load_builtins()
    async with httpx.AsyncClient(base_url=str(kmock.url)) as api:
        for name in ("a", "b"):
            assert (await api.post("/api/v1/nodes", json=tainted_gpu_node(name))).is_success
    without = await start_extender(kmock, tmp_path)
    with_option = await start_extender(kmock, tmp_path, "--tolerate", "dedicated=gpu:NoSchedule")
    try:
        # The default pools only accept the nvidia.com/gpu taint: the pool is empty.
        answer = await filter_gang(without, gang_worker(tolerate=True))
        assert answer["NodeNames"] == [] and set(answer["FailedAndUnresolvableNodes"]) == {"a", "b"}
        assert "PowerFlow's pool is empty" in answer["FailedAndUnresolvableNodes"]["a"]
        # Accepted by the pools, tolerated by the pod: a gang of 16 gets both nodes.
        answer = await filter_gang(with_option, gang_worker(tolerate=True))
        assert sorted(answer["NodeNames"]) == ["a", "b"], answer
        state = with_option.state.extender.state
        (gang,) = state.gangs.values()
        assert sorted({n for n, _ in gang.block}) == ["a", "b"] and len(gang.block) == 16
        # The pools accept the taint, but a pod must tolerate it itself.
        other = gang_worker(tolerate=False)
        other["metadata"]["name"] = "k-0"
        other["metadata"]["labels"][contract.JOB_LABEL] = "k"
        answer = await filter_gang(with_option, other)
        assert answer["NodeNames"] == []
        assert "does not tolerate the node's taint dedicated=gpu:NoSchedule" in str(answer)
    finally:
        await without.state.extender.stop()
        await with_option.state.extender.stop()


@pytest.mark.kmock(cls=KubeEmulator)
async def test_operator_plans_on_nodes_with_a_tolerated_taint(
    kmock: KubeEmulator, tmp_path: Path
) -> None:
    kmock.load_builtins()
    kmock.declare(f"{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}", contract.KIND)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url))
    async with httpx.AsyncClient(base_url=str(kmock.url)) as api:
        for name in ("n1", "n2"):
            body = operator_node(name, 4)
            body.setdefault("spec", {})["taints"] = [dict(DEDICATED)]
            assert (await api.post("/api/v1/nodes", json=body)).is_success
        cm = {"metadata": {"name": contract.BUDGET_CONFIGMAP}, "data": {"powerLimitWatts": "5000"}}
        await api.post("/api/v1/namespaces/powerflow-system/configmaps", json=cm)
        job = dljob("resnet")
        job["spec"]["template"]["spec"]["tolerations"] = [
            {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
        ]

        async def phase() -> str:
            status = (await api.get(f"{JOBS}/resnet")).json().get("status", {})
            return str(status.get("phase", ""))

        # Without the option the plan has no GPU node: the job waits, no pod is made.
        args_default = operator_args(kubeconfig, "--debounce", "0.02")
        async with Operator(args_default, ThresholdPolicy(), models):
            await api.post(JOBS, json=job)
            assert await eventually(phase) == "Pending"
            assert await pods_of(api, "resnet") == []
        tolerate = operator_args(
            kubeconfig, "--debounce", "0.02", "--tolerate", "dedicated=gpu:NoSchedule"
        )
        async with Operator(tolerate, ThresholdPolicy(), models):

            async def four_pods() -> list[dict[str, Any]]:
                pods = await pods_of(api, "resnet")
                return pods if len(pods) == 4 else []

            pods = await eventually(four_pods)
        assert all(p["metadata"]["namespace"] == NS for p in pods)
        assert pods[0]["spec"]["tolerations"][-1]["key"] == "dedicated"
