"""``powerflow fit``: output shapes, written files and every error path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from models_synth import TRUE, grid, sample

from powerflow.cli import main
from powerflow.core.gpus import gpu_spec
from powerflow.core.models.fitting import MIN_SAMPLES, fit_profile
from powerflow.core.models.params import ModelParams
from powerflow.core.models.priors import load_prior, prior_on
from powerflow.core.models.samples import CSV_COLUMNS, read_samples_csv, write_samples_csv
from powerflow.lab import groundtruth as gt


@pytest.fixture(scope="module")
def good_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("csv") / "job7.csv"
    write_samples_csv(sample(TRUE, grid(clock_step=6), noise=0.02, seed=4), path)
    return path


def _mape_doc(out: str) -> dict[str, dict[str, float]]:
    doc = json.loads(out)
    assert set(doc) == {"models"}
    models: dict[str, dict[str, float]] = doc["models"]
    for entry in models.values():
        assert set(entry) == {"throughput_mape", "energy_mape"}
        assert all(0 <= v < 1 for v in entry.values())
    return models


def test_ground_truth_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--json", "--models", "deepspeech2,bert"]) == 0
    models = _mape_doc(capsys.readouterr().out)
    assert list(models) == ["deepspeech2", "bert"]
    for entry in models.values():  # the target, on held-out data
        assert entry["throughput_mape"] <= 0.10 and entry["energy_mape"] <= 0.10


def test_ground_truth_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--models", "deepspeech2"]) == 0
    out = capsys.readouterr().out
    assert "deepspeech2" in out and "%" in out


def test_samples_fit_writes_params_and_reports_held_out_mape(
    good_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    assert main(["fit", "--samples", str(good_csv), "--out", str(out), "--json"]) == 0
    models = _mape_doc(capsys.readouterr().out)
    assert list(models) == ["job7"]
    assert models["job7"]["throughput_mape"] < 0.03  # 2% noise on the model's own family
    params = ModelParams.from_json(out.read_text())
    assert params.gpu == "A100" and params.model == "job7"


def test_samples_fit_defaults_to_a_file_beside_the_csv(
    good_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit", "--samples", str(good_csv)]) == 0
    written = good_csv.with_suffix(".params.json")
    ModelParams.from_json(written.read_text())
    assert str(written) in capsys.readouterr().err


def test_samples_fit_to_stdout(good_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--samples", str(good_csv), "--out", "-", "--model", "bert"]) == 0
    params = ModelParams.from_json(capsys.readouterr().out)
    assert params.model == "bert"


def test_plots_and_priors_are_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fit", "--models", "deepspeech2", "--plot", str(tmp_path / "png")]
    assert main([*args, "--write-priors", str(tmp_path / "priors")]) == 0
    png = tmp_path / "png" / "deepspeech2.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prior = ModelParams.from_json((tmp_path / "priors" / "deepspeech2.json").read_text())
    assert prior.model == "deepspeech2"
    capsys.readouterr()


def _write(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _rows(count: int) -> list[list[object]]:
    return [[1, 1, 32, 210 + 15 * i, 0.1, 20.0] for i in range(count)]


BAD_CASES = {
    "missing-column": (list(CSV_COLUMNS[:-1]), [r[:-1] for r in _rows(30)], "energy_j"),
    "non-numeric": (list(CSV_COLUMNS), [*_rows(29), [1, 1, "big", 300, 0.1, 20]], "not a number"),
    "negative": (list(CSV_COLUMNS), [*_rows(29), [1, 1, 32, 300, -0.1, 20]], "positive"),
    "zero": (list(CSV_COLUMNS), [*_rows(29), [1, 1, 32, 300, 0.1, 0]], "positive"),
    "nan": (list(CSV_COLUMNS), [*_rows(29), [1, 1, 32, 300, "nan", 20]], "positive"),
    "empty-cell": (list(CSV_COLUMNS), [*_rows(29), [1, 1, 32, 300, "", 20]], "not a number"),
    "r-above-n": (list(CSV_COLUMNS), [*_rows(29), [2, 4, 32, 300, 0.1, 20]], "gpus_per_node"),
    "too-few": (list(CSV_COLUMNS), _rows(MIN_SAMPLES - 1), f"at least {MIN_SAMPLES}"),
    "empty": (list(CSV_COLUMNS), [], f"at least {MIN_SAMPLES}"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_csv_is_one_line_and_exit_code_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header, rows, needle = BAD_CASES[case]
    path = _write(tmp_path / "bad.csv", header, rows)
    assert main(["fit", "--samples", str(path), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("powerflow fit: error:")
    assert needle in err
    assert not (tmp_path / "o.json").exists()


def test_json_needs_enough_rows_for_a_held_out_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = sample(TRUE, grid(clock_step=81), noise=0.0, seed=0)  # 21 rows is enough...
    path = tmp_path / "few.csv"
    write_samples_csv(s.take(np.arange(2 * MIN_SAMPLES - 1)), path)  # ...one fewer is not
    assert main(["fit", "--samples", str(path), "--json"]) == 2
    assert f"at least {2 * MIN_SAMPLES}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--samples", "/nonexistent/x.csv"], "cannot read"),
        (["--samples", "x.csv", "--gpu", "Z80"], "unknown GPU"),
        (["--samples", "x.csv", "--json", "--out", "-"], "stdout"),
        (["--models", "resnet50,alexnet"], "alexnet"),
    ],
    ids=["missing-file", "unknown-gpu", "two-stdouts", "unknown-model"],
)
def test_bad_arguments_are_one_line_and_exit_code_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_samples_of_another_type_are_fitted_with_its_prior_as_the_operator_fits_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """H100 samples (the H100 ground truth at a few clocks): the fit is anchored to the
    ``--model`` prior carried over to the H100 (``prior_on``), the anchor the operator's
    learner gives a job on an H100 pool, not fitted from the data alone."""
    h100 = gpu_spec("H100-SXM")
    truth = gt.ground_truth("resnet50", h100)
    rng = np.random.default_rng(2)
    samples = gt.measure(truth, [1, 2, 4], 1, 32.0, np.asarray(h100.clocks_mhz[::11])[:, None],
                         rng=rng)  # fmt: skip
    path = tmp_path / "h100.csv"
    write_samples_csv(samples, path)
    args = ["fit", "--samples", str(path), "--gpu", "H100-SXM", "--model", "bert", "--out", "-"]
    assert main(args) == 0
    params = ModelParams.from_json(capsys.readouterr().out)
    samples = read_samples_csv(path, gpu=h100)  # as the command read them
    anchored = fit_profile(samples, h100, prior=prior_on(load_prior("bert"), h100), model="bert")
    assert params == anchored and params.gpu == "H100-SXM"
    assert params != fit_profile(samples, h100, model="bert")  # the prior moves the fit
