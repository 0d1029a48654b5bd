"""``powerflow operator``: options -> kopf's settings (peering by default), and the
peering CRDs it relies on."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kopf._cogs.structs import references

from powerflow.commands import operator as command
from powerflow.errors import PowerFlowError

ROOT = Path(__file__).resolve().parent.parent


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    return parser.parse_args(["operator", *argv])


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_peering_is_the_default() -> None:
    options = command.kopf_options(parse())
    assert options["standalone"] is False
    assert options["peering_name"] == command.PEERING_NAME
    assert options["clusterwide"] is True and options["namespaces"] == []


def test_standalone_and_namespaced() -> None:
    options = command.kopf_options(parse("--standalone", "--namespace", "ml"))
    assert options["standalone"] is True and "peering_name" not in options
    assert options["clusterwide"] is False and options["namespaces"] == ["ml"]


def test_settings_reach_the_controller_config() -> None:
    args = parse("--profiling-window", "0.3", "--debounce", "0")
    assert (args.profiling_window, args.debounce) == (0.3, 0.0)
    with pytest.raises(PowerFlowError):
        command.kopf_options(parse("--profiling-window", "-1"))


def test_peering_crds_are_valid_and_what_kopf_watches() -> None:
    crds = docs(ROOT / "crds" / "kopf-peering.yaml")
    for crd in crds:
        kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)
    served = {
        (crd["spec"]["group"], crd["spec"]["names"]["plural"], crd["spec"]["scope"]) for crd in crds
    }
    cluster, namespaced = references.CLUSTER_PEERINGS_K, references.NAMESPACED_PEERINGS_K
    assert served == {
        (cluster.group, cluster.any_name, "Cluster"),
        (namespaced.group, namespaced.any_name, "Namespaced"),
    }


def test_peering_objects_match_the_default_name() -> None:
    crds = {d["spec"]["names"]["kind"]: d for d in docs(ROOT / "crds" / "kopf-peering.yaml")}
    objects = docs(ROOT / "examples" / "kopf-peering.yaml")
    assert {o["kind"] for o in objects} == set(crds)
    for obj in objects:
        crd = crds[obj["kind"]]
        assert obj["apiVersion"] == f"{crd['spec']['group']}/v1"
        assert obj["metadata"]["name"] == command.PEERING_NAME
        assert ("namespace" in obj["metadata"]) == (crd["spec"]["scope"] == "Namespaced")
