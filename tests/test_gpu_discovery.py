"""Which GPU type a node is planned as: discovered facts, the catalogue by product label,
or unknown (GPU counts only); and the node agents' reports of their GPUs, bounded.

Pure tests of the lookup (``powerflow.core.gpus.gpu_for_product``), the report's wire
format and spec (``powerflow.core.gpu_facts``), the inventory (``operator/nodes.py``),
the job controller's writes, and passes of ``reconcile`` against
``support.fake_cluster`` with the real PowerFlow policy. The operator's side over
HTTP (reports to the ingest, the ``UnknownGpu`` Event and gauge) is in
``test_operator_ingest.py``; the agent's in ``test_nodeagent_telemetry_sender.py``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from powerflow.extender.placing import gpu_spec_for
from powerflow.operator.budget import parse_budget
from powerflow.operator.discovered import (
    REFRESH_S,
    STALE_S,
    DiscoveredGpus,
    recorded_specs,
)
from powerflow.operator.job_controller import converge
from powerflow.operator.kube import ClusterState
from powerflow.operator.nodes import cluster_nodes, unknown_gpu_nodes
from powerflow.operator.sample_checks import node_gpus
from support.fake_cluster import FakeCluster
from test_operator_job_controller import allocation, annotations, dljob, request, running

from powerflow.core import contract
from powerflow.core.errors import DataError
from powerflow.core.gpu_facts import (
    MAX_RECORD_CHARS,
    GpuFacts,
    GpuFactsError,
    GpuReport,
    encode_record,
    encode_report,
    node_spec,
    parse_record,
    parse_report,
)
from powerflow.core.gpus import (
    A100,
    GPU_SPECS,
    LARGEST_P_MAX_W,
    UNKNOWN_GPU,
    gpu_for_product,
    tunes,
)
from powerflow.core.policy.powerflow import PowerFlowPolicy
from powerflow.lab.synthetic import SyntheticModel

H100 = GPU_SPECS["H100-SXM"]
H100_LABEL = "NVIDIA-H100-80GB-HBM3"
UNKNOWN_LABEL = "NVIDIA-Z900-96GB"


def node(name: str, product: str | None, gpus: int = 4) -> dict[str, Any]:
    labels = {contract.GPU_PRODUCT_LABEL: product} if product else {}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "allocatable": {contract.GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def h100_facts(index: int = 0, **changes: Any) -> GpuFacts:
    """An H100 SXM as NVML describes it (``nvidia-smi -q``: 345-1980 MHz, 200-700 W)."""
    facts = GpuFacts(index, "NVIDIA H100 80GB HBM3", H100.clocks_mhz, 700.0, 200.0, 700.0)
    return replace(facts, **changes)


# -- the product label -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("NVIDIA-H100-80GB-HBM3", "H100-SXM"),  # GFD: NVML's name, spaces as dashes
        ("NVIDIA-A100-SXM4-40GB", "A100"),
        ("nvidia-a100-80gb-pcie", "A100-PCIE-80GB"),
        ("Tesla-T4-SHARED", "T4"),  # time-sliced: the same board
        ("Tesla-V100-SXM2-32GB", "V100"),
        ("NVIDIA-H200", "H200"),
    ],
)
def test_a_gpu_feature_discovery_label_finds_its_catalogue_type(label: str, name: str) -> None:
    spec = gpu_for_product(label)
    assert spec is not None and spec.name == name
    assert gpu_spec_for(label) is spec  # the extender's lookup is the same


@pytest.mark.parametrize(
    "label", ["", None, UNKNOWN_LABEL, "NVIDIA-A100", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"]
)
def test_a_label_that_is_no_catalogue_type_is_unknown_never_a_guess(label: str | None) -> None:
    """Before, any label read as the A100: its clocks were written to every GPU."""
    assert gpu_for_product(label) is None
    spec = gpu_spec_for(label or "")
    assert spec.name == UNKNOWN_GPU and not tunes(spec)
    assert len(spec.clocks_mhz) == 1 and spec.min_power_limit_w is None
    assert spec.p_max_w == spec.max_power_w == LARGEST_P_MAX_W == 700.0


# -- the inventory ---------------------------------------------------------------------


def test_h100_labelled_nodes_are_planned_as_h100s() -> None:
    kept, left = cluster_nodes([node("a", H100_LABEL), node("b", H100_LABEL)])
    assert [n.gpu for n in kept] == [H100, H100] and left == ()
    assert unknown_gpu_nodes([node("a", H100_LABEL)]) == []


def test_an_unknown_product_is_planned_for_counts_and_named() -> None:
    bodies = [node("a", UNKNOWN_LABEL), node("b", UNKNOWN_LABEL), node("c", None)]
    kept, _ = cluster_nodes(bodies)
    assert [n.name for n in kept] == ["a", "b"] and {n.gpu.name for n in kept} == {UNKNOWN_GPU}
    assert unknown_gpu_nodes([*bodies, node("cpu", None, gpus=0)]) == ["a", "b", "c"]


def test_discovered_facts_beat_the_label() -> None:
    discovered = node_spec([h100_facts(0, default_limit_w=500.0)])
    assert discovered.name == "H100-SXM" and discovered.max_power_w == 500.0
    # A catalogue label: its nodes' reports of that type count, one node's for the pool.
    kept, _ = cluster_nodes(
        [node("a", H100_LABEL), node("b", H100_LABEL)], discovered={"a": discovered}
    )
    assert {n.gpu for n in kept} == {discovered}
    # A label the catalogue lacks: only once every node of the pool has reported.
    kept, _ = cluster_nodes(
        [node("a", UNKNOWN_LABEL), node("b", UNKNOWN_LABEL)], discovered={"a": discovered}
    )
    assert {tunes(n.gpu) for n in kept} == {False}
    both = {"a": discovered, "b": discovered}
    kept, _ = cluster_nodes([node("a", UNKNOWN_LABEL), node("b", UNKNOWN_LABEL)], discovered=both)
    assert {n.gpu for n in kept} == {discovered}
    assert unknown_gpu_nodes([node("a", UNKNOWN_LABEL)], {"a": discovered}) == []


def test_one_agent_never_plans_a_pool_beyond_its_types_ranges() -> None:
    """A report naming a catalogue type is held to that type's clocks and power range,
    and a report of another type than the label's is ignored: one agent, lying or
    broken, can neither give the honest nodes clocks their boards lack nor a power
    floor below the board's own (caps there would plan watts the GPUs cannot reach)."""
    lying = node_spec(
        [h100_facts(0, clocks_mhz=(*H100.clocks_mhz, 2500, 3000), min_limit_w=20.0,
                    default_limit_w=20.0)]
    )  # fmt: skip
    assert lying.clocks_mhz[-1] == H100.clocks_mhz[-1]
    assert lying.min_power_limit_w == H100.min_power_limit_w
    assert lying.max_power_w >= (H100.min_power_limit_w or 0.0)
    kept, _ = cluster_nodes([node("a", H100_LABEL), node("b", H100_LABEL)], discovered={"a": lying})
    for n in kept:
        assert n.gpu.clocks_mhz[-1] <= H100.clocks_mhz[-1]
        assert (n.gpu.min_power_limit_w or 0.0) >= (H100.min_power_limit_w or 0.0)
    other_type = node_spec(
        [h100_facts(0, name="NVIDIA A100-SXM4-40GB", clocks_mhz=A100.clocks_mhz)]
    )
    kept, _ = cluster_nodes(
        [node("a", H100_LABEL), node("b", H100_LABEL)], discovered={"a": other_type}
    )
    assert {n.gpu for n in kept} == {H100}


def test_honest_boards_that_differ_a_little_plan_together_on_what_all_allow() -> None:
    """Two nodes of one unlisted product whose agents report different limits and clock
    lists: the pool is planned on the clocks both have and the tighter limits."""
    a = node_spec([h100_facts(0, name="NVIDIA Z900", default_limit_w=600.0, min_limit_w=150.0)])
    b = node_spec(
        [h100_facts(0, name="NVIDIA Z900", clocks_mhz=H100.clocks_mhz[2:], default_limit_w=650.0,
                    min_limit_w=200.0)]
    )  # fmt: skip
    kept, _ = cluster_nodes(
        [node("a", UNKNOWN_LABEL), node("b", UNKNOWN_LABEL)], discovered={"a": a, "b": b}
    )
    (gpu,) = {n.gpu for n in kept}
    assert tunes(gpu) and gpu.clocks_mhz == H100.clocks_mhz[2:]
    assert gpu.max_power_w == 600.0 and gpu.min_power_limit_w == 200.0


def test_samples_are_judged_by_the_discovered_then_the_catalogue_type() -> None:
    bodies = (node("a", H100_LABEL), node("b", UNKNOWN_LABEL), node("c", UNKNOWN_LABEL))
    state = ClusterState(jobs=(), nodes=bodies, budget=None)  # type: ignore[arg-type]
    found = node_spec([h100_facts()])
    assert node_gpus(state, {"c": found}) == {"a": H100, "c": found}


# -- the report ------------------------------------------------------------------------


def test_a_report_round_trips_and_gives_the_catalogue_type_with_its_own_facts() -> None:
    report = GpuReport("n1", (h100_facts(0), h100_facts(1, clocks_mhz=H100.clocks_mhz[5:])))
    assert parse_report(encode_report(report)) == report
    spec = node_spec(report.gpus)
    assert spec.name == "H100-SXM" and spec.clocks_mhz == H100.clocks_mhz[5:]  # shared ones
    assert (spec.min_power_limit_w, spec.max_power_w) == (200.0, 700.0)


def test_a_product_the_catalogue_lacks_is_planned_from_its_facts() -> None:
    facts = GpuFacts(0, "NVIDIA Z900", tuple(range(300, 2101, 15)), 800.0, 250.0, 900.0)
    spec = node_spec([facts])
    assert spec.name == "NVIDIA Z900" and tunes(spec)
    assert spec.max_clock_mhz == 2100
    assert spec.max_power_w == LARGEST_P_MAX_W  # never past the catalogue's largest board
    with pytest.raises(DataError):  # and without a board limit, nothing to plan power by
        node_spec([replace(facts, default_limit_w=None, min_limit_w=None, max_limit_w=None)])
    with pytest.raises(DataError):
        node_spec([facts, replace(h100_facts(1))])  # two products on one node


def _gpu(**changes: Any) -> dict[str, Any]:
    return {**encode_report(GpuReport("n1", (h100_facts(),)))["gpus"][0], **changes}


@pytest.mark.parametrize(
    ("gpus", "field"),
    [
        ([_gpu(clocksMhz=[1980, 345])], "clocksMhz"),  # not sorted
        ([_gpu(clocksMhz=[345, 345])], "clocksMhz"),
        ([_gpu(clocksMhz=[50, 1980])], "clocksMhz"),  # below 100 MHz
        ([_gpu(clocksMhz=[345, 9000])], "clocksMhz"),  # above 3,000 MHz
        ([_gpu(clocksMhz=list(range(100, 3000, 5)))], "clocksMhz"),  # 580 clocks
        ([_gpu(clocksMhz=[])], "clocksMhz"),
        ([_gpu(defaultLimitW=1e6, maxLimitW=1e6)], "defaultLimitW"),  # absurd power
        ([_gpu(minLimitW=5.0)], "minLimitW"),
        ([_gpu(defaultLimitW=float("nan"))], "defaultLimitW"),
        ([_gpu(minLimitW=800.0)], "minLimitW <= defaultLimitW"),
        ([_gpu(maxLimitW=None)], "all given or none"),
        ([_gpu(name="x" * 97)], "name"),
        ([_gpu(name="H100\n")], "name"),
        ([_gpu(index=64)], "index"),
        ([_gpu(), _gpu()], "twice"),
        ([_gpu(extra=1)], "unknown field"),
        ([_gpu(index=i) for i in range(65)], "gpus"),
        ([], "gpus"),
    ],
)
def test_a_lying_report_is_refused_whole(gpus: list[Any], field: str) -> None:
    with pytest.raises(GpuFactsError, match=field):
        parse_report({"node": "n1", "gpus": gpus})


# -- the record on the node -----------------------------------------------------------


def with_record(body: dict[str, Any], text: str) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "annotations": {RECORD: text}}}


RECORD = contract.GPU_REPORT_ANNOTATION
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_a_record_round_trips_and_is_never_later_than_now() -> None:
    report = GpuReport("n1", (h100_facts(0), h100_facts(1)))
    text = encode_record(report, T0)
    assert parse_record(text, "n1", T0 + 5) == (report, T0)
    assert parse_record(text, "n1", T0 - 100) == (report, T0 - 100)  # from the future: now


LYING = {"node": "n1", "gpus": [_gpu(clocksMhz=[345, 9000])]}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("x" * (MAX_RECORD_CHARS + 1), "longer"),
        ("{not json", "not JSON"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),  # nested past the parser
        ('"a string"', "reportedAt and report"),
        ('{"reportedAt": "2027-01-15T08:00:00Z"}', "reportedAt and report"),
        ('{"reportedAt": "yesterday", "report": {}}', "RFC 3339"),
        ('{"reportedAt": "2027-01-15T08:00:00Z", "report": {"node": "n1", "gpus": []}}', "gpus"),
        (encode_record(GpuReport("n2", (h100_facts(),)), T0), "node n2"),
        (json.dumps({"reportedAt": "2027-01-15T08:00:00Z", "report": LYING}), "clocksMhz"),
    ],
)
def test_a_record_is_held_to_a_reports_bounds(text: str, why: str) -> None:
    with pytest.raises(GpuFactsError, match=why):
        parse_record(text, "n1", T0)


def test_a_record_that_lies_within_bounds_plans_what_the_same_report_would() -> None:
    """An edited record of a 1,500 W 'H100' on an H100 node: the type's own board limit,
    as a report saying so gets (``node_spec``)."""
    lie = h100_facts(default_limit_w=1500.0, max_limit_w=1500.0)
    body = with_record(node("a", H100_LABEL), encode_record(GpuReport("a", (lie,)), T0))
    assert recorded_specs([body], T0) == {"a": node_spec([lie])}
    assert recorded_specs([body], T0)["a"].max_power_w == H100.max_power_w


def test_a_report_is_recorded_once_and_rewritten_when_it_changes_or_ages() -> None:
    clock = Clock()
    kept = DiscoveredGpus(clock)
    report = GpuReport("a", (h100_facts(),))
    kept.record("a", node_spec(report.gpus), report)
    ((name, text),) = kept.unrecorded([node("a", H100_LABEL), node("b", H100_LABEL)])
    assert name == "a" and parse_record(text, "a", T0) == (report, T0)
    assert kept.unrecorded([with_record(node("a", H100_LABEL), text)]) == []  # written
    clock.now += 300  # the agent's next report, the same: the same record, no write
    kept.record("a", node_spec(report.gpus), report)
    assert kept.unrecorded([with_record(node("a", H100_LABEL), text)]) == []
    clock.now = T0 + REFRESH_S + 1  # the same again, but the record is getting old
    kept.record("a", node_spec(report.gpus), report)
    assert [n for n, _ in kept.unrecorded([with_record(node("a", H100_LABEL), text)])] == ["a"]
    fewer = GpuReport("a", (h100_facts(clocks_mhz=H100.clocks_mhz[:50]),))
    clock.now += 300  # another report: rewritten at once
    kept.record("a", node_spec(fewer.gpus), fewer)
    ((_, newer),) = kept.unrecorded([with_record(node("a", H100_LABEL), text)])
    assert parse_record(newer, "a", clock.now)[0] == fewer


def test_records_are_read_back_until_the_agent_reports_and_stale_ones_are_not() -> None:
    clock = Clock()
    report = GpuReport("a", (h100_facts(),))
    text = encode_record(report, T0)
    clock.now = T0 + 600
    kept = DiscoveredGpus(clock)
    kept.restore([with_record(node("a", UNKNOWN_LABEL), text), node("b", UNKNOWN_LABEL)])
    assert kept.specs() == {"a": node_spec(report.gpus)}
    assert kept.unrecorded([with_record(node("a", UNKNOWN_LABEL), text)]) == []  # read back
    assert not kept.too_soon("a")  # read back is no report: the agent's next one is taken
    fewer = GpuReport("a", (h100_facts(clocks_mhz=H100.clocks_mhz[:50]),))
    kept.record("a", node_spec(fewer.gpus), fewer)
    assert kept.too_soon("a")
    kept.restore([with_record(node("a", UNKNOWN_LABEL), text)])  # the report beats it
    assert kept.specs()["a"] == node_spec(fewer.gpus)
    assert [n for n, _ in kept.unrecorded([with_record(node("a", UNKNOWN_LABEL), text)])] == ["a"]
    # Read back with its own time: it goes STALE_S after it was written, as a report would.
    again = DiscoveredGpus(clock)
    again.restore([with_record(node("a", UNKNOWN_LABEL), text)])
    clock.now = T0 + STALE_S + 1
    assert again.specs() == {}
    later = DiscoveredGpus(clock)
    later.restore([with_record(node("a", UNKNOWN_LABEL), text)])
    assert later.specs() == {}
    assert recorded_specs([with_record(node("a", "x"), text)], clock.now) == {}  # the CLI's


def test_records_read_once_give_what_reading_them_every_pass_gives() -> None:
    """The memo of records taken or refused (``DiscoveredGpus.unread``) against parsing
    every record at every pass (``recorded_specs``), over passes where records change,
    go bad, come back, and nodes leave."""
    clock = Clock()
    kept = DiscoveredGpus(clock)
    full = h100_facts()
    fewer = h100_facts(clocks_mhz=H100.clocks_mhz[:40])
    records = {name: encode_record(GpuReport(name, (full,)), T0) for name in ("a", "b", "c")}
    passes = [
        dict(records),
        {**records, "b": encode_record(GpuReport("b", (fewer,)), T0 + 10)},
        {**records, "b": "{not json", "c": records["a"]},  # bad, and another node's
        dict(records),
        {"a": records["a"]},
    ]
    for number, texts in enumerate(passes):
        clock.now = T0 + 60 * (number + 1)
        bodies = [with_record(node(n, UNKNOWN_LABEL), t) for n, t in texts.items()]
        kept.keep_only(texts)
        for _ in range(2):
            kept.restore(bodies)
            assert kept.specs() == recorded_specs(bodies, clock.now), number


def test_a_record_that_cannot_be_taken_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    kept = DiscoveredGpus(Clock())
    bad = with_record(node("a", UNKNOWN_LABEL), "{not json")
    with caplog.at_level(logging.WARNING, logger="powerflow.operator.discovered"):
        for _ in range(3):
            kept.restore([bad])
    assert len(caplog.records) == 1 and "not JSON" in caplog.records[0].getMessage()
    assert kept.specs() == {}


# -- the writes ------------------------------------------------------------------------


def test_on_an_unknown_type_the_job_controller_writes_no_clock_cap_or_sweep() -> None:
    alloc = allocation()  # 1005 MHz, 250 W: what the plan said
    created = converge(request(), alloc, [], 0.0, tuned=False).create
    pods = [b for b in created if b["kind"] == "Pod"]
    assert len(pods) == 2
    for pod in pods:
        notes = annotations(pod)
        assert contract.FREQUENCY_ANNOTATION not in notes
        assert contract.POWER_LIMIT_ANNOTATION not in notes
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["POWERFLOW_FREQUENCY_MHZ"] == ""
    # Pods that carry a clock and a cap (planned while the type was known) lose them.
    tuned = running(b for b in converge(request(), alloc, [], 0.0).create if b["kind"] == "Pod")
    writes = converge(request(), alloc, tuned, 0.0, tuned=False)
    patches = [patch for _, patch in writes.annotate]
    assert {contract.FREQUENCY_ANNOTATION: None} in patches
    assert {contract.POWER_LIMIT_ANNOTATION: None} in patches


def _planned(labels: list[str], policy: PowerFlowPolicy, **kw: Any) -> FakeCluster:
    nodes, _ = cluster_nodes([node(f"n{i}", label) for i, label in enumerate(labels)])
    cluster = FakeCluster(nodes)
    for name in ("a", "b"):
        cluster.submit(dljob(name))
    for _ in range(3):
        actions, _ = cluster.one_pass(
            budget=parse_budget({"eta": "0.9"}),
            policy=policy,
            models=lambda job: SyntheticModel(),
            **kw,
        )
        cluster.settle()
        cluster.now_s += 10
    assert cluster.pods, "the jobs run"
    assert actions.plan is not None  # eta 0.9 of G x P_max, P_max the pool type's
    assert actions.plan.limit_w == pytest.approx(0.9 * 8 * nodes[0].gpu.p_max_w)
    return cluster


def test_an_h100_pool_gets_h100_clocks_never_the_a100s() -> None:
    cluster = _planned([H100_LABEL] * 2, PowerFlowPolicy(frequency_scaling=False))
    clocks = {annotations(p)[contract.FREQUENCY_ANNOTATION] for p in cluster.pods.values()}
    assert clocks == {str(H100.max_clock_mhz)}  # 1,980 MHz: no A100 runs that fast
    assert H100.max_clock_mhz not in A100.clocks_mhz
    scaled = _planned([H100_LABEL] * 2, PowerFlowPolicy())
    for pod in scaled.pods.values():
        assert int(annotations(pod)[contract.FREQUENCY_ANNOTATION]) in H100.clocks_mhz


def test_an_unknown_pool_runs_its_jobs_with_no_clock_cap_or_sweep() -> None:
    cluster = _planned([UNKNOWN_LABEL] * 2, PowerFlowPolicy(), profiling_window_s=60.0)
    # The budget counts each GPU at the catalogue's largest board limit: 0.9 x 8 x 700 W.
    for pod in cluster.pods.values():
        notes = annotations(pod)
        assert not {
            contract.FREQUENCY_ANNOTATION,
            contract.POWER_LIMIT_ANNOTATION,
            contract.PROFILE_ANNOTATION,
        } & set(notes)
    for job in cluster.jobs.values():
        assert job["status"]["allocation"].get("powerCapWatts") is None
        assert job["status"]["phase"] == "Running"  # no profiling phase without a sweep


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=120),
    st.lists(st.integers(0, 4000), max_size=600),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
GPU_FIELDS = ["index", "name", "clocksMhz", "defaultLimitW", "minLimitW", "maxLimitW", "extra"]


# No deadline: the machine is shared and a slow case is no failure (tests/support/fuzz.py).
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.dictionaries(st.sampled_from(GPU_FIELDS), JUNK, max_size=3), min_size=1, max_size=4)
)
def test_a_fuzzed_report_is_refused_or_planned_within_the_catalogues_bounds(
    damage: list[dict[str, Any]],
) -> None:
    """Any report: refused with ``GpuFactsError``, or a spec whose clocks are the sender's
    (within 100-3,000 MHz) and whose power never passes the catalogue's largest board."""
    gpus = [{**_gpu(index=i), **changes} for i, changes in enumerate(damage)]
    try:
        report = parse_report({"node": "n1", "gpus": gpus})
    except GpuFactsError:
        return
    try:
        spec = node_spec(report.gpus)
    except DataError:
        return
    assert 100 <= spec.min_clock_mhz <= spec.max_clock_mhz <= 3000
    assert set(spec.clocks_mhz) <= set(report.gpus[0].clocks_mhz)
    assert spec.idle_power_w < spec.max_power_w <= LARGEST_P_MAX_W
    assert spec.p_max_w <= LARGEST_P_MAX_W
    assert spec.min_power_limit_w is None or spec.min_power_limit_w <= spec.max_power_w
