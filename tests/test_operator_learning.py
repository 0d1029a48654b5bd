"""The online refit's sample store (``operator.learning``), without a cluster.

Samples come from the ground truth's measurement API (``groundtruth.measure``,
seeded noise) as the node agents would send them: one window per node per
clock, each summing the job's GPUs on that node.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from powerflow.operator.jobs import parse_dljob
from powerflow.operator.learning import MAX_TYPES, SampleStore, model_row, params_status, thin
from prometheus_client import CollectorRegistry

from powerflow.core.gpus import A100, GPU_SPECS, GpuSpec, estimated_spec, unknown_gpu
from powerflow.core.learning import Knowledge, placement_counts
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.params import ModelParams
from powerflow.core.models.priors import generic_prior, load_prior, prior_on
from powerflow.core.models.protocol import PerfModel
from powerflow.core.profiling import PAPER_SWEEP
from powerflow.core.telemetry import SampleBatch, WindowSample, encode_batch, parse_batch
from powerflow.lab import groundtruth as gt

MODEL = "resnet50"
TRUTH = gt.ground_truth(MODEL)
N, R, NODES = 8, 4, ("n0", "n1")  # an 8-GPU job on two nodes of 4
BS = TRUTH.global_batch_sizes[-1] / N
CLOCKS = PAPER_SWEEP.clocks_mhz(A100)
H100 = GPU_SPECS["H100-SXM"]
H100_TRUTH = gt.ground_truth(MODEL, H100)
H100_CLOCKS = PAPER_SWEEP.clocks_mhz(H100)


def wrong_prior(_name: str | None) -> ModelParams:
    """The generic prior of the other five models: a DNN the operator has no prior for."""
    return generic_prior(exclude=MODEL)


def body(name: str = "job", uid: str = "u1", **status: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "generation": 1},
        "spec": {
            "globalBatchSize": 256,
            "iterations": 1000,
            "gpus": {"requested": N},
            "model": MODEL,
            "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
        },
    }
    if status:
        out["status"] = status
    return out


def windows(
    clocks: Any,
    rng: np.random.Generator,
    job: str = "job",
    noise: float = 0.03,
    truth: PerfModel = TRUTH,
) -> list[tuple[str, WindowSample]]:
    """One window per node per clock; each node's energy is its 4 GPUs' share."""
    out = []
    for f in clocks:
        for node in NODES:
            s = gt.measure(truth, N, R, BS, f, rng=rng, noise=noise)
            sample = WindowSample(
                namespace="ml",
                job=job,
                generation=1,
                n=N,
                gpus_per_node=R,
                local_batch_size=BS,
                frequency_mhz=int(f),
                gpus_measured=R,
                iterations=20,
                step_time_s=float(s.step_time_s[0]),
                energy_j=float(s.energy_j[0]) * R / N,
                end_s=1000.0,
            )
            out.append((node, sample))
    return out


def feed(store: SampleStore, items: list[tuple[str, WindowSample]]) -> None:
    for node, sample in items:
        store.add(node, [sample], 1000.0)


def error_percent(
    model: PerfModel, truth: PerfModel = TRUTH, gpu: GpuSpec = A100
) -> tuple[float, float]:
    """MAPE (%) of step time and energy against the ground truth at the job's
    configuration, every clock ``gpu`` supports."""
    every = np.asarray(gpu.clocks_mhz, dtype=np.float64)
    t = model.step_time_s(N, R, BS, every) / truth.step_time_s(N, R, BS, every)
    e = model.energy_per_iter_j(N, R, BS, every) / truth.energy_per_iter_j(N, R, BS, every)
    return 100 * float(np.mean(np.abs(t - 1))), 100 * float(np.mean(np.abs(e - 1)))


def req(name: str = "job", uid: str = "u1") -> Any:
    return parse_dljob(body(name, uid))  # type: ignore[arg-type]


def store(**kw: Any) -> SampleStore:
    kw.setdefault("prior", wrong_prior)
    return SampleStore(registry=CollectorRegistry(), **kw)


def dropped(s: SampleStore, reason: str) -> float:
    return float(s.dropped.labels(reason)._value.get())


def test_a_window_becomes_a_whole_job_row() -> None:
    """Energy is scaled from the node's measured GPUs to the job's n (symmetric workers)."""
    (_, sample), _ = windows([1410], np.random.default_rng(0))
    row = model_row(sample)
    assert row is not None
    assert row[:4] == (N, R, BS, 1410.0)
    assert row[4] == sample.step_time_s
    assert row[5] == pytest.approx(sample.energy_j * N / R)


def test_refit_from_ground_truth_windows_is_within_ten_percent() -> None:
    """N = 24 windows (12 clocks of the profile's sweep on 2 nodes, 3 % noise, seed 0):
    from a prior 30-50 % off, the refitted model is within 10 % of the ground truth
    in step time and energy at every supported clock."""
    s = store()
    s.refresh([body()])
    before = s.model(req())
    assert min(error_percent(before)) > 10  # the prior alone is far off
    rng = np.random.default_rng(0)
    feed(s, windows(CLOCKS[:12], rng))
    assert s.refresh([body()]) == []
    after = s.model(req())
    assert after is not before
    t, e = error_percent(after)
    assert t < 10 and e < 10, (t, e)
    fields = s.status_fields()["ml/job"]
    assert fields["samples"] == 24 and fields["fits"] == 1
    assert ModelParams.from_dict(fields["params"]) == after.params
    assert 0 < fields["fitErrorPercent"] < 10
    assert fields["prior"] == "generic"


def test_fewer_than_min_samples_keep_the_prior() -> None:
    s = store()
    s.refresh([body()])
    prior = s.model(req())
    feed(s, windows(CLOCKS[:4], np.random.default_rng(0)))  # 8 rows < MIN_SAMPLES
    s.refresh([body()])
    assert s.model(req()) is prior
    assert "params" not in s.status_fields()["ml/job"]


def centred_noise(rng: np.random.Generator, clocks: np.ndarray, noise: float) -> np.ndarray:
    """Log-normal noise of scale ``noise`` with its mean and least-squares slope
    against ``1/f`` removed: the two statistics ``powerflow.core.learning.explains`` tests,
    so samples of a model with this noise are within the noise for any seed."""
    e = rng.normal(0.0, noise, clocks.size)
    x = 1.0 / clocks - np.mean(1.0 / clocks)
    e -= np.mean(e)
    return np.asarray(e - x * (x @ e) / (x @ x))


def model_windows(
    model: PerfModel, clocks: Any, rng: np.random.Generator, bias: float = 1.0
) -> list[tuple[str, WindowSample]]:
    """``windows`` as ``model`` itself predicts them (times ``bias``), with 3 %
    ``centred_noise``: what a model that is right would see from the agents."""
    f = np.repeat(np.asarray(clocks, dtype=np.float64), len(NODES))
    t = model.step_time_s(N, R, BS, f) * bias * np.exp(centred_noise(rng, f, 0.03))
    e = model.energy_per_iter_j(N, R, BS, f) * bias * np.exp(centred_noise(rng, f, 0.03))
    return [
        (node, replace(sample, step_time_s=float(t[i]), energy_j=float(e[i]) * R / N))
        for i, (node, sample) in enumerate(windows(f[:: len(NODES)], rng))
    ]


def test_refits_follow_the_simulators_rules() -> None:
    """A refit only when the placement's samples doubled, and not even then when
    the model already explains the new ones (same object: the policy's memos
    hold); then one when doubled samples it does not explain arrive.

    The later windows come from the first fit itself, with noise whose mean
    and trend are removed (explained for any seed), and then 10 % slower and
    costlier (not explained: the mean is 5x the noise's scale)."""
    s = store()
    s.refresh([body()])
    rng = np.random.default_rng(0)
    feed(s, windows(CLOCKS, rng))  # 42 rows: the first fit
    s.refresh([body()])
    first = s.model(req())
    assert s.status_fields()["ml/job"]["fits"] == 1
    feed(s, model_windows(first, CLOCKS[:10], rng))  # 62 rows: not doubled
    s.refresh([body()])
    assert s.model(req()) is first
    feed(s, model_windows(first, CLOCKS[10:], rng))  # 84 rows: doubled, but explained
    s.refresh([body()])
    assert s.model(req()) is first
    assert s.status_fields()["ml/job"]["fits"] == 1
    assert s.status_fields()["ml/job"]["samples"] == 84
    feed(s, model_windows(first, CLOCKS, rng, bias=1.1))  # 126 rows: 42 unexplained
    s.refresh([body()])
    assert s.model(req()) is not first
    assert s.status_fields()["ml/job"]["fits"] == 2


def test_samples_for_unknown_jobs_are_dropped_and_counted() -> None:
    s = store()
    feed(s, windows(CLOCKS[:2], np.random.default_rng(0)))  # before any pass: unknown
    assert dropped(s, "unknown_job") == 4
    s.refresh([body()])
    feed(s, windows(CLOCKS[:2], np.random.default_rng(0), job="other"))
    assert dropped(s, "unknown_job") == 8
    assert set(s.status_fields()) == {"ml/job"}
    assert s.status_fields()["ml/job"]["samples"] == 0


def test_invalid_samples_are_dropped() -> None:
    """``parse_batch`` refuses these; the sink does not trust its caller either."""
    s = store()
    s.refresh([body()])
    ((node, good), _) = windows([1410], np.random.default_rng(0))
    bad = [
        WindowSample(**{**good.__dict__, "gpus_per_node": N + 1}),
        WindowSample(**{**good.__dict__, "gpus_measured": 0}),
        WindowSample(**{**good.__dict__, "step_time_s": float("nan")}),
        WindowSample(**{**good.__dict__, "energy_j": -1.0}),
    ]
    s.add(node, [*bad, good], 0.0)
    assert dropped(s, "invalid") == 4
    assert s.status_fields()["ml/job"]["samples"] == 1


def test_memory_is_bounded_per_job_between_passes_and_in_total() -> None:
    s = store(max_rows=40, max_pending=30, max_queued=40, max_jobs=2)
    jobs = [body("a", "ua"), body("b", "ub"), body("c", "uc")]
    s.refresh(jobs)
    assert set(s.status_fields()) == {"ml/a", "ml/b"}  # the third is not tracked
    rng = np.random.default_rng(2)
    feed(s, windows(CLOCKS[:20], rng, job="a"))  # 40 windows, 30 queued
    assert dropped(s, "backlog") == 10
    feed(s, windows(CLOCKS[:10], rng, job="b"))  # 20 windows, 10 fit in all jobs' queue
    assert dropped(s, "backlog") == 20
    assert s.status_fields()["ml/b"]["samples"] == 10
    feed(s, windows(CLOCKS[:1], rng, job="c"))
    assert dropped(s, "unknown_job") == 2
    s.refresh(jobs)  # the queues are empty again
    feed(s, windows(CLOCKS[:5], rng, job="b"))
    assert dropped(s, "backlog") == 20 and s.status_fields()["ml/b"]["samples"] == 20
    for _ in range(5):
        s.refresh(jobs)
        feed(s, windows(CLOCKS[:15], rng, job="a"))
    s.refresh(jobs)
    entry = s._jobs["ml/a"]
    assert len(entry.rows) <= 40 and not entry.pending
    # Thinned rows still cover the sweep's clocks, and the job still learns.
    assert len(set(entry.rows[:, 3])) >= 15
    assert s.status_fields()["ml/a"]["fits"] >= 1


def test_thinning_keeps_the_learners_count_of_fitted_rows() -> None:
    rows = np.array([[4.0, 4.0, 32.0, 1000.0 + i, 0.1, 100.0] for i in range(12)])
    rows[8:, 0] = 8.0  # the last four rows: another placement
    fitted = placement_counts(_samples(rows[:10]))
    known = Knowledge(FittedModel(load_prior(None)), seen=fitted)
    kept, after = thin(rows, known, 6)
    assert len(kept) == 6
    # rows 0, 2, 4, 6 of the first placement and row 8 of the second were fitted
    assert after.seen == ((4, 4, 4), (8, 4, 1))


def _samples(rows: np.ndarray) -> Any:
    from powerflow.core.models.samples import Samples

    return Samples(*(np.ascontiguousarray(rows[:, j]) for j in range(6)))


def test_a_restart_starts_from_the_params_in_status() -> None:
    s = store()
    s.refresh([body()])
    feed(s, windows(CLOCKS, np.random.default_rng(3)))
    s.refresh([body()])
    fields = s.status_fields()["ml/job"]
    # A new store (a restarted operator) reads the job's status.
    again = store()
    assert again.refresh([body(model=fields)]) == []
    model = again.model(req())
    assert model.params == s.model(req()).params
    assert again.status_fields()["ml/job"] == fields  # nothing to write: no churn


@pytest.mark.parametrize(
    "params",
    [
        {"version": 1, "gpu": "A100"},
        {  # a complete fit stored before the ring all-reduce sync form (version 2)
            **params_status(load_prior(MODEL)),
            "version": 1,
            "throughput": {
                **{k: 0.01 for k in ("a_io", "b_io", "a_grad", "b_grad", "k_grad")},
                **{
                    f"{c}_sync_{w}": 0.001
                    for c in ("alpha", "kappa", "beta", "theta")
                    for w in ("local", "node")
                },
                "gamma1": 2.0,
                "gamma2": 1.5,
            },
        },
        {"junk": True},
        "not an object",
        {
            **params_status(load_prior(MODEL)),
            "throughput": {**params_status(load_prior(MODEL))["throughput"], "gamma1": -1},
        },
    ],
    ids=["incomplete", "version-1", "junk", "string", "out-of-bounds"],
)
def test_bad_params_in_status_fall_back_to_the_prior_with_a_warning(params: Any) -> None:
    s = store()
    notes = s.refresh([body(model={"params": params, "fits": 3, "samples": 50})])
    assert [n.reason for n in notes] == ["InvalidModelParams"]
    assert (notes[0].namespace, notes[0].name, notes[0].uid) == ("ml", "job", "u1")
    assert s.model(req()).params == wrong_prior(None)
    fields = s.status_fields()["ml/job"]
    assert fields["params"] is None and fields["samples"] == 50  # removed from status
    assert s.refresh([body(model={"params": params})]) == []  # warned once


def test_a_recreated_job_starts_afresh() -> None:
    s = store()
    s.refresh([body()])
    feed(s, windows(CLOCKS, np.random.default_rng(4)))
    s.refresh([body()])
    assert s.status_fields()["ml/job"]["samples"] == 42
    s.refresh([body(uid="u2")])
    assert s.status_fields()["ml/job"]["samples"] == 0
    assert s.model(req(uid="u2")).params == wrong_prior(None)
    assert s.model(req(uid="u1")).params == wrong_prior(None)  # not the old job's fit
    s.refresh([])
    assert s.status_fields() == {}


def test_a_pass_spends_at_most_its_fitting_budget() -> None:
    """Rows left unfitted by an exhausted budget are fitted at a later pass."""
    s = store(refit_budget_s=0.0)
    s.refresh([body()])
    feed(s, windows(CLOCKS, np.random.default_rng(5)))
    s.refresh([body()])
    assert "params" not in s.status_fields()["ml/job"]
    s.refit_budget_s = 10.0
    s.refresh([body()])  # nothing new arrived, but the rows were never fitted
    assert s.status_fields()["ml/job"]["fits"] == 1


def test_the_default_prior_is_the_jobs_hint() -> None:
    s = SampleStore(registry=CollectorRegistry())
    s.refresh([body()])
    assert s.model(req()).params == load_prior(MODEL)
    assert s.status_fields()["ml/job"]["prior"] == MODEL


def test_a_failing_job_neither_stops_the_others_nor_the_pass() -> None:
    """A prior that fails (a bug, a broken install) for one job's hint: that job keeps
    what it had, the others are tracked and fitted."""
    calls = {"flaky": 0}

    def prior(name: str | None) -> ModelParams:
        if name == "boom":
            raise RuntimeError("no prior")
        if name == "flaky":
            calls["flaky"] += 1
            if calls["flaky"] > 1:  # the store's first lookup works, the learner's fails
                raise RuntimeError("flaky prior")
        return wrong_prior(name)

    s = store(prior=prior)
    jobs = [body()]
    for name, hint in (("boom", "boom"), ("flaky", "flaky")):
        other = body(name, f"u-{name}")
        other["spec"]["model"] = hint
        jobs.append(other)
    jobs.append({"metadata": "junk"})
    s.refresh(jobs)  # type: ignore[arg-type]
    assert set(s.status_fields()) == {"ml/job", "ml/flaky"}
    rng = np.random.default_rng(6)
    for job in ("job", "flaky"):
        feed(s, windows(CLOCKS, rng, job=job))
    s.refresh(jobs)  # type: ignore[arg-type]
    assert s.status_fields()["ml/job"]["fits"] == 1
    assert "params" not in s.status_fields()["ml/flaky"]
    assert s.status_fields()["ml/flaky"]["samples"] == 42


def test_measured_power_is_the_latest_configurations_windows() -> None:
    """The profile's sweep, then three windows per node at 1005 MHz: the job's power is
    those six windows' energy over their time, at 1005 MHz, within their 3 % noise."""
    s = store()
    s.refresh([body()])
    rng = np.random.default_rng(2)
    feed(s, windows(CLOCKS, rng))
    feed(s, windows([1005.0] * 3, rng))
    assert s.measured_power() == {}  # nothing until a pass takes the queued windows
    s.refresh([body()])
    m = s.measured_power()["ml/job"]
    assert (m.n, m.gpus_per_node, m.local_batch_size, m.frequency_mhz) == (N, R, int(BS), 1005)
    truth = TRUTH.energy_per_iter_j(N, R, BS, 1005.0) / TRUTH.step_time_s(N, R, BS, 1005.0)
    assert m.watts == pytest.approx(float(truth), rel=0.03)


def test_a_window_whose_power_overflows_is_not_a_measurement() -> None:
    """A window telemetry accepts (energy 1e12 J per 1e-300 s step: both in range)
    has a power that overflows a float: the job is left unmeasured, never measured at
    infinite watts (the policy refuses a snapshot with one, which stops the whole pass)."""
    s = store()
    s.refresh([body()])
    ((node, good),) = windows([1005.0], np.random.default_rng(3))[:1]
    huge = replace(good, frequency_mhz=1410, step_time_s=1e-300, energy_j=1e12)
    wire = encode_batch(SampleBatch(node, (huge,)))
    (bad,) = parse_batch(wire).samples
    feed(s, [(node, good), (node, bad)])
    s.refresh([body()])
    assert s.measured_power() == {}


def test_a_restart_keeps_the_measured_power_until_windows_arrive() -> None:
    """``status.model.measuredPower`` carries the job's measured power over a restart:
    the new store reports it (the policy corrects with it from the first pass), writes
    it back unchanged, and windows that arrive afterwards replace it."""
    s = store()
    s.refresh([body()])
    rng = np.random.default_rng(4)
    feed(s, windows(CLOCKS, rng))
    s.refresh([body()])
    before = s.measured_power()["ml/job"]
    fields = s.status_fields()["ml/job"]
    assert fields["measuredPower"] == {
        "gpus": N,
        "gpusPerNode": R,
        "localBatchSize": int(BS),
        "frequencyMHz": int(CLOCKS[-1]),
        "watts": round(before.watts, 2),
    }
    again = store()
    again.refresh([body(model=fields)])
    assert again.measured_power()["ml/job"] == replace(before, watts=round(before.watts, 2))
    assert again.status_fields()["ml/job"] == fields  # nothing to write: no churn
    feed(again, windows([1005.0], rng))
    again.refresh([body(model=fields)])
    assert again.measured_power()["ml/job"].frequency_mhz == 1005


@pytest.mark.parametrize(
    "measured",
    [
        {"gpus": 8, "gpusPerNode": 4, "localBatchSize": 32, "frequencyMHz": 1410},
        {"gpus": 8, "gpusPerNode": 4, "localBatchSize": 32, "frequencyMHz": 1410, "watts": -5},
        {"gpus": 4, "gpusPerNode": 8, "localBatchSize": 32, "frequencyMHz": 1410, "watts": 900},
        {"gpus": "8", "gpusPerNode": 4, "localBatchSize": 32, "frequencyMHz": 1410, "watts": 9},
        "900 W",
    ],
    ids=["no-watts", "negative", "more-per-node-than-gpus", "string-count", "not-an-object"],
)
def test_a_bad_measured_power_in_status_is_no_measurement(measured: Any) -> None:
    s = store()
    s.refresh([body(model={"samples": 5, "measuredPower": measured})])
    assert s.measured_power() == {}
    assert "measuredPower" not in s.status_fields()["ml/job"]


# --- GPU types: the models are of the type the main pool is planned as ----------------


def test_an_h100_pools_jobs_start_from_the_prior_on_the_h100() -> None:
    """The prior carried over by relative clock (``prior_on``): at the H100's top clock
    (1,980 MHz) it predicts the step time the A100 prior predicts at the A100's
    (1,410 MHz). One model object per prior and type (the policy memoises per object)."""
    s = store()
    s.refresh([body(), body("other", "u2")], H100)
    model = s.model(req())
    assert model.params == prior_on(wrong_prior(MODEL), H100)
    assert model.params.gpu == "H100-SXM" and model.gpu == H100
    a100 = FittedModel(wrong_prior(MODEL))
    top = model.step_time_s(N, R, BS, H100.max_clock_mhz)
    assert top == pytest.approx(a100.step_time_s(N, R, BS, A100.max_clock_mhz), rel=1e-12)
    assert s.model(req("other", "u2")) is model
    assert s.model(req("unseen", "u3")) is model  # a job the pass did not see yet
    assert s.status_fields()["ml/job"]["prior"] == "generic"


def test_samples_at_h100_clocks_refit_the_model_on_the_h100() -> None:
    """24 windows at the profile's H100 clocks (seed 0, 3 % noise, the H100's synthetic
    truth): the refit is an H100 model within 10 % of that truth at every H100 clock."""
    s = store()
    s.refresh([body()], H100)
    assert H100_CLOCKS[-1] > A100.max_clock_mhz
    feed(s, windows(H100_CLOCKS[:12], np.random.default_rng(0), truth=H100_TRUTH))
    assert s.refresh([body()], H100) == []
    model = s.model(req())
    assert model.params.gpu == "H100-SXM"
    t, e = error_percent(model, H100_TRUTH, H100)
    assert t < 10 and e < 10, (t, e)
    fields = s.status_fields()["ml/job"]
    assert fields["fits"] == 1 and fields["params"]["gpu"] == "H100-SXM"
    assert 0 < fields["fitErrorPercent"] < 10


def test_a_pool_of_another_type_restarts_its_jobs_from_that_types_prior() -> None:
    """The A100 fit and rows go (their clocks mean another board), with a Warning; the
    next fit is on the H100's rows alone."""
    rng = np.random.default_rng(1)
    s = store()
    s.refresh([body()], A100)
    feed(s, windows(CLOCKS, rng))
    s.refresh([body()], A100)
    assert s.status_fields()["ml/job"]["fits"] == 1
    notes = s.refresh([body()], H100)
    assert [(n.reason, n.name, n.uid) for n in notes] == [("ModelGpuChanged", "job", "u1")]
    assert "A100" in notes[0].message and "H100-SXM" in notes[0].message
    assert s.model(req()) is s.model(req("unseen", "u3"))  # the shared prior on the H100
    assert s.model(req()).params == prior_on(wrong_prior(MODEL), H100)
    fields = s.status_fields()["ml/job"]
    assert fields["params"] is None  # the A100's params leave status
    assert fields["samples"] == 42 and "fitErrorPercent" not in fields
    assert s.measured_power() == {}
    assert s.refresh([body()], H100) == []  # told once
    feed(s, windows(H100_CLOCKS[:12], rng, truth=H100_TRUTH))
    s.refresh([body()], H100)
    fields = s.status_fields()["ml/job"]
    assert fields["fits"] == 1 and fields["params"]["gpu"] == "H100-SXM"
    assert fields["fitErrorPercent"] < 10  # on the H100's rows only


def test_a_restart_on_an_h100_pool_resumes_from_its_h100_params() -> None:
    s = store()
    s.refresh([body()], H100)
    feed(s, windows(H100_CLOCKS, np.random.default_rng(3), truth=H100_TRUTH))
    s.refresh([body()], H100)
    fields = s.status_fields()["ml/job"]
    assert fields["params"]["gpu"] == "H100-SXM"
    again = store()
    assert again.refresh([body(model=fields)]) == []  # no pool yet: kept, not judged
    assert again.refresh([body(model=fields)], H100) == []
    assert again.model(req()).params == s.model(req()).params
    assert again.status_fields()["ml/job"] == fields  # nothing to write: no churn
    # The same status on an A100 pool: params of another board.
    other = store()
    notes = other.refresh([body(model=fields)], A100)
    assert [n.reason for n in notes] == ["ModelGpuChanged"]
    assert other.model(req()).params == wrong_prior(MODEL)
    assert other.status_fields()["ml/job"]["params"] is None


def test_an_unknown_pool_keeps_the_a100_prior_and_fits_no_clocks() -> None:
    """The placeholder plans one clock and writes none: its GPUs run at their defaults,
    so the windows' clocks are no clocks the plan chose; they give the measured power
    but no fit."""
    s = store()
    s.refresh([body()], unknown_gpu())
    prior = s.model(req())
    assert prior.params == wrong_prior(MODEL)
    feed(s, windows(CLOCKS, np.random.default_rng(0)))
    assert s.refresh([body()], unknown_gpu()) == []
    assert s.model(req()) is prior
    fields = s.status_fields()["ml/job"]
    assert "fits" not in fields and "params" not in fields and fields["samples"] == 42
    assert "ml/job" in s.measured_power()
    # Its type known at last (the agents' reports arrived): the same GPUs, whose rows
    # measured what they ran; from now on they are fitted on that type.
    assert s.refresh([body()], A100) == []
    assert "ml/job" in s.measured_power()


def test_a_restart_that_sees_no_report_yet_keeps_the_h100_params() -> None:
    """After a restart the pool reads as unknown until its agents report (minutes):
    that tells no type, so the params restored from status are kept (no Warning, no
    write), and the H100 pool after the reports finds them as they were."""
    s = store()
    s.refresh([body()], H100)
    feed(s, windows(H100_CLOCKS, np.random.default_rng(3), truth=H100_TRUTH))
    s.refresh([body()], H100)
    fields = s.status_fields()["ml/job"]
    again = store()
    for _ in range(3):
        assert again.refresh([body(model=fields)], unknown_gpu()) == []
    assert again.status_fields()["ml/job"] == fields
    assert again.refresh([body(model=fields)], H100) == []
    assert again.model(req()).params == s.model(req()).params
    assert again.status_fields()["ml/job"] == fields


def test_an_a100_pool_is_what_the_store_was_without_a_type() -> None:
    told, untold = store(), store()
    for s, gpu in ((told, A100), (untold, None)):
        s.refresh([body()], gpu)
        feed(s, windows(CLOCKS[:12], np.random.default_rng(0)))
        s.refresh([body()], gpu)
    assert told.status_fields() == untold.status_fields()
    assert told.model(req()).params == untold.model(req()).params


def test_a_discovered_type_outside_the_catalogue_is_fitted_and_restored() -> None:
    """A type estimated from an agent's NVML report (``gpu_facts``): models carry its
    spec, and its params in status are restored although the catalogue lacks it."""
    board = estimated_spec("NVIDIA X1", tuple(range(300, 2101, 15)), 600.0)
    s = store()
    s.refresh([body()], board)
    assert s.model(req()).gpu == board
    truth = gt.ground_truth(MODEL, H100)  # any board's shape: the fit must run on these clocks
    feed(s, windows(board.clocks_mhz[::12], np.random.default_rng(0), truth=truth))
    s.refresh([body()], board)
    fields = s.status_fields()["ml/job"]
    assert fields["fits"] == 1 and fields["params"]["gpu"] == "NVIDIA X1"
    again = store()
    assert again.refresh([body(model=fields)], board) == []
    assert again.model(req()).params == s.model(req()).params
    assert again.model(req()).gpu == board


def test_a_restart_before_any_report_keeps_a_discovered_types_params() -> None:
    """Params of a type only the agents' reports gave (the catalogue lacks it), read back
    by a restarted operator before the pool's type is known again (no pool yet, then
    a pool of unknown type): held as status has them, no Warning, nothing to write; the
    pool planned as that type again finds them as they were."""
    board = estimated_spec("NVIDIA X1", tuple(range(300, 2101, 15)), 600.0)
    s = store()
    s.refresh([body()], board)
    truth = gt.ground_truth(MODEL, H100)
    feed(s, windows(board.clocks_mhz[::12], np.random.default_rng(0), truth=truth))
    s.refresh([body()], board)
    fields = s.status_fields()["ml/job"]
    assert fields["params"]["gpu"] == "NVIDIA X1"
    again = store()
    assert again.refresh([body(model=fields)]) == []
    assert again.refresh([body(model=fields)], unknown_gpu()) == []
    assert again.status_fields()["ml/job"] == fields  # nothing to write: no churn
    assert again.model(req()).params == wrong_prior(MODEL)  # planned on its prior meanwhile
    feed(again, windows(CLOCKS[:12], np.random.default_rng(1)))  # at the GPUs' defaults
    assert again.refresh([body(model=fields)], unknown_gpu()) == []
    assert again.status_fields()["ml/job"]["params"] == fields["params"]  # not refitted
    assert again.refresh([body(model=fields)], board) == []
    assert again.model(req()).params == s.model(req()).params
    assert again.model(req()).gpu == board
    assert again.status_fields()["ml/job"]["params"] == fields["params"]


def test_params_of_a_type_no_board_has_go_once_the_pools_type_is_told() -> None:
    """A name the catalogue lacks is judged by the pool's type once one is told: of
    another type, so the job restarts from the prior with a Warning, and the params
    leave status."""
    params = {**params_status(load_prior(MODEL)), "gpu": "H900"}
    s = store()
    assert s.refresh([body(model={"params": params, "fits": 3, "samples": 50})]) == []
    assert s.status_fields()["ml/job"]["params"] == params
    notes = s.refresh([body(model={"params": params, "fits": 3, "samples": 50})], A100)
    assert [n.reason for n in notes] == ["ModelGpuChanged"]
    assert "H900" in notes[0].message
    assert s.model(req()).params == wrong_prior(MODEL)
    fields = s.status_fields()["ml/job"]
    assert fields["params"] is None and fields["samples"] == 50


def test_a_pool_whose_discovered_clocks_change_plans_the_prior_on_its_spec_now() -> None:
    """Same type, other clocks (an agent's report of fewer clocks): a job with only
    its prior plans the prior carried over to the spec the pool has now."""
    fewer = replace(H100, clocks_mhz=H100.clocks_mhz[:-10], default_clock_mhz=1830)
    s = store()
    s.refresh([body()], H100)
    assert s.model(req()).params == prior_on(wrong_prior(MODEL), H100)
    assert s.refresh([body()], fewer) == []
    assert s.model(req()).params == prior_on(wrong_prior(MODEL), fewer)
    assert s.model(req()) is s.model(req("unseen", "u3")) and s.model(req()).gpu == fewer


def h100_nodes() -> dict[str, GpuSpec]:
    """The other planned pool: ``windows``' two nodes are H100 nodes."""
    return dict.fromkeys(NODES, H100)


def test_windows_from_another_pools_nodes_refit_the_jobs_model_on_that_type() -> None:
    """An A100 main pool beside an H100 pool: windows from the H100 pool's nodes are
    H100 rows, fitted on the H100 (``model_on``), while the A100 model and status stay
    the prior's; the job's measured power is its latest windows' type's."""
    s = store()
    s.refresh([body()], A100, h100_nodes())
    carried = s.model_on(req(), H100)
    assert carried.params == prior_on(wrong_prior(MODEL), H100)
    assert s.model_on(req(), H100) is carried is s.model_on(req("unseen", "u3"), H100)
    assert s.model_on(req(), A100) is s.model(req())  # the main type: ``model``
    feed(s, windows(H100_CLOCKS[:12], np.random.default_rng(0), truth=H100_TRUTH))
    assert s.refresh([body()], A100, h100_nodes()) == []
    fitted = s.model_on(req(), H100)
    assert fitted.params.gpu == "H100-SXM" and fitted.gpu == H100
    t, e = error_percent(fitted, H100_TRUTH, H100)
    assert t < 10 and e < 10, (t, e)
    assert s.model(req()).params == wrong_prior(MODEL)  # nothing learnt on the A100
    fields = s.status_fields()["ml/job"]
    assert fields["samples"] == 24 and "params" not in fields
    (measured,) = s.measured_power().values()
    assert measured.frequency_mhz == H100_CLOCKS[11]
    # The same windows without the H100 pool told are the main pool's (one pool).
    one = store()
    one.refresh([body()], A100)
    feed(one, windows(H100_CLOCKS[:12], np.random.default_rng(0), truth=H100_TRUTH))
    one.refresh([body()], A100)
    assert one.model_on(req(), H100).params == prior_on(wrong_prior(MODEL), H100)


def test_when_the_main_pool_changes_type_each_types_knowledge_is_kept() -> None:
    """The H100 pool becomes the main one (nodes added): the job's H100 fit becomes its
    main model, no ``ModelGpuChanged``, and its A100 fit is kept as the other type's."""
    rng = np.random.default_rng(1)
    s = store()
    s.refresh([body()], A100, {"h0": H100, "h1": H100})
    feed(s, windows(CLOCKS, rng))  # n0, n1: the A100 pool
    h100 = [(f"h{node[-1]}", w) for node, w in windows(H100_CLOCKS[:12], rng, truth=H100_TRUTH)]
    feed(s, h100)
    s.refresh([body()], A100, {"h0": H100, "h1": H100})
    a100_fit, h100_fit = s.model(req()), s.model_on(req(), H100)
    assert a100_fit.params.gpu == "A100" and h100_fit.params.gpu == "H100-SXM"
    notes = s.refresh([body()], H100, dict.fromkeys(NODES, A100))
    assert notes == []
    assert s.model(req()) is h100_fit and s.model_on(req(), A100) is a100_fit
    assert s.status_fields()["ml/job"]["params"]["gpu"] == "H100-SXM"


def fitted_on_both() -> tuple[SampleStore, dict[str, Any]]:
    """A store of an A100 main pool beside an H100 pool whose job has a fit on each type
    (seed 1, 3 % noise), and the job's ``status.model`` fields it writes."""
    rng = np.random.default_rng(1)
    s = store()
    s.refresh([body()], A100, {"h0": H100, "h1": H100})
    feed(s, windows(CLOCKS, rng))  # n0, n1: the A100 pool
    feed(s, [(f"h{n[-1]}", w) for n, w in windows(H100_CLOCKS[:12], rng, truth=H100_TRUTH)])
    s.refresh([body()], A100, {"h0": H100, "h1": H100})
    return s, s.status_fields()["ml/job"]


def refits(s: SampleStore) -> float:
    """Calls of the learner so far (``powerflow_model_refit_seconds``' count)."""
    (metric,) = s.refit_seconds.collect()
    return next(x.value for x in metric.samples if x.name.endswith("_count"))


def test_a_restart_restores_each_types_fit_with_no_refit_and_no_write() -> None:
    """``status.model.otherGpuTypes`` holds the H100 fit beside the A100 one in ``params``:
    a restarted operator plans the job with both fits at its first pass, without a call
    of the learner, and has nothing to write."""
    s, fields = fitted_on_both()
    h100_fit = s.model_on(req(), H100)
    assert h100_fit.params.gpu == "H100-SXM" and h100_fit.params != prior_on(
        wrong_prior(MODEL), H100
    )
    assert fields["otherGpuTypes"] == [
        {"gpu": "H100-SXM", "params": params_status(h100_fit.params), "fits": 1}
    ]
    again = store()
    assert again.refresh([body(model=fields)], A100, {"h0": H100, "h1": H100}) == []
    assert again.model(req()).params == s.model(req()).params
    restored = again.model_on(req(), H100)
    assert restored.params == h100_fit.params and restored.gpu == H100
    clocks = np.asarray(H100_CLOCKS, dtype=np.float64)
    assert np.array_equal(
        restored.energy_per_iter_j(N, R, BS, clocks), h100_fit.energy_per_iter_j(N, R, BS, clocks)
    )
    assert refits(again) == 0
    assert again.status_fields()["ml/job"] == fields  # nothing to write: no churn
    # Windows from the H100 nodes go to the restored fit: the learner is asked again.
    more = windows(H100_CLOCKS[:6], np.random.default_rng(2), truth=H100_TRUTH)
    feed(again, [(f"h{n[-1]}", w) for n, w in more])
    again.refresh([body(model=fields)], A100, {"h0": H100, "h1": H100})
    assert refits(again) == 1


def test_a_status_of_the_main_type_alone_is_read_as_before() -> None:
    """A status without ``otherGpuTypes``: the H100 model is its carried-over prior, no
    Warning, and the field is not written while there is no fit of another type."""
    s, fields = fitted_on_both()
    old = {k: v for k, v in fields.items() if k != "otherGpuTypes"}
    again = store()
    assert again.refresh([body(model=old)], A100, {"h0": H100, "h1": H100}) == []
    assert again.model(req()).params == s.model(req()).params
    assert again.model_on(req(), H100).params == prior_on(wrong_prior(MODEL), H100)
    assert again.status_fields()["ml/job"] == old


def test_a_fit_of_a_type_not_planned_now_is_held_and_written_back() -> None:
    """A restart that plans the A100 pool alone (the H100 nodes gone for now) keeps the
    H100 fit as status has it, and takes it up when the H100 pool is planned again."""
    s, fields = fitted_on_both()
    again = store()
    assert again.refresh([body(model=fields)], A100) == []
    assert again.status_fields()["ml/job"] == fields
    again.refresh([body(model=fields)], A100, {"h0": H100})
    assert again.model_on(req(), H100).params == s.model_on(req(), H100).params


def test_a_restart_after_the_main_pool_changed_type_swaps_the_fits() -> None:
    """Written with the A100 pool the main one, read back with the H100 pool the main one
    (nodes added meanwhile): the H100 fit is the main model, the A100 fit the other
    type's, no Warning, as a running operator's swap."""
    s, fields = fitted_on_both()
    again = store()
    assert again.refresh([body(model=fields)], H100, dict.fromkeys(NODES, A100)) == []
    assert again.model(req()).params == s.model_on(req(), H100).params
    assert again.model_on(req(), A100).params == s.model(req()).params
    swapped = again.status_fields()["ml/job"]
    assert swapped["params"] == fields["otherGpuTypes"][0]["params"]
    assert swapped["otherGpuTypes"] == [{"gpu": "A100", "params": fields["params"], "fits": 1}]
    # No pool told at the restart's first pass: the swap waits for the pool's type.
    later = store()
    assert later.refresh([body(model=fields)]) == []
    assert later.refresh([body(model=fields)], H100, dict.fromkeys(NODES, A100)) == []
    assert later.model(req()).params == s.model_on(req(), H100).params
    assert later.model_on(req(), A100).params == s.model(req()).params


def other_entry(**kw: Any) -> dict[str, Any]:
    params = params_status(prior_on(load_prior(MODEL), H100))
    return {"gpu": "H100-SXM", "params": params, "fits": 2, **kw}


@pytest.mark.parametrize(
    "raw",
    [
        "not a list",
        [other_entry(gpu="H900")],  # no catalogue type, no planned pool's
        [other_entry(gpu="A10")],  # a catalogue type, params of another
        [other_entry(params={"junk": True})],
        [None, 7, {"params": other_entry()["params"]}],
        [other_entry(gpu="x" * 5000)],
    ],
    ids=["not-a-list", "unknown-type", "params-of-another-type", "bad-params", "junk", "huge"],
)
def test_bad_fits_of_other_types_are_dropped_with_one_warning(raw: Any) -> None:
    s = store()
    notes = s.refresh([body(model={"otherGpuTypes": raw, "samples": 5})], A100, h100_nodes())
    assert [n.reason for n in notes] == ["InvalidModelParams"]
    assert len(notes[0].message) <= 500
    assert s.model_on(req(), H100).params == prior_on(wrong_prior(MODEL), H100)
    fields = s.status_fields()["ml/job"]
    assert fields["otherGpuTypes"] is None and fields["samples"] == 5  # removed from status
    assert s.refresh([body(model={"otherGpuTypes": raw})], A100, h100_nodes()) == []  # once


def test_at_most_max_types_fits_of_other_types_are_read() -> None:
    """The first ``MAX_TYPES`` entries are read (a type named twice: its first), the rest
    dropped with a Warning; a good entry among them is kept."""
    good = other_entry()
    raw = [good, other_entry(fits=9), *([other_entry(gpu="H900")] * (2 * MAX_TYPES))]
    s = store()
    notes = s.refresh([body(model={"otherGpuTypes": raw})], A100, h100_nodes())
    assert [n.reason for n in notes] == ["InvalidModelParams"]
    assert f"{MAX_TYPES + 2} entries past the first {MAX_TYPES}" in notes[0].message
    assert s.status_fields()["ml/job"]["otherGpuTypes"] == [good]
    assert s.model_on(req(), H100).params == prior_on(load_prior(MODEL), H100)


def test_a_fit_on_a_discovered_type_of_another_pool_is_restored_while_that_pool_is_planned() -> (
    None
):
    """A type the catalogue lacks (estimated from an agent's report) counts as known while
    a planned pool is of it: its fit in ``otherGpuTypes`` is restored; a restart that plans
    no pool of it drops the fit with a Warning (the bound on what status may carry)."""
    board = estimated_spec("NVIDIA X1", tuple(range(300, 2101, 15)), 600.0)
    nodes = dict.fromkeys(("h0", "h1"), board)
    s = store()
    s.refresh([body()], A100, nodes)
    truth = gt.ground_truth(MODEL, H100)
    rows = windows(board.clocks_mhz[::12], np.random.default_rng(0), truth=truth)
    feed(s, [(f"h{n[-1]}", w) for n, w in rows])
    s.refresh([body()], A100, nodes)
    fields = s.status_fields()["ml/job"]
    assert [e["gpu"] for e in fields["otherGpuTypes"]] == ["NVIDIA X1"]
    again = store()
    assert again.refresh([body(model=fields)], A100, nodes) == []
    restored = again.model_on(req(), board)
    assert restored.params == s.model_on(req(), board).params and restored.gpu == board
    assert again.status_fields()["ml/job"] == fields
    gone = store()
    notes = gone.refresh([body(model=fields)], A100)
    assert [n.reason for n in notes] == ["InvalidModelParams"] and "NVIDIA X1" in notes[0].message
    assert gone.status_fields()["ml/job"]["otherGpuTypes"] is None
