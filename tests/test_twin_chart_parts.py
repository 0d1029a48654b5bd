"""The chart twin's parts that need no image or root: the rules they imitate.

The whole chart twin (the chart's pods from the built image) runs in
``e2e/test_chart_twin.py`` (``scripts/chart-twin.sh``); these pin, one by
one, the Kubernetes rules its kubelet, controllers and scheduler stand-in
follow, each against the behaviour the Kubernetes documentation gives.
"""

from __future__ import annotations

import copy
import functools
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.kube_emulator import KubeEmulator

from powerflow.lab.twin.chart import (
    INSTALL_ORDER,
    PATHS,
    STANDIN_CODE,
    kubescheduler_standin,
    render,
)
from powerflow.lab.twin.chartpods import fits, pod_status_text
from powerflow.lab.twin.runtime import Image, argv_of, expand, inside
from powerflow.lab.twin.scheduler import SchedulerConfig, tolerated

HELM = Path(__file__).resolve().parents[1] / ".tools" / "helm"


def image(
    entrypoint: tuple[str, ...] = ("powerflow",), cmd: tuple[str, ...] = ("--help",)
) -> Image:
    return Image("ref", "c", Path("/nonexistent"), entrypoint, cmd, (), "10001:10001")


def test_command_and_args_replace_entrypoint_and_cmd_as_the_kubelet_does() -> None:
    """kubernetes.io "Define a Command and Arguments for a Container": command replaces
    ENTRYPOINT (and CMD is dropped), args alone replaces CMD."""
    img = image()
    assert argv_of(img, None, None) == ["powerflow", "--help"]
    assert argv_of(img, None, ["operator", "--x"]) == ["powerflow", "operator", "--x"]
    assert argv_of(img, ["sh", "-c", "true"], None) == ["sh", "-c", "true"]
    assert argv_of(img, ["sh"], ["-c", "x"]) == ["sh", "-c", "x"]
    assert argv_of(img, None, []) == ["powerflow"]


def test_variable_expansion_follows_kubernetes_rules() -> None:
    env = {"A": "1", "NODE": "n0"}
    assert expand("$(A)-$(NODE)", env) == "1-n0"
    assert expand("$(MISSING)", env) == "$(MISSING)"
    assert expand("$$(A)", env) == "$(A)"
    assert expand("cost $5", env) == "cost $5"


def test_mount_targets_resolve_links_inside_the_image(tmp_path: Path) -> None:
    """Debian's /var/run is a link to /run: a target under it must stay in the image."""
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("/run")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "alt").symlink_to("../run")
    assert inside(tmp_path, "/var/run/secrets/x") == "/run/secrets/x"
    assert inside(tmp_path, "/etc/alt/y") == "/run/y"
    assert inside(tmp_path, "/tmp/../etc/hosts") == "/etc/hosts"


def test_image_user_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0::/root:/bin/sh\npowerflow:x:10001:10001::/nonexistent:/sbin/nologin\n"
    )
    img = Image("r", "c", tmp_path, (), (), (), "powerflow")
    assert img.ids(None, None) == (10001, 10001)
    assert img.ids(0, None) == (0, 0)
    assert img.ids(10001, 5) == (10001, 5)
    assert Image("r", "c", tmp_path, (), (), (), "10001:10001").ids(None, None) == (10001, 10001)


def test_taints_and_tolerations_as_the_scheduler_matches_them() -> None:
    """kubernetes.io "Taints and Tolerations": Exists matches any value, an empty key with
    Exists matches every taint, an effect given must be the taint's."""
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert tolerated(taint, [{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert tolerated(taint, [{"operator": "Exists"}])
    assert tolerated(taint, [{"key": "nvidia.com/gpu", "value": "present"}])
    assert not tolerated(taint, [{"key": "nvidia.com/gpu", "value": "other"}])
    assert not tolerated(
        taint, [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]
    )
    node = {"metadata": {"labels": {"gpu": "yes"}}, "spec": {"taints": [taint]}}
    assert not fits({"nodeSelector": {"gpu": "yes"}}, node)
    assert fits({"nodeSelector": {"gpu": "yes"}, "tolerations": [{"operator": "Exists"}]}, node)
    assert not fits({"nodeSelector": {"gpu": "no"}, "tolerations": [{"operator": "Exists"}]}, node)
    soft = {"metadata": {}, "spec": {"taints": [{**taint, "effect": "PreferNoSchedule"}]}}
    assert fits({}, soft)


def _status(inits: list[dict[str, Any]], mains: list[dict[str, Any]], n_init: int = 1) -> str:
    pod = {
        "metadata": {},
        "spec": {"initContainers": [{}] * n_init, "containers": [{}]},
        "status": {"phase": "Pending", "initContainerStatuses": inits, "containerStatuses": mains},
    }
    return pod_status_text(pod)


def test_status_column_reads_as_kubectl_prints_it() -> None:
    failed = {"state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    looping = {"state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    done = {"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    running = {"state": {"running": {}}}
    assert _status([failed], []) == "Init:Error"
    assert _status([looping], []) == "Init:CrashLoopBackOff"
    assert _status([{"state": {"running": {}}}], [], 2) == "Init:0/2"
    assert _status([done], [looping]) == "CrashLoopBackOff"
    pod = {
        "metadata": {},
        "spec": {"containers": [{}]},
        "status": {"phase": "Running", "containerStatuses": [running]},
    }
    assert pod_status_text(pod) == "Running"
    assert pod_status_text({**pod, "metadata": {"deletionTimestamp": "x"}}) == "Terminating"


@functools.cache
def _rendered() -> tuple[dict[str, Any], ...]:
    """The chart with its defaults, rendered as the chart twin renders it (``render``)."""
    with tempfile.TemporaryDirectory() as folder:
        return tuple(render({}, HELM, Path(folder) / "values.yaml"))


def _chart_scheduler_config() -> dict[str, Any]:
    for doc in copy.deepcopy(_rendered()):
        if (
            doc
            and doc.get("kind") == "ConfigMap"
            and doc["metadata"]["name"].endswith("scheduler-config")
        ):
            config: dict[str, Any] = yaml.safe_load(next(iter(doc["data"].values())))
            return config
    raise AssertionError("the chart renders no scheduler config")


def test_the_stand_in_reads_the_rendered_scheduler_config() -> None:
    """What the chart ships is what the stand-in schedules with."""
    config = SchedulerConfig.from_config(_chart_scheduler_config())
    assert config.scheduler_name == "powerflow-scheduler"
    assert config.url_prefix == "http://127.0.0.1:8888"
    assert (config.filter_verb, config.prioritize_verb, config.bind_verb) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert config.weight == 5 and config.http_timeout_s == 10.0
    assert config.node_cache_capable and not config.ignorable
    assert config.managed_resources == ("nvidia.com/gpu",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"percentageOfNodesToScore": 50}, "percentageOfNodesToScore 50"),
        ({"extenders": []}, "one extender"),
        ({"kind": "Pod"}, "not a KubeSchedulerConfiguration"),
    ],
)
def test_the_stand_in_refuses_what_it_does_not_imitate(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SchedulerConfig.from_config({**_chart_scheduler_config(), **change})


def test_https_extender_is_refused() -> None:
    config = _chart_scheduler_config()
    config["extenders"][0]["enableHTTPS"] = True
    with pytest.raises(ValueError, match="plain HTTP"):
        SchedulerConfig.from_config(config)


def test_kube_scheduler_flags_are_kept_for_the_stand_in() -> None:
    argv = kubescheduler_standin(["kube-scheduler", "--config=/etc/x.yaml", "--secure-port=1"])
    assert argv[-2:] == ["--config=/etc/x.yaml", "--secure-port=1"]
    python = argv.index("/opt/powerflow/bin/python")
    assert argv[python + 1 : python + 3] == ["-m", "powerflow.lab.twin.kubescheduler"]
    # the image has no lab: the stand-in's code comes from the twin, first on its path
    assert argv[:python] == ["/usr/bin/env", f"PYTHONPATH={STANDIN_CODE}"]


def test_the_stand_in_ends_on_sigterm_as_kube_scheduler_does() -> None:
    """The kubelet stops a container with SIGTERM, to which a container's PID 1 has no
    default action: the stand-in's own handler ends its wait (for its lease, or while it
    schedules), so that a rollout or the chart twin's end does not wait out the pod's
    30 s grace period."""
    code = (
        "from powerflow.lab.twin.kubescheduler import on_sigterm\n"
        "terminated = on_sigterm()\n"
        "print('waiting', flush=True)\n"
        "print('terminated' if terminated.wait(30) else 'not terminated', flush=True)\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=10)
        finally:
            proc.kill()
    assert (proc.returncode, out) == (0, "terminated\n")


def test_every_kind_the_chart_renders_can_be_applied() -> None:
    kinds = {d["kind"] for d in _rendered()}
    assert kinds <= set(PATHS), kinds - set(PATHS)
    assert kinds <= set(INSTALL_ORDER)


def test_three_way_merge_keeps_what_neither_rendering_has() -> None:
    """Helm's three-way JSON merge patch: dropped by the chart -> null; changed by the
    chart -> the new value; changed live where the chart did not change it -> set back
    to the chart's (Helm owns what it renders); added live -> untouched."""
    from powerflow.lab.twin.chart import three_way

    original = {"data": {"a": "1", "b": "2", "gone": "x"}, "spec": {"replicas": 1}}
    modified = {"data": {"a": "1", "b": "3"}, "spec": {"replicas": 1}}
    current = {
        "data": {"a": "9", "b": "2", "gone": "x", "admin": "kept"},
        "spec": {"replicas": 1, "clusterIP": "10.0.0.1"},
        "status": {"x": 1},
    }
    assert three_way(original, modified, current) == {"data": {"gone": None, "a": "1", "b": "3"}}
    assert three_way(original, original, original) == {}
    assert three_way({}, {"l": [1, 2]}, {"l": [1]}) == {"l": [1, 2]}  # lists whole


def test_a_pod_template_change_changes_its_hash() -> None:
    from powerflow.lab.twin.chartpods import template_hash

    d = {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x:1"}]}}}}
    e = {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "x:2"}]}}}}
    assert template_hash(d) == template_hash(json_copy(d)) != template_hash(e)


def json_copy(obj: Any) -> Any:
    import json

    return json.loads(json.dumps(obj))


@pytest.mark.kmock(cls=KubeEmulator)
async def test_the_twins_scheduler_never_puts_two_pods_declaring_one_port_on_a_node(
    kmock: KubeEmulator,
) -> None:
    """The twin's pods share their node's network namespace: a Deployment's new
    scheduler pod beside the old one it replaces could not bind its ports (on a
    cluster each pod has an address of its own). Equal loads would put it on ctl-0
    by name; ctl-0 holds the old one, so it goes to ctl-1."""
    import asyncio

    import httpx

    from powerflow.lab.twin.chartpods import Controllers, container_ports, node_ports

    kmock.load_builtins()

    def pod(name: str, port: int, node: str | None) -> dict[str, object]:
        spec: dict[str, object] = {
            "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": port}]}]
        }
        if node:
            spec["nodeName"] = node
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    def run() -> str:
        with httpx.Client(base_url=str(kmock.url)) as client:
            for node in ("ctl-0", "ctl-1"):
                meta = {"name": node}
                client.post(
                    "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": meta}
                )
            for body in (
                pod("old", 10259, "ctl-0"),
                pod("other", 9090, "ctl-1"),
                pod("new", 10259, None),
            ):
                assert client.post("/api/v1/namespaces/default/pods", json=body).status_code < 300
            Controllers(client, ["ctl-0", "ctl-1"]).tick()
            new = client.get("/api/v1/namespaces/default/pods/new").json()
            return str(new["spec"].get("nodeName"))

    assert await asyncio.to_thread(run) == "ctl-1"
    spec = pod("x", 8080, "n")["spec"]
    assert isinstance(spec, dict) and container_ports(spec) == {8080}
    assert node_ports([{"spec": spec}, {"spec": {"containers": []}}]) == {"n": {8080}}
