"""The suite's split over xdist's workers (``support.ci_order``): every twin test on
one worker, one at a time, first; the others beside it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.ci_order import TWIN_GROUP, scope_of

ROOT = Path(__file__).resolve().parents[1]


def test_twin_files_are_one_unit_and_the_rest_one_unit_per_test() -> None:
    assert scope_of("tests/test_twin_faults.py::test_x") == TWIN_GROUP
    assert scope_of("tests/test_demo.py::test_y[a-b]") == TWIN_GROUP
    assert scope_of("tests/test_cli.py::test_z") == "tests/test_cli.py::test_z"
    assert scope_of("tests/test_twinkle_free.py::t") == TWIN_GROUP  # named so: it joins


@pytest.mark.timeout(300)  # two workers start, each importing the suite's plugins
def test_two_workers_run_every_twin_test_on_one_of_them() -> None:
    """Failed with xdist's own loadgroup on pytest 9.2, which spread the marked tests
    over both workers (pytest-dev/pytest-xdist#1386)."""
    twin = [
        "tests/test_demo.py::test_help_says_what_speed_means",
        "tests/test_demo.py::test_a_job_line_is_its_status",
        "tests/test_demo.py::test_simulate_mini_charges_no_node_boot",
        "tests/test_demo.py::test_events_come_once_each_in_the_servers_order",
    ]
    other = [
        "tests/test_cli.py::test_version_via_module",
        "tests/test_cli.py::test_no_command_prints_help_and_fails",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
         "loadgroup", "-v", *other, *twin],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ran = {
        nodeid: w for w, nodeid in re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", out.stdout)
    }
    assert set(ran) == {*twin, *other}, out.stdout[-2000:]
    assert len({ran[nodeid] for nodeid in twin}) == 1, ran
    assert set(ran.values()) == {"gw0", "gw1"}, ran  # the others ran beside them
