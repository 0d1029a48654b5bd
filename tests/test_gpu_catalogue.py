"""The GPU catalogue: every type valid and cited, found by NVML name, the A100 untouched."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models_synth import TRUE, grid, sample

from powerflow.cli import main
from powerflow.core.errors import DataError
from powerflow.core.gpus import (
    A100,
    ESTIMATION_RULES,
    GPU_SPECS,
    REFERENCE_FRACTION,
    clock_range,
    estimated_spec,
    gpu_spec,
    parse_catalogue,
)
from powerflow.core.models.fitting import fit_profile
from powerflow.core.models.params import ModelParams
from powerflow.core.models.samples import write_samples_csv

DATA = resources.files("powerflow").joinpath("data")
FACTS = ("max_clock_mhz", "idle_power_w", "max_power_w", "min_power_limit_w")


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DATA.joinpath("gpus.json").read_text("utf-8"))
    return doc


def test_the_catalogue_has_the_types_clusters_run() -> None:
    wanted = {
        "V100",
        "A100",
        "A100-SXM4-80GB",
        "A100-PCIE-40GB",
        "A100-PCIE-80GB",
        "H100-SXM",
        "H100-PCIE",
        "H200",
        "L40S",
        "L4",
        "A10",
        "A40",
        "T4",
    }
    assert wanted <= set(GPU_SPECS)


def test_every_number_cites_a_listed_source_or_says_estimated() -> None:
    doc = _doc()
    readme = DATA.joinpath("README.md").read_text("utf-8")
    for key in doc["sources"]:
        assert f"`{key}`" in readme, f"{key} is not in powerflow/data/README.md"
    for entry in doc["gpus"]:
        spec = GPU_SPECS[entry["name"]]
        for fact in FACTS:
            source = entry[fact]["source"]
            assert source == "estimated" or source in doc["sources"], (entry["name"], fact)
            if source == "estimated" and fact != "max_clock_mhz":
                assert fact in spec.estimated, (entry["name"], fact)
            else:
                assert fact not in spec.estimated, (entry["name"], fact)
        # f0 and P_max have no public source for any type but the A100
        assert {"f0_mhz", "reference_power_w"} <= set(spec.estimated)
        assert spec.nvml_names, entry["name"]
    for spec in GPU_SPECS.values():
        assert set(spec.estimated) <= set(ESTIMATION_RULES)


def test_a_number_with_no_listed_source_is_refused() -> None:
    doc = _doc()
    bad = copy.deepcopy(doc)
    bad["gpus"][0]["max_power_w"]["source"] = "a forum post"
    with pytest.raises(DataError, match="not a listed source"):
        parse_catalogue(bad)
    bad = copy.deepcopy(doc)
    del bad["gpus"][0]["idle_power_w"]["source"]
    with pytest.raises(DataError, match="needs a source"):
        parse_catalogue(bad)
    bad = copy.deepcopy(doc)
    bad["gpus"][0]["max_clock_mhz"] = {"value": 1531, "source": "smi-v100-sxm2"}
    with pytest.raises(DataError, match="not 135"):
        parse_catalogue(bad)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("A100", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("a100-sxm4-40gb", "A100"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
        ("nvidia h100 80gb hbm3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIE"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Tesla V100-PCIE-16GB", "V100-PCIE"),
        ("Tesla T4", "T4"),
        (" NVIDIA L4 ", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A40", "A40"),
    ],
)
def test_types_are_found_by_short_and_nvml_names(name: str, expected: str) -> None:
    assert gpu_spec(name) is GPU_SPECS[expected]


def test_an_unknown_type_is_a_clear_error() -> None:
    with pytest.raises(DataError, match="unknown GPU type 'NVIDIA B300'; known: A10, A100"):
        gpu_spec("NVIDIA B300")


def test_the_a100_keeps_its_measured_facts() -> None:
    assert gpu_spec("A100") is A100
    assert A100.clocks_mhz == tuple(range(210, 1411, 15))
    assert (A100.default_clock_mhz, A100.f0_mhz) == (1410, 1095)
    assert (A100.idle_power_w, A100.max_power_w, A100.min_power_limit_w) == (52.5, 400.0, 100.0)
    assert A100.p_max_w == 300.1 and A100.estimated == ()


def test_the_rules_reproduce_the_a100_from_its_clocks_and_board_limit() -> None:
    """Each rule is an A100 ratio, so applied to the A100 it gives the A100 back."""
    again = estimated_spec("A100", A100.clocks_mhz, A100.max_power_w)
    assert replace(again, estimated=(), nvml_names=A100.nvml_names) == A100


def test_p_max_follows_the_board_limit_where_no_throughput_tables_exist() -> None:
    for spec in GPU_SPECS.values():
        if spec is A100:
            continue
        assert spec.p_max_w == round(REFERENCE_FRACTION * spec.max_power_w, 1)
        assert spec.idle_power_w < spec.p_max_w < spec.max_power_w
    assert GPU_SPECS["H100-SXM"].p_max_w == 525.2  # 700 W x 300.1 / 400


def test_clock_lists_round_down_as_nvml_lists_them() -> None:
    volta = clock_range(135, 1530, 7.5)
    assert volta[:3] == (135, 142, 150) and volta[-4:] == (1507, 1515, 1522, 1530)
    assert GPU_SPECS["V100"].clocks_mhz == volta
    assert GPU_SPECS["H100-SXM"].clocks_mhz == tuple(range(345, 1981, 15))
    assert GPU_SPECS["T4"].clocks_mhz == tuple(range(300, 1591, 15))
    with pytest.raises(DataError, match="not 210"):
        clock_range(210, 1400, 15)


@pytest.mark.parametrize("name", sorted(GPU_SPECS))
def test_a_sweep_on_every_type_fits(name: str) -> None:
    spec = GPU_SPECS[name]
    truth = replace(TRUE, gpu=spec.name)
    samples = sample(truth, grid(spec, clock_step=len(spec.clocks_mhz) // 6), noise=0.02, seed=1)
    params = fit_profile(samples, spec, model="synthetic")
    assert params.gpu == spec.name


@pytest.fixture(scope="module")
def h100_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic sweep over the H100's clocks (345-1980 MHz), beyond the A100's."""
    spec = GPU_SPECS["H100-SXM"]
    path = tmp_path_factory.mktemp("sweep") / "h100.csv"
    truth = replace(TRUE, gpu=spec.name)
    write_samples_csv(sample(truth, grid(spec, clock_step=6), noise=0.02, seed=4), path)
    return path


@pytest.mark.parametrize("gpu", ["H100-SXM", "NVIDIA H100 80GB HBM3"])
def test_fit_on_an_h100_sweep(h100_sweep: Path, tmp_path: Path, gpu: str) -> None:
    out = tmp_path / "p.json"
    assert main(["fit", "--samples", str(h100_sweep), "--gpu", gpu, "--out", str(out)]) == 0
    assert ModelParams.from_json(out.read_text()).gpu == "H100-SXM"


def test_an_h100_sweep_is_outside_the_a100s_clocks(
    h100_sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit", "--samples", str(h100_sweep), "--gpu", "A100"]) == 2
    assert "outside the A100's clocks (210-1410 MHz)" in capsys.readouterr().err


def test_an_unknown_type_takes_its_clocks_from_the_samples(
    h100_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    args = ["fit", "--samples", str(h100_sweep), "--gpu", "B300", "--out", str(out), "--json"]
    assert main([*args, "--clocks-from-samples"]) == 0
    captured = capsys.readouterr()
    assert ModelParams.from_json(out.read_text()).gpu == "B300"
    clocks = sorted(
        {int(f) for f in np.unique(np.loadtxt(h100_sweep, delimiter=",", skiprows=1, usecols=3))}
    )
    assert f"{len(clocks)} clocks from the samples ({clocks[0]}-{clocks[-1]} MHz)" in captured.err
    assert "estimated: idle_power_w" in captured.err
    assert json.loads(captured.out)["models"]["h100"]["throughput_mape"] < 0.05


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpu", "B300"], "unknown GPU type 'B300'.*--clocks-from-samples"),
        (["--gpu", "H200", "--clocks-from-samples"], "H200 is in the catalogue"),
    ],
)
def test_clocks_from_samples_is_for_unknown_types_only(
    h100_sweep: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["fit", "--samples", str(h100_sweep), "--out", "-", *extra]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(AssertionError):
        raise AssertionError  # placeholder replaced below
