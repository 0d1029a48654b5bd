"""``python -m benchmarks``: its help lists every benchmark; a name matching none is one
line and exit 2 (the benchmarks themselves are never run by the tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def printed(check: str, timeout_s: float) -> str:
    """What ``check`` prints, run in a fresh interpreter in the repository (it must pass)."""
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_help_lists_every_benchmark_with_what_it_measures() -> None:
    done = benchmarks("--help")
    assert done.returncode == 0, done.stderr
    modules = sorted(p.stem for p in (ROOT / "benchmarks").glob("*_bench.py"))
    assert modules
    for name in modules:
        (line,) = [x for x in done.stdout.splitlines() if x.split()[:1] == [name[:-6]]]
        assert len(line.split()) > 2, line  # a summary follows the name


def test_an_unknown_name_is_one_line_and_exit_2() -> None:
    done = benchmarks("no-such-thing")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "no benchmark matches no-such-thing; have " in done.stderr


def test_the_ingest_benchmarks_batches_are_all_accepted() -> None:
    """Its batches must pass every check of the ingest it measures (allocation,
    physics, no repeated or overlapping window), else it times refusals (or stops
    at the first 422)."""
    check = (
        "import orjson\n"
        "from benchmarks.ingest_bench import GPU0_JOBS, Feed, cluster_view\n"
        "from powerflow.core.gpus import A100\n"
        "from powerflow.core.telemetry import parse_batch\n"
        "from powerflow.operator.sample_checks import Windows, index, judge\n"
        "jobs, windows, why = index(cluster_view().state), Windows(), set()\n"
        "feed = Feed(GPU0_JOBS[1::4])  # one client's batches, in the order it posts them\n"
        "for size in (1, 10, 100, 500, 2000, 2000):\n"
        "    batch = parse_batch(orjson.loads(feed(size)))\n"
        "    for s in batch.samples:\n"
        "        why.add(str(judge(jobs, batch.node, A100, s) or windows.check('gpu-0', s, 2e9)))\n"
        "        windows.take('gpu-0', s)\n"
        "print(sorted(why))\n"
    )
    assert printed(check, timeout_s=60) == "['None']"


def test_the_operator_benchmarks_policy_share_is_within_each_pass() -> None:
    """``operator_bench`` splits each pass's CPU time into the policy's (every ``plan``
    call of that pass) and the operator's (the rest of that pass): the policy's share
    is measured inside the pass's interval on the same thread, so it is never more
    than the pass's CPU and the operator's column is never negative."""
    check = (
        "from benchmarks.operator_bench import loop_times\n"
        "out = loop_times(3, 16, 4)\n"
        "for label, (wall, cpu, plan) in out.items():\n"
        "    assert len(cpu) == len(plan) == 3, label\n"
        "    assert all(0 < p <= c for c, p in zip(cpu, plan, strict=True)), (label, cpu, plan)\n"
        "print(sorted(out))\n"
    )
    assert printed(check, timeout_s=120) == "['16 new jobs', '16 running jobs']"


def test_the_targets_table_says_met_or_missed_for_ceilings_and_floors() -> None:
    """A time is met at or below its limit, a rate at or above it (with no call failed),
    and the table says which, with the limit's direction and the benchmark that
    measures it."""
    check = (
        "from rich.console import Console\n"
        "from benchmarks.targets_bench import Target, table\n"
        "rows = [Target('run: CPU', 5.0, 5.0, 's', 'main_job'),\n"
        "        Target('run2: CPU', 5.01, 5.0, 's', 'c'),\n"
        "        Target('calls', 2999.0, 3000.0, '/s', 'c', at_least=True),\n"
        "        Target('calls2', 3000.0, 3000.0, '/s', 'c', at_least=True),\n"
        "        Target('errors', 9000.0, 3000.0, '/s', 'c', at_least=True, failed=3)]\n"
        "print([t.met for t in rows])\n"
        "console = Console(width=200, record=True)\n"
        "console.print(table(rows))\n"
        "print(console.export_text())\n"
    )
    out = printed(check, 60)
    first, *lines = out.splitlines()
    assert first == "[True, False, False, True, False]"
    row = {line.split("│")[1].strip(): line for line in lines if line.count("│") > 4}
    assert "met" in row["run: CPU"] and "<= 5 s" in row["run: CPU"]
    assert row["run: CPU"].split("│")[-2].strip() == "main_job"
    assert "MISSED" in row["run2: CPU"] and "5.01 s" in row["run2: CPU"]
    assert "MISSED" in row["calls"] and ">= 3,000 /s" in row["calls"]
    assert "met" in row["calls2"] and "MISSED" not in row["calls2"]
    assert "MISSED (3 failed)" in row["errors"]  # a fast error is no rate


def test_the_replay_split_by_snapshot_size_puts_each_decision_in_its_range() -> None:
    check = (
        "from benchmarks.replay_bench import by_size\n"
        "rows = by_size([1.0, 2.0, 3.0, 4.0, 5.0], [10, 60, 60, 450, 49], [1, 5, 7, 400, 3])\n"
        "print(rows)\n"
    )
    assert printed(check, 60) == repr(
        [
            ("under 50", 2, 3.0, 2.0, 6.0),
            ("50-99", 2, 2.5, 6.0, 5.0),
            ("400 and more", 1, 4.0, 400.0, 4.0),
        ]
    )
