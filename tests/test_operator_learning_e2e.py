"""The online refit and the profile plan through ``powerflow operator`` against the
emulated API server: samples handed to the operator's sample store (the sink the
ingest endpoint calls) end up as a fitted model in ``status.model``, which a
restarted operator schedules with; the profile plan is on the pods while the job
profiles. Started as a user starts it (``serve`` with a kubeconfig); the models
are the product's (no ``models`` seam)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from operator_cases import (
    BUDGET,
    JOBS,
    MERGE,
    NS,
    ThresholdPolicy,
    dljob,
    eventually,
    pods_of,
    start_workers,
    status_of,
)
from powerflow.nodeagent.pods import parse_profile
from powerflow.operator.learning import SampleStore
from powerflow.operator.profile_plan import plan_annotation
from prometheus_client import CollectorRegistry
from support.kube_emulator import KubeEmulator
from support.operator_harness import Operator, operator_args

from powerflow.core import contract
from powerflow.core.gpus import A100, GPU_SPECS, GpuSpec
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.params import ModelParams
from powerflow.core.models.priors import load_prior, prior_on
from powerflow.core.policy.snapshot import Plan, Snapshot
from powerflow.core.profiling import PAPER_SWEEP
from powerflow.core.telemetry import WindowSample
from powerflow.core.timefmt import parse_time
from powerflow.lab import groundtruth as gt
from powerflow.lab.schedulers import scheduler

pytestmark = pytest.mark.kmock(cls=KubeEmulator)

MODEL = "resnet50"
H100 = GPU_SPECS["H100-SXM"]
H100_LABEL = "NVIDIA-H100-80GB-HBM3"
N, BS = 4, 16  # dljob(): 64 samples per iteration on 4 GPUs


class RecordingPolicy(ThresholdPolicy):
    """Records the parameters of each job's model in every snapshot."""

    def __init__(self) -> None:
        self.params: list[dict[str, ModelParams]] = []
        self.measured: list[dict[str, float | None]] = []

    def plan(self, snapshot: Snapshot) -> Plan:
        # The operator's thread appends while a test reads: measured first, so that a
        # pass whose params a test sees has its measured power recorded too (same index).
        self.measured.append({j.id: j.measured_power_w for j in snapshot.jobs})
        self.params.append({j.id: j.model.params for j in snapshot.jobs})  # type: ignore[attr-defined]
        return super().plan(snapshot)


def operator(kubeconfig: Path, policy: RecordingPolicy, window_s: float = 0.0) -> Operator:
    args = operator_args(kubeconfig, "--profiling-window", str(window_s))
    return Operator(args, policy)


def windows(count: int, gpu: GpuSpec = A100) -> list[WindowSample]:
    """``count`` windows of the job on one node (all 4 GPUs) of type ``gpu``, the
    profile's clocks on that type in turn (its ground truth, 3 % noise, seed 0)."""
    truth = gt.ground_truth(MODEL, gpu)
    rng = np.random.default_rng(0)
    clocks = PAPER_SWEEP.clocks_mhz(gpu)
    out = []
    for i in range(count):
        f = clocks[i % len(clocks)]
        s = gt.measure(truth, N, N, BS, f, rng=rng, noise=0.03)
        out.append(
            WindowSample(
                namespace=NS,
                job="fit",
                generation=1,
                n=N,
                gpus_per_node=N,
                local_batch_size=BS,
                frequency_mhz=f,
                gpus_measured=N,
                iterations=10,
                step_time_s=float(s.step_time_s[0]),
                energy_j=float(s.energy_j[0]),
                end_s=1.0,
            )
        )
    return out


async def running_job(api: httpx.AsyncClient) -> None:
    await api.post(JOBS, json=dljob("fit", model=MODEL))

    async def four() -> list[dict[str, Any]]:
        pods = await pods_of(api, "fit")
        return pods if len(pods) == 4 else []

    await start_workers(api, await eventually(four), "n1")


async def model_status(api: httpx.AsyncClient) -> dict[str, Any]:
    model: dict[str, Any] = (await status_of(api, "fit")).get("model", {})
    return model


async def fast_passes(api: httpx.AsyncClient) -> None:
    """Passes every 0.2 s: samples are fitted at the next pass."""
    interval = {"data": {"powerLimitWatts": "5000", "schedulingIntervalSeconds": "0.2"}}
    await api.patch(BUDGET, json=interval, headers=MERGE)


async def fitted_model(api: httpx.AsyncClient) -> dict[str, Any]:
    """``status.model`` once it holds fitted params."""

    async def fitted() -> dict[str, Any]:
        model = await model_status(api)
        return model if "params" in model else {}

    found: dict[str, Any] = await eventually(fitted)
    return found


async def params_removed(api: httpx.AsyncClient) -> dict[str, Any]:
    """``status.model`` once it holds no params."""

    async def removed() -> dict[str, Any]:
        model = await model_status(api)
        return model if "params" not in model else {}

    found: dict[str, Any] = await eventually(removed)
    return found


def store_of(op: Operator) -> SampleStore:
    assert op.controller is not None and op.controller.learning is not None
    return op.controller.learning


async def test_the_fitted_model_is_in_status_and_a_restart_schedules_with_it(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    await fast_passes(api)
    policy = RecordingPolicy()
    async with operator(kubeconfig, policy) as op:
        await running_job(api)
        assert policy.params[-1][f"{NS}/fit"] == load_prior(MODEL)
        store_of(op).add("n1", windows(21), 1.0)

        model = await fitted_model(api)
        assert model["samples"] == 21 and model["fits"] == 1 and model["prior"] == MODEL
        assert 0 < model["fitErrorPercent"] < 10
        params = ModelParams.from_dict(model["params"])
        assert params != load_prior(MODEL)

        async def scheduled_with_fit() -> bool:
            return policy.params[-1].get(f"{NS}/fit") == params

        await eventually(scheduled_with_fit)
        # the first pass planned with the fit (a later one may be appending meanwhile)
        first = next(i for i, p in enumerate(policy.params) if p.get(f"{NS}/fit") == params)
        watts = policy.measured[first][f"{NS}/fit"]
        assert watts is not None and model["measuredPower"]["watts"] == round(watts, 2)

    restarted = RecordingPolicy()
    async with operator(kubeconfig, restarted):
        await asyncio.sleep(0.5)  # a few passes
        assert restarted.params[0][f"{NS}/fit"] == params  # from the first pass on
        # The power loop corrects with the measured power from the first pass on too.
        assert restarted.measured[0][f"{NS}/fit"] == model["measuredPower"]["watts"]
        assert await model_status(api) == model  # read back, not rewritten


async def label_nodes(api: httpx.AsyncClient, product: str) -> None:
    """Both nodes' ``nvidia.com/gpu.product`` label (GPU feature discovery's)."""
    patch = {"metadata": {"labels": {contract.GPU_PRODUCT_LABEL: product}}}
    for node in ("n1", "n2"):
        assert (await api.patch(f"/api/v1/nodes/{node}", json=patch, headers=MERGE)).is_success


async def events(api: httpx.AsyncClient, reason: str) -> list[dict[str, Any]]:
    found = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
    return [e for e in found if e.get("reason") == reason]


async def test_an_h100_pool_plans_h100_models_fitted_on_its_samples_and_a_restart_keeps_them(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    """The prior carried over to the H100 (at 1,980 MHz the A100 prior's step time at
    1,410 MHz), refitted from windows at the H100's clocks, restored after a restart."""
    await fast_passes(api)
    await label_nodes(api, H100_LABEL)
    policy = RecordingPolicy()
    async with operator(kubeconfig, policy) as op:
        await running_job(api)
        prior = policy.params[-1][f"{NS}/fit"]
        assert prior == prior_on(load_prior(MODEL), H100)
        top = FittedModel(prior).step_time_s(N, N, BS, H100.max_clock_mhz)
        a100 = FittedModel(load_prior(MODEL)).step_time_s(N, N, BS, A100.max_clock_mhz)
        assert top == pytest.approx(a100, rel=1e-12)
        store_of(op).add("n1", windows(21, H100), 1.0)

        model = await fitted_model(api)
        assert model["fits"] == 1 and model["params"]["gpu"] == "H100-SXM"
        assert 0 < model["fitErrorPercent"] < 10
        params = ModelParams.from_dict(model["params"])

        async def scheduled_with_fit() -> bool:
            return policy.params[-1].get(f"{NS}/fit") == params

        await eventually(scheduled_with_fit)

    restarted = RecordingPolicy()
    async with operator(kubeconfig, restarted):
        await asyncio.sleep(0.5)  # a few passes
        assert restarted.params[0][f"{NS}/fit"] == params  # from the first pass on
        assert await model_status(api) == model  # read back, not refitted nor rewritten
        assert await events(api, "ModelGpuChanged") == []


async def test_a_pool_whose_type_changes_restarts_its_jobs_from_the_new_types_prior(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    await fast_passes(api)
    policy = RecordingPolicy()
    async with operator(kubeconfig, policy) as op:
        await running_job(api)
        store_of(op).add("n1", windows(21), 1.0)

        assert (await fitted_model(api))["params"]["gpu"] == "A100"
        await label_nodes(api, H100_LABEL)

        async def on_h100() -> bool:
            return policy.params[-1].get(f"{NS}/fit") == prior_on(load_prior(MODEL), H100)

        await eventually(on_h100)

        async def warned() -> list[dict[str, Any]]:
            return await events(api, "ModelGpuChanged")

        (event,) = await eventually(warned)
        assert event["type"] == "Warning" and event["involvedObject"]["name"] == "fit"
        assert "H100-SXM" in event["message"]

        assert (await params_removed(api))["samples"] == 21


async def test_bad_params_in_status_fall_back_to_the_prior_with_a_warning(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    await api.post(JOBS, json=dljob("fit", model=MODEL))
    bad = {"status": {"model": {"params": {"version": 1, "gpu": "A100"}, "samples": 7}}}
    path = f"{JOBS}/fit/status"
    assert (await api.patch(path, json=bad, headers=MERGE)).is_success
    policy = RecordingPolicy()
    async with operator(kubeconfig, policy):

        async def warned() -> list[dict[str, Any]]:
            events = (await api.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
            return [e for e in events if e.get("reason") == "InvalidModelParams"]

        (event,) = await eventually(warned)
        assert event["type"] == "Warning" and event["involvedObject"]["name"] == "fit"
        assert policy.params[-1][f"{NS}/fit"] == load_prior(MODEL)

        assert (await params_removed(api))["samples"] == 7


async def test_the_profile_plan_is_on_the_pods_while_the_job_profiles(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    policy = RecordingPolicy()
    window = 1.0
    async with operator(kubeconfig, policy, window_s=window):
        await running_job(api)

        async def planned() -> list[dict[str, Any]]:
            allocation = (await status_of(api, "fit")).get("allocation", {})
            until = parse_time(allocation.get("profilingUntil"))
            if until is None:
                return []
            want = plan_annotation(A100, window, until)
            pods = await pods_of(api, "fit")
            ann = [p["metadata"].get("annotations", {}) for p in pods]
            return pods if all(a.get(contract.PROFILE_ANNOTATION) == want for a in ann) else []

        await eventually(planned)
        assert (await status_of(api, "fit"))["phase"] == "Profiling"

        async def cleared() -> list[dict[str, Any]]:
            # The plan leaves the pods and the phase turns Running in two writes: a
            # reader between them (a loaded CI run did) sees cleared pods, still
            # Profiling. Both must come.
            pods = await pods_of(api, "fit")
            ann = [p["metadata"].get("annotations", {}) for p in pods]
            running = (await status_of(api, "fit"))["phase"] == "Running"
            return (
                pods if running and all(contract.PROFILE_ANNOTATION not in a for a in ann) else []
            )

        await eventually(cleared)


class BrokenStore(SampleStore):
    """A store whose refresh fails every time (a bug in the refit)."""

    def refresh(self, bodies: Any, gpu: Any = None) -> Any:
        raise RuntimeError("refit bug")


async def test_a_failing_refit_does_not_stop_scheduling(
    kubeconfig: Path, api: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    store = BrokenStore(registry=CollectorRegistry())
    args = operator_args(kubeconfig, "--profiling-window", "0")
    async with Operator(args, RecordingPolicy(), store=store) as op:
        assert store_of(op) is store
        await api.post(JOBS, json=dljob("fit", model=MODEL))

        async def four() -> list[dict[str, Any]]:
            pods = await pods_of(api, "fit")
            return pods if len(pods) == 4 else []

        await eventually(four)  # the pass went on with the priors
    assert "online refit failed" in caplog.text


async def test_powerflow_plus_runs_its_policy_and_sweeps_its_own_clocks(
    kubeconfig: Path, api: httpx.AsyncClient
) -> None:
    """``--scheduler powerflow+``: the operator plans with PowerFlow+'s policy and its
    profiling windows are PowerFlow+'s (138 s over 750-1410 MHz, not the paper's 240 s
    over 21 clocks from 210 MHz), the same ``Profiling`` the simulator charges."""
    plus = scheduler("powerflow+")
    async with Operator(operator_args(kubeconfig, "--scheduler", "powerflow+")) as op:
        assert op.controller is not None and op.controller.policy == plus.build_policy(None)
        assert op.controller.policy != scheduler("powerflow").build_policy(None)
    args = operator_args(kubeconfig, "--scheduler", "powerflow+")  # no --profiling-window
    async with Operator(args, RecordingPolicy()):
        await running_job(api)

        async def planned() -> dict[str, Any]:
            until = parse_time(
                (await status_of(api, "fit")).get("allocation", {}).get("profilingUntil")
            )
            pods = await pods_of(api, "fit")
            plans = {
                p["metadata"].get("annotations", {}).get(contract.PROFILE_ANNOTATION) for p in pods
            }
            if until is None or len(plans) != 1 or None in plans:
                return {}
            return {"until": until, "plan": plans.pop()}

        found = await eventually(planned)
        want = plan_annotation(A100, plus.profiling.profile_s, found["until"], plus.profiling.sweep)
        assert found["plan"] == want
        plan = parse_profile(found["plan"])
        assert plan.clocks_mhz == tuple(range(750, 1411, 60))
        assert plan.slice_s == pytest.approx(138.0 / 12, abs=1e-3)
