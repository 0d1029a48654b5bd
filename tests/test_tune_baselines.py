"""``scripts/tune_baselines.py``: Tiresias's grid, its neighbours and the table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.runner import TraceSpec

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tune_baselines", ROOT / "scripts" / "tune_baselines.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _options(specs: list) -> list[tuple[tuple[float, ...], float | None]]:  # type: ignore[type-arg]
    out = []
    for s in specs:
        options = dict(s.policy_options)
        out.append((options["queue_thresholds_gpu_s"], options["promote_knob"]))
    return out


def test_the_grid_starts_from_tiresiass_simulator_and_crosses_both_knobs() -> None:
    tune = _script()
    specs = tune.grid(TraceSpec(), SimConfig())
    assert len(specs) == 12
    assert {s.scheduler for s in specs} == {"tiresias"}
    assert {s.value for s in specs} == {1410.0}
    grid = _options(specs)
    assert ((3250.0, 7200.0), None) in grid  # the simulator's dlas-gpu
    assert len(set(grid)) == 12


def test_stage_two_scales_the_thresholds_and_adds_or_drops_a_queue() -> None:
    tune = _script()
    specs = tune.neighbours((30000.0, 60000.0), 2.0, TraceSpec(), SimConfig())
    assert _options(specs) == [
        ((10000.0, 20000.0), 2.0),
        ((90000.0, 180000.0), 2.0),
        ((30000.0,), 2.0),
        ((30000.0, 60000.0, 150000.0), 2.0),
    ]
    (one,) = [s for s in tune.neighbours((500.0,), None, TraceSpec(), SimConfig())][2:]
    assert dict(one.policy_options)["queue_thresholds_gpu_s"] == (500.0, 1250.0)


def test_one_command_prints_both_tables_and_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage one's rows from a file (as --stage1 takes an earlier --json), stage two
    run for real on the trace's first minutes; the best is the lowest average JCT."""
    tune = _script()
    first = [
        {
            "queue_thresholds_gpu_s": [3250.0, 7200.0],
            "promote_knob": None,
            "avg_jct_h": 50.0,
            "median_jct_h": 1.0,
            "p95_jct_h": 2.0,
            "energy_gj": 1.0,
            "preemptions": 7,
            "restarts": 7,
        },
        {
            "queue_thresholds_gpu_s": [3600.0],
            "promote_knob": 2.0,
            "avg_jct_h": 40.0,
            "median_jct_h": 1.0,
            "p95_jct_h": 2.0,
            "energy_gj": 1.0,
            "preemptions": 9,
            "restarts": 9,
        },
    ]
    stage1 = tmp_path / "stage1.json"
    stage1.write_text(json.dumps(first))
    out = tmp_path / "rows.json"
    argv = ["tune_baselines.py", "--hours", "0.1", "--workers", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--stage1", str(stage1), "--json", str(out)])
    assert tune.main() == 0
    text = capsys.readouterr().out
    assert "Stage one" in text and "Stage two" in text
    rows = json.loads(out.read_text())
    assert len(rows) == 2 + 3  # (3600,) has no queue to drop
    second = rows[2:]
    assert [r["queue_thresholds_gpu_s"] for r in second] == [[1200.0], [10800.0], [3600.0, 9000.0]]
    assert all(r["promote_knob"] == 2.0 for r in second)
    best = min(rows, key=lambda r: r["avg_jct_h"])
    assert f"average JCT {best['avg_jct_h']:.2f} h" in text
    assert "| 3,250, 7,200 | off | 50.00 |" in text


def test_stage1_takes_back_an_earlier_json_as_stage_one_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--json`` writes both stages; fed back with ``--stage1`` (what its help offers),
    stage one is the earlier stage one again, not both stages: its table and the
    neighbours of its best are the same as the first time."""
    tune = _script()
    row = {
        "queue_thresholds_gpu_s": [3600.0],
        "promote_knob": None,
        "avg_jct_h": 9.0,
        "median_jct_h": 1.0,
        "p95_jct_h": 2.0,
        "energy_gj": 1.0,
        "preemptions": 9,
        "restarts": 9,
    }
    stage1 = tmp_path / "stage1.json"
    stage1.write_text(json.dumps([row]))
    argv = ["tune_baselines.py", "--hours", "0.1", "--workers", "1"]
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    monkeypatch.setattr(sys, "argv", [*argv, "--stage1", str(stage1), "--json", str(first)])
    assert tune.main() == 0
    once = capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [*argv, "--stage1", str(first), "--json", str(again)])
    assert tune.main() == 0
    twice = capsys.readouterr().out
    assert twice.split("Stage two")[0] == once.split("Stage two")[0]  # one row, as before
    assert json.loads(again.read_text()) == json.loads(first.read_text())
