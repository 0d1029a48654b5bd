"""Every command refuses what it cannot use before it computes: output paths, value
ranges, trace and sample rows; one line on stderr and exit code 2, never a traceback
after the work. And its ``--help`` reads as plain text, with a help string per option.

The compute entry points are replaced by a function that fails the test: a check
that ran after them would not be "before any work"."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models_synth import TRUE, grid, sample

from powerflow.cli import build_parser, main
from powerflow.commands import budget, fit, simulate, sweep
from powerflow.core.errors import DataError
from powerflow.core.models.samples import Samples, write_samples_csv
from powerflow.lab.groundtruth import MODEL_NAMES, ground_truth
from powerflow.lab.sim.trace import ReplayCluster, load_trace

HEADER = "job_id,submit_time,num_gpu,duration,model_name,global_batch_size,num_iteration,cluster\n"
ROWS = "a,0,1,0,resnet50,128,3000,c\nb,30,2,0,gpt2,256,2000,c\n"
CLUSTER = ["--nodes", "1", "--gpus-per-node", "4"]


def _never(*_: Any, **__: Any) -> Any:
    raise AssertionError("the command computed before refusing its arguments")


@pytest.fixture
def no_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    for module, name in (
        (simulate, "run_one"),
        (simulate, "run_many"),
        (sweep, "_run_with_progress"),
        (fit, "fit_profile"),
        (budget, "predict"),
    ):
        monkeypatch.setattr(module, name, _never)


def _trace(tmp_path: Path, rows: str = ROWS, header: str = HEADER, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(header + rows)
    return path


def _one_line_error(capsys: pytest.CaptureFixture[str], command: str) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith(f"powerflow {command}: error: ") and err.count("\n") == 1, err
    return err


# ------------------------------------------------------------------ output paths


@pytest.fixture
def samples_csv(tmp_path: Path) -> Path:
    path = tmp_path / "job.csv"
    write_samples_csv(sample(TRUE, grid(clock_step=12), noise=0.02, seed=4), path)
    return path


OUTPUT_CASES = {
    "simulate --out is a file": (["simulate", "--out", "{file}"], "is a file, not a folder"),
    "simulate --out under a file": (["simulate", "--out", "{file}/run"], "is a file, not a"),
    "simulate --report without its folder": (
        ["simulate", "--report", "{new}/report.md"],
        "no folder",
    ),
    "simulate --report is a folder": (["simulate", "--report", "{dir}"], "is a folder"),
    "single run --out is a file": (
        ["simulate", "--scheduler", "gandiva", "--out", "{file}"],
        "is a file, not a folder",
    ),
    "single run takes no --report": (
        ["simulate", "--scheduler", "gandiva", "--report", "{dir}/r.md"],
        "--report",
    ),
    "sweep --out is a file": (["sweep", "sensitivity", "--out", "{file}"], "is a file"),
    "fit --samples --out without its folder": (
        ["fit", "--samples", "{samples}", "--out", "{new}/p.json"],
        "no folder",
    ),
    "fit --plot is a file": (["fit", "--models", "bert", "--plot", "{file}"], "is a file"),
    "fit --write-priors is a file": (
        ["fit", "--models", "bert", "--write-priors", "{file}"],
        "is a file",
    ),
    "budget --plot without its folder": (
        ["budget", "what-if", "--demo", "--jobs", "2", "--plot", "{new}/w.png"],
        "no folder",
    ),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_CASES))
@pytest.mark.usefixtures("no_compute")
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(
    case: str, tmp_path: Path, samples_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, words = OUTPUT_CASES[case]
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-dir").mkdir()
    before = sorted(tmp_path.iterdir())
    where = {
        "file": str(tmp_path / "a-file"),
        "dir": str(tmp_path / "a-dir"),
        "new": str(tmp_path / "new"),
        "samples": str(samples_csv),
    }
    trace = ["--trace", str(_trace(tmp_path / "a-dir"))] if argv[0] == "simulate" else []
    argv = [a.format(**where) for a in argv] + trace
    assert main(argv) == 2
    assert words in _one_line_error(capsys, argv[0])
    assert sorted(tmp_path.iterdir()) == before  # no folder made for a file
    assert not (tmp_path / "a-dir" / "r.md").exists()


def test_a_folder_the_user_names_is_created_with_its_parents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "today"
    args = ["simulate", "--scheduler", "gandiva", "--trace", str(_trace(tmp_path)), *CLUSTER]
    assert main([*args, "--json", "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["jobs"] == 2
    capsys.readouterr()


def test_a_write_that_fails_after_the_work_is_still_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    (out / "run.json").mkdir(parents=True)  # a folder where the result goes
    args = ["simulate", "--scheduler", "gandiva", "--trace", str(_trace(tmp_path)), *CLUSTER]
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"powerflow simulate: error: {out / 'run.json'}: Is a directory\n"


# ------------------------------------------------------------------- value ranges


@pytest.mark.parametrize("hours", ["0", "-1", "nan"])
@pytest.mark.usefixtures("no_compute")
def test_hours_must_be_positive(hours: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scheduler", "gandiva", "--hours", hours]) == 2
    assert "--hours must be a positive number of hours" in _one_line_error(capsys, "simulate")
    assert main(["budget", "what-if", "--validate", "--hours", hours]) == 2
    assert "--hours must be a positive number of hours" in _one_line_error(capsys, "budget")


def test_a_trace_window_of_zero_hours_is_not_the_whole_trace(tmp_path: Path) -> None:
    args: dict[str, Any] = {"seed": 0, "cluster": ReplayCluster(gpus_per_node=8)}
    with pytest.raises(DataError, match="positive number of hours"):
        load_trace(_trace(tmp_path), MODEL_NAMES, (), ground_truth, hours=0.0, **args)


def test_only_the_jobs_in_the_window_must_fit_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path, "a,0,1,0,resnet50,128,3000,c\nbig,7200,64,0,bert,64,100,c\n")
    args = ["simulate", "--scheduler", "gandiva", "--trace", str(trace), *CLUSTER, "--json"]
    assert main([*args, "--hours", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == 1
    assert main([*args, "--hours", "3"]) == 2
    assert "t.csv:3: job asks for 64 GPUs" in _one_line_error(capsys, "simulate")


@pytest.mark.parametrize("eta", ["0", "1.5", "-0.2", "nan"])
@pytest.mark.usefixtures("no_compute")
def test_eta_has_the_same_range_in_plan_and_simulate_and_says_it(
    eta: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--demo", "--eta", eta]) == 2
    planned = _one_line_error(capsys, "plan").split("error: ")[1]
    assert main(["simulate", "--scheduler", "powerflow", "--eta", eta, "--hours", "1"]) == 2
    simulated = _one_line_error(capsys, "simulate").split("error: ")[1]
    assert planned == simulated == f"--eta must be in (0, 1], got {float(eta):g}\n"


@pytest.mark.parametrize("watts", ["0", "-100", "nan"])
@pytest.mark.usefixtures("no_compute")
def test_plan_refuses_a_limit_that_is_not_positive(
    watts: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--demo", "--limit-watts", watts]) == 2
    assert f"--limit-watts must be > 0 and finite, got {float(watts):g}" in _one_line_error(
        capsys, "plan"
    )


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--gpus-per-node", "9"], "--gpus-per-node must be 1 to 8"),
        (["--interval", "0"], "--interval must be a finite number > 0"),
        (["--restart-s", "-1"], "--restart-s must be a finite number >= 0"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--nodes", "0"], "--nodes must be 1 to 10000, got 0"),
        (["--workers", "0"], "--workers must be at least 1"),
    ],
)
@pytest.mark.usefixtures("no_compute")
def test_cluster_options_are_refused_by_their_own_names(
    extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--scheduler", "gandiva", *extra]) == 2
    assert words in _one_line_error(capsys, "simulate")


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--pmax-watts", "0"], "--pmax-watts must be a positive number, got 0"),
        (["--gpus-per-node", "0"], "--gpus-per-node must be 1 to 8, got 0"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--hours", "1"], "--hours cuts the trace of --validate"),
    ],
)
@pytest.mark.usefixtures("no_compute")
def test_budget_what_if_options_are_refused_by_their_own_names(
    extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["budget", "what-if", "--demo", "--jobs", "2", *extra]) == 2
    assert words in _one_line_error(capsys, "budget")


def test_messages_name_no_internal_symbols() -> None:
    with pytest.raises(DataError) as caught:
        Samples(*(np.array([v]) for v in (2.0, 4.0, 32.0, 1005.0, 0.1, 20.0)))
    assert not re.search(r"\b[rn]\b", str(caught.value)), caught.value


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--samples", "{samples}", "--plot", "{tmp}"], "--plot: not an option of --samples"),
        (["--models", "bert", "--out", "{tmp}/p.json"], "--out: not an option of the ground"),
    ],
)
@pytest.mark.usefixtures("no_compute")
def test_fit_refuses_options_of_the_other_mode(
    argv: list[str],
    words: str,
    samples_csv: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [a.format(samples=samples_csv, tmp=tmp_path) for a in argv]
    assert main(["fit", *argv]) == 2
    assert words in _one_line_error(capsys, "fit")


# -------------------------------------------------------------------- trace rows


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ("a,0,1,0,resnet50,128,3000,c\nb,30,2,0\n", "t.csv:3: 4 fields, the header has 8"),
        ("a,0,1,0,resnet50,128,3000,c,x,y\n", "t.csv:2: 10 fields, the header has 8"),
        ("a,0,1,0,resnet50,1e30,3000,c\n", "t.csv:2: job a cannot finish within"),
        ("a,1e30,1,0,resnet50,128,3000,c\n", "t.csv:2: job a cannot finish within"),
        ("a,0,1,0,resnet50,128,1e30,c\n", "t.csv:2: job a cannot finish within"),
        ("a,0,1,0,resnet50,128.5,3000,c\n", "global_batch_size must be a positive integer"),
        ("a,0,1,0,resnet50,128,3000,c\n\nb,0,1,0,bert,64,-1,c\n", "t.csv:4: num_iteration"),
    ],
    ids=[
        "short-row",
        "long-row",
        "batch-1e30",
        "submit-1e30",
        "iterations-1e30",
        "half",
        "line",
    ],
)
def test_a_bad_trace_row_is_one_line_naming_it(
    rows: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path, rows)
    argv = ["simulate", "--scheduler", "gandiva", "--trace", str(trace), *CLUSTER, "--json"]
    assert main(argv) == 2
    assert words in _one_line_error(capsys, "simulate")


def test_rows_outside_the_window_are_still_checked_but_need_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(rows: str) -> int:
        trace = _trace(tmp_path, rows, name=f"t{len(list(tmp_path.iterdir()))}.csv")
        argv = ["simulate", "--scheduler", "gandiva", "--trace", str(trace), *CLUSTER]
        return main([*argv, "--hours", "1", "--json"])

    assert run(ROWS + "late,7200,1,0,bert,64,1e30,c\n") == 0  # never replayed: not refused
    assert json.loads(capsys.readouterr().out)["jobs"] == 2
    assert run(ROWS + "a,7200,1,0,bert,64,10,c\n") == 2
    assert "t1.csv:4: duplicate job id 'a' (first on line 2)" in _one_line_error(capsys, "simulate")
    assert run(ROWS + "late,7200,1,0,bert,64,x,c\n") == 2
    assert "t2.csv:4: column 'num_iteration' is not a" in _one_line_error(capsys, "simulate")
    assert run("a,7200,1,0,resnet50,128,3000,c\n") == 2
    assert "no job is submitted in the first 1 h" in _one_line_error(capsys, "simulate")


@pytest.mark.usefixtures("no_compute")
def test_the_comparison_refuses_a_bad_row_before_it_starts_its_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path, ROWS + "c,0,1,0,resnet50,128,3000\n")
    out = tmp_path / "out"
    assert main(["simulate", "--quick", "--trace", str(trace), *CLUSTER, "--out", str(out)]) == 2
    assert "t.csv:4: 7 fields" in _one_line_error(capsys, "simulate")


def test_a_byte_order_mark_is_not_part_of_the_first_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bom.csv"
    trace.write_text(HEADER + ROWS, encoding="utf-8-sig")
    args = ["simulate", "--scheduler", "gandiva", "--trace", str(trace), *CLUSTER, "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == 2


# ------------------------------------------------------------------- sample rows


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ("1e308,1,64,1005,1e308,1e308", "n x local_batch_size (the global batch) is not"),
        ("2,1,64,1005,1e308,1e308", "n x step_time_s"),
        ("1,1,64,1005,1e-300,1e300", "energy_j / (n x step_time_s)"),
        ("1,1,64,1e308,0.1,20", "frequency_mhz: 1e+308 is outside the A100's clocks"),
        ("1.5,1,64,1005,0.1,20", "column n: '1.5' must be a whole number"),
    ],
)
@pytest.mark.usefixtures("no_compute")
def test_fit_refuses_a_row_whose_values_overflow_after_parsing(
    row: str, words: str, samples_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = samples_csv.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([*lines, row]) + "\n")
    assert main(["fit", "--samples", str(bad), "--out", str(tmp_path / "p.json")]) == 2
    err = _one_line_error(capsys, "fit")
    assert f"row {len(lines) + 1}" in err and words in err


def test_fit_reads_samples_saved_with_a_byte_order_mark(
    samples_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bom = tmp_path / "bom.csv"
    bom.write_text(samples_csv.read_text(), encoding="utf-8-sig")
    assert main(["fit", "--samples", str(bom), "--out", str(tmp_path / "p.json")]) == 0
    assert (tmp_path / "p.json").stat().st_size > 0
    capsys.readouterr()


# -------------------------------------------------------------------------- help


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = [path for path, _ in _commands(build_parser())]


def test_the_walk_reaches_every_command() -> None:
    assert {("simulate",), ("fit",), ("sweep",), ("budget", "what-if"), ("operator",)} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "powerflow")
def test_help_is_plain_text_with_a_help_string_per_option(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = dict(_commands(build_parser()))[command]
    bare = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction) and not a.help
    ]
    assert bare == []
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: powerflow")
    assert "`" not in text


# ------------------------------------------------------------- review: more ranges


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--nodes", "1000000000"], "--nodes must be 1 to 10000, got 1000000000"),
        (["--interval", "inf"], "--interval must be a finite number > 0 seconds, got inf"),
        (["--restart-s", "inf"], "--restart-s must be a finite number >= 0 seconds, got inf"),
    ],
)
@pytest.mark.usefixtures("no_compute")
def test_a_cluster_or_timing_value_out_of_all_range_is_refused_by_name(
    extra: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A billion nodes took 21 GB before any job ran; an infinite interval never
    re-evaluates and still printed a result."""
    trace = ["--trace", str(_trace(tmp_path))]
    assert main(["simulate", "--scheduler", "gandiva", *trace, *extra]) == 2
    assert words in _one_line_error(capsys, "simulate")


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--nodes", "1000000000"], "--nodes must be 1 to 10000, got 1000000000"),
        (["--gpus-per-node", "100"], "--gpus-per-node must be 1 to 8, got 100"),
        (["--watts", "nan"], "--watts: every limit must be a positive finite number"),
        (["--watts", "1e5,inf"], "--watts: every limit must be a positive finite number"),
    ],
)
@pytest.mark.usefixtures("no_compute")
def test_budget_what_if_refuses_sizes_and_limits_by_name_before_reading_the_queue(
    extra: list[str],
    words: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(budget, "demo_queue", _never)
    monkeypatch.setattr(budget, "live_queue", _never)
    for source in (["--demo"], ["--kubeconfig", "/nonexistent"]):
        if "--nodes" in extra and source[0] == "--kubeconfig":
            continue  # the live cluster sets its own size
        assert main(["budget", "what-if", *source, *extra]) == 2
        assert words in _one_line_error(capsys, "budget")


@pytest.mark.parametrize("watts", ["inf", "1e400"])
@pytest.mark.usefixtures("no_compute")
def test_plan_names_the_option_of_an_infinite_limit(
    watts: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--demo", "--limit-watts", watts]) == 2
    assert "--limit-watts must be > 0 and finite, got inf" in _one_line_error(capsys, "plan")


def test_a_philly_duration_that_overflows_is_one_line_without_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path, "0,1,1,1e308\n", header="job_id,submit_time,num_gpu,duration\n")
    argv = ["simulate", "--scheduler", "gandiva", "--trace", str(trace), *CLUSTER, "--json"]
    assert main(argv) == 2  # pytest turns a RuntimeWarning into an error: it would raise
    assert "t.csv:2: job 0 cannot finish within" in _one_line_error(capsys, "simulate")


def test_fit_says_models_names_none(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--models", ","]) == 2
    assert "--models names no model" in _one_line_error(capsys, "fit")


def test_more_workers_than_runs_start_one_process_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python 3.11 forks every worker of a fork-started pool at once."""
    from concurrent.futures import ProcessPoolExecutor

    from powerflow.lab.sim import runner

    class Pool(ProcessPoolExecutor):
        def __init__(self, max_workers: int) -> None:
            assert max_workers <= 2, f"{max_workers} processes for 2 runs"
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(runner, "ProcessPoolExecutor", Pool)
    spec = runner.RunSpec(
        "gandiva", 1410, runner.TraceSpec(str(_trace(tmp_path))), runner.SimConfig(nodes=1)
    )
    outcomes = runner.run_many([spec, spec], workers=50)
    assert [o.row()["jobs"] for o in outcomes] == [2, 2]


@pytest.mark.usefixtures("no_compute")
def test_a_report_named_as_the_results_folder_is_refused_before_the_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both checks pass while the folder does not exist yet; the report then met a
    folder after the whole comparison."""
    out = str(tmp_path / "res")
    trace = str(_trace(tmp_path))
    argv = ["simulate", "--quick", "--trace", trace, *CLUSTER, "--out", out, "--report", out]
    assert main(argv) == 2
    assert "--report" in _one_line_error(capsys, "simulate")
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--debounce", "nan"), ("--profiling-window", "inf"), ("--progress-interval", "-1")],
)
def test_operator_timings_are_finite_and_named_before_it_connects(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["operator", option, value, "--kubeconfig", "/nonexistent"]) == 2
    err = _one_line_error(capsys, "operator")
    assert f"{option} must be a finite number >= 0, got {float(value):g}" in err


@pytest.mark.usefixtures("no_compute")
def test_validate_refuses_a_plot_it_would_never_draw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(budget, "_validate", _never)
    plot = tmp_path / "w.png"
    assert main(["budget", "what-if", "--validate", "--plot", str(plot)]) == 2
    assert "--validate draws none" in _one_line_error(capsys, "budget")
