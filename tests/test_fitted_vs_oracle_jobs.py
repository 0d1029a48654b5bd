"""``scripts/fitted_vs_oracle_jobs.py``: the fitted-against-oracle table, job group by group.

Run on the trace's first hour: its "all" row counts every job once and sums the
groups, and the two runs it compares differ (the fitted one profiles).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import TraceSpec, load_jobs

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    path = ROOT / "scripts" / "fitted_vs_oracle_jobs.py"
    spec = importlib.util.spec_from_file_location("fitted_vs_oracle_jobs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_the_table_covers_every_job_once(capsys: pytest.CaptureFixture[str]) -> None:
    _script().main(["--eta", "0.6", "--hours", "1", "--top", "100"])
    out = capsys.readouterr().out
    jobs = len(load_jobs(TraceSpec(hours=1.0), SimConfig()))
    first_table = out.split("most extra energy")[0]
    rows = [r.split("|")[1:-1] for r in first_table.splitlines() if r.startswith("| ")]
    rows = [[c.strip() for c in r] for r in rows if r[0].strip() != "jobs (model x requested GPUs)"]
    total, groups = rows[0], rows[1:]
    assert total[0] == "all" and int(total[1]) == jobs
    assert sum(int(g[1]) for g in groups) == jobs
    assert all(re.fullmatch(r"\S+ x\d+", g[0]) for g in groups)
    d_jct = sum(float(g[2]) for g in groups)
    assert d_jct == pytest.approx(float(total[2]), abs=0.05 * len(groups) + 0.05)
    assert float(total[3]) != 1.0 or float(total[5]) != 1.0  # fitted and oracle differ
