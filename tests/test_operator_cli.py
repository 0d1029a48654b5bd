"""``powerflow operator``: options -> kopf's settings (always standalone: the Lease, not
kopf's peering, decides who acts) and the leader-election settings."""

from __future__ import annotations

import argparse

import pytest

from powerflow.cli import build_parser
from powerflow.commands import operator as command
from powerflow.core.errors import PowerFlowError


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["operator", *argv])


def test_leader_election_is_the_default_and_kopf_standalone() -> None:
    args = parse()
    options = command.kopf_options(args)
    assert options["standalone"] is True and "peering_name" not in options
    assert options["clusterwide"] is True and options["namespaces"] == []
    assert command.leader_election(args)
    assert (args.lease_namespace, args.lease_name) == ("powerflow-system", "powerflow-operator")
    assert args.lease_duration == 15


@pytest.mark.parametrize("flag", ["--no-leader-election", "--standalone"])
def test_leader_election_off(flag: str) -> None:
    assert not command.leader_election(parse(flag))


def test_liveness_can_be_turned_off() -> None:
    assert command.kopf_options(parse())["liveness_endpoint"] == "http://0.0.0.0:8080/healthz"
    assert command.kopf_options(parse("--liveness", ""))["liveness_endpoint"] is None


def test_namespaced() -> None:
    options = command.kopf_options(parse("--namespace", "ml"))
    assert options["clusterwide"] is False
    assert options["namespaces"] == ["ml", "powerflow-system"]  # the budget's too
    same = command.kopf_options(parse("--namespace", "ops", "--budget-namespace", "ops"))
    assert same["namespaces"] == ["ops"]


def test_peering_options_are_gone() -> None:
    with pytest.raises(SystemExit):
        parse("--peering", "powerflow")


def test_settings_reach_the_controller_config() -> None:
    args = parse("--profiling-window", "0.3", "--debounce", "0", "--progress-interval", "5")
    assert (args.profiling_window, args.debounce, args.progress_interval) == (0.3, 0.0, 5.0)
    for bad in (
        ("--profiling-window", "-1"),
        ("--progress-interval", "-1"),
        ("--lease-duration", "0"),
        ("--metrics-port", "70000"),
    ):
        with pytest.raises(PowerFlowError):
            command.kopf_options(parse(*bad))


@pytest.mark.parametrize(
    "url",
    [
        "http://0.0.0.0/healthz",  # kopf would take port 80
        "http://0.0.0.0:0/healthz",  # the same: kopf reads 0 as 80
        "http://0.0.0.0:70000/healthz",
        "https://0.0.0.0:8080/healthz",  # kopf serves plain HTTP only
        "0.0.0.0:8080",
        "http://:8080/healthz",
    ],
)
def test_a_liveness_url_kopf_would_misread_is_one_clear_error(url: str) -> None:
    with pytest.raises(PowerFlowError, match="--liveness"):
        command.kopf_options(parse("--liveness", url))


def test_liveness_addresses_as_kopf_serves_them() -> None:
    assert command.liveness_address("http://0.0.0.0:8080/healthz") == ("0.0.0.0", 8080)
    assert command.liveness_address("http://[::]:8080/healthz") == ("::", 8080)
    assert command.liveness_address("") is None
