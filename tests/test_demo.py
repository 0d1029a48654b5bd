"""``powerflow demo``: the twin in a live view, then ``simulate``'s summary for both runs.

The command runs as a user runs it (``main(["demo", ...])``), on the smallest run
that still goes through every component: the first job of the default trace at
1/500 of its size (112 iterations on up to 16 GPUs; about a minute here, most of
it starting and stopping the operator and the API server). Its output goes to a
non-terminal, where rich draws the live view once, as it stands when the last job
ends: the test reads that picture and the summary after it.
"""

from __future__ import annotations

import io
import re
import sys
from typing import Any

import pytest
from rich.console import Console

from powerflow.cli import main
from powerflow.commands import demo
from powerflow.commands.demo_view import (
    EVENTS_SHOWN,
    Frame,
    JobRow,
    NodeRow,
    event_line,
    job_row,
    new_events,
    render,
    shown_jobs,
)
from powerflow.lab.sim.config import POWER_ON_S
from powerflow.lab.twin.compare import simulate_mini
from powerflow.lab.twin.timescale import TimeScale
from powerflow.lab.twin.trace import mini_trace


def _never(*_: Any, **__: Any) -> Any:
    raise AssertionError("the demo started before refusing its options")


@pytest.mark.timeout(300)
def test_demo_shows_the_live_view_then_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Every part of the view (the job's phase, GPUs, progress; each GPU; the power
    against the 16-GPU budget; the operator's Events), then simulate's table with a
    row for the twin and one for simulate, and the agreement line."""
    assert main(["demo", "--jobs", "1", "--speed", "500"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # the in-process parts' warnings go to the demo's log, not here
    view, summary = out.split("with powerflow simulate", 1)
    title = "PowerFlow twin: 1 job of the default trace at 1/500 size, 2 x 8 simulated A100"
    assert title in view and title in summary
    assert "DLJobs (1/1 done)" in view
    (line,) = [x for x in view.splitlines() if "j00-gpt2" in x and "Succeeded" in x]
    iterations = mini_trace(1, TimeScale(1 / 500))[0].job.iterations
    assert f"{iterations}/{iterations} 100%" in line
    assert "GPUs (# training, . idle)" in view
    assert re.search(r"node-0 .* [#.]{8} ", view) and re.search(r"node-1 .* [#.]{8} ", view)
    assert re.search(r"cluster power .* W of a 4,802 W budget \(\d+%\)", view)
    assert "events" in view
    # The panel holds the newest EVENTS_SHOWN events, oldest first: on a slow machine the
    # job may have more (a rescale, a second profile), and its first ones scroll out.
    shown = [float(t) for t in re.findall(r"(\d+\.\d) s  j00-gpt2  ", view)]
    assert shown and shown == sorted(shown) and len(shown) <= EVENTS_SHOWN
    full = len(shown) == EVENTS_SHOWN
    assert full or "j00-gpt2  applied (gpt2)" in view
    assert full or re.search(r"j00-gpt2  Profiling: profiling on \d+ GPUs", view)
    assert f"{title}; budget 4,802 W" in summary
    for row in ("powerflow (twin)", "powerflow (simulate)"):
        (cells,) = [x for x in summary.splitlines() if row in x]
        assert "eta 1" in cells
    assert "JCT s" in summary and "MJ" in summary and "restarts" in summary
    table = [x for x in summary.splitlines() if x[:1] in "┏┃┡│└"]
    assert table and max(map(len, table)) <= 80  # piped: 140 columns, the table in 80
    assert re.search(r"agreement with simulate: average JCT: twin \d+ s, simulate \d+ s", summary)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speed", "0.5"], "--speed must be 1 to 1000, got 0.5"),
        (["--speed", "nan"], "--speed must be 1 to 1000, got nan"),
        (["--speed", "5000"], "--speed must be 1 to 1000, got 5000"),
        (["--jobs", "0"], "--jobs must be 1 to 50, got 0"),
        (["--jobs", "51"], "--jobs must be 1 to 50, got 51"),
        (["--nodes", "0"], "--nodes must be 1 to 8, got 0"),
        (["--nodes", "9"], "--nodes must be 1 to 8, got 9"),
        (["--eta", "0"], "--eta must be in (0, 1], got 0"),
    ],
)
def test_options_are_refused_before_anything_starts(
    extra: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(demo, "demo", _never)
    assert main(["demo", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"powerflow demo: error: {message}\n"


def test_without_kmock_it_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``import kmock`` fails as it does where the extra is not installed."""
    monkeypatch.setitem(sys.modules, "kmock", None)
    monkeypatch.setattr(demo, "demo", _never)
    assert main(["demo"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "needs kmock" in err and "pip install 'powerflow[lab]'" in err


def test_help_says_what_speed_means(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--speed N the time scale: the trace is made N times smaller" in text


def test_simulate_mini_charges_no_node_boot() -> None:
    """The twin's nodes never boot (powered-down nodes are parked), so the simulator
    run the demo compares with must not wait for one: with the simulator's 300 s boot
    this job's JCT was 606 s at 1/500 size, where it trains for seconds."""
    scale = TimeScale(1 / 500)
    sim = simulate_mini(mini_trace(1, scale), nodes=2, gpus_per_node=8, scale=scale)
    assert sim.power_on_energy_j == 0.0
    assert sim.jobs[0].jct_s < POWER_ON_S


# ---------------------------------------------------------------- the view, pure


def dljob(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "j01-bert", "namespace": "ml"},
        "spec": {"model": "bert", "iterations": 200},
        "status": status,
    }


def test_a_job_line_is_its_status() -> None:
    running = dljob(
        {
            "phase": "Running",
            "allocation": {"gpus": 4, "frequencyMHz": 1200, "nodes": ["node-1", "node-0"]},
            "progress": {"iterations": 50},
        }
    )
    assert job_row(running) == JobRow(
        "j01-bert", "bert", "Running", 4, ("node-1", "node-0"), 1200, 50, 200
    )
    # Ended: the allocation is history, the progress is the whole job (the last write
    # may predate the end by a progress interval).
    done = dljob({"phase": "Succeeded", "allocation": {"gpus": 4}, "progress": {"iterations": 190}})
    assert job_row(done) == JobRow("j01-bert", "bert", "Succeeded", None, (), None, 200, 200)
    assert job_row(dljob({})) == JobRow("j01-bert", "bert", "New", None, (), None, 0, 200)
    junk = dljob({"phase": "Running", "allocation": {"gpus": "4", "nodes": "x"}, "progress": []})
    assert job_row(junk) == JobRow("j01-bert", "bert", "Running", None, (), None, 0, 200)


def event(uid: str, version: str, reason: str, type_: str = "Normal") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "resourceVersion": version},
        "involvedObject": {"name": "j01-bert"},
        "type": type_,
        "reason": reason,
        "message": f"{reason} happened",
    }


def test_events_come_once_each_in_the_servers_order() -> None:
    seen: set[str] = set()
    first = new_events([event("b", "12", "Started"), event("a", "9", "Profiling")], seen)
    assert [e["reason"] for e in first] == ["Profiling", "Started"]
    again = new_events([event("a", "9", "Profiling"), event("c", "13", "Completed")], seen)
    assert [e["reason"] for e in again] == ["Completed"]
    line = event_line(event("d", "14", "FailedCreate", "Warning"), 12.25)
    assert line == "   12.2 s  j01-bert  ! FailedCreate: FailedCreate happened"


def test_the_view_shows_jobs_gpus_power_and_the_newest_events() -> None:
    frame = Frame(
        title="T",
        elapsed_s=3.0,
        jobs=(JobRow("j01-bert", "bert", "Running", 2, ("node-0",), 1200, 50, 200),),
        waiting=3,
        nodes=(NodeRow("node-0", (True, True, False), (1200, 1200, 210), 5100.0),),
        budget_w=4800.0,
        events=tuple(f"event {i}" for i in range(12)),
    )
    console = Console(width=140, record=True, file=io.StringIO())
    console.print(render(frame))
    text = console.export_text()
    assert "DLJobs (0/4 done)" in text
    assert "3 more to be submitted" in text
    assert "50/200 25%" in text and "1200" in text
    assert "##." in text
    assert "5,100 W of a 4,800 W budget (106%)" in text
    assert "event 11" in text and "event 4" in text and "event 3" not in text
    assert frame.power_w == 5100.0 and frame.done == 0


def test_on_an_80_column_terminal_the_view_cuts_no_number() -> None:
    """Names and nodes wrap; GPUs, clocks and iterations stay whole."""
    jobs = tuple(
        JobRow(f"j{i:02d}-deepspeech2", "deepspeech2", phase, 16, ("node-0", "node-1"), 1275,
               12345, 45678)
        for i, phase in enumerate(("Running", "Rescaling", "Succeeded"))
    )  # fmt: skip
    node = NodeRow("node-0", (True,) * 6 + (False,) * 2, (1275,) * 8, 2345.0)
    frame = Frame("PowerFlow twin: 20 jobs", 123.4, jobs, 5, (node,), 4802.0, ("e",))
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(render(frame))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    assert text.count("12345/45678 27%") == 3 and text.count(" 1275 ") >= 3
    assert all(phase in text for phase in ("Running", "Rescaling", "Succeeded"))


def test_on_a_short_terminal_the_ended_jobs_give_way() -> None:
    """rich cuts a live view taller than the terminal at its bottom (the power and the
    events): the jobs' table shows the jobs still running first, and says how many it
    leaves out."""
    jobs = tuple(
        JobRow(f"j{i:02d}", "bert", "Succeeded" if i % 2 else "Running", 1, (), 1410, 1, 9)
        for i in range(10)
    )
    frame = Frame("T", 1.0, jobs, 0, (NodeRow("node-0", (True,), (1410,), 300.0),), 4800.0, ())
    running = [j.name for j in jobs if j.phase == "Running"]
    assert [j.name for j in shown_jobs(jobs, 6)] == ["j00", "j01", "j02", "j04", "j06", "j08"]
    assert [j.name for j in shown_jobs(jobs, 3)] == running[:3]
    assert shown_jobs(jobs, None) == jobs
    height = 20
    console = Console(width=140, height=height, record=True, file=io.StringIO())
    console.print(render(frame, height))
    text = console.export_text()
    assert len(text.splitlines()) <= height
    assert "cluster power" in text and "(none yet)" in text
    assert "7 not shown" in text
    assert [j for j in ("j00", "j01", "j02", "j04", "j06") if j in text] == ["j00", "j02", "j04"]
    tall = Console(width=140, record=True, file=io.StringIO())
    tall.print(render(frame))
    everything = tall.export_text()
    assert all(j.name in everything for j in jobs)
