"""The H100 SXM's synthetic ground truth, and the A100's left exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest

from powerflow.core.errors import DataError
from powerflow.core.gpus import A100, gpu_spec
from powerflow.lab.groundtruth import MODEL_NAMES, ground_truth, reference_power_w
from powerflow.lab.groundtruth.frequency import frequency_curves, voltage_knee_mhz
from powerflow.lab.groundtruth.truth import H100_SXM_SPEEDUP, THROUGHPUT_SOURCES, build

H100 = gpu_spec("H100-SXM")
H100_CLOCKS = np.array(H100.clocks_mhz, dtype=np.float64)

# (n, r, local batch, MHz) and each model's step time (s) and energy (J) there,
# printed by the A100 ground truth before the H100's was added (repr: exact).
CONFIGS = ((1, 1, 32.0, 1410.0), (8, 8, 16.0, 1095.0), (16, 4, 64.0, 900.0), (3, 2, 7.0, 600.0))
A100_VALUES = {
    "resnet50": (
        (0.082417874733607, 0.06776442344427153, 0.21015067158177553, 0.06448006822113753),
        (23.057200001720105, 80.55482188167704, 559.9917788799534, 18.67321489128763),
    ),
    "vgg16": (
        (0.1063598141670227, 0.0837402216040243, 0.28807827400217434, 0.07339839390024304),
        (32.14197671282018, 108.25780539634549, 789.9855306845958, 23.291260557500422),
    ),
    "inception3": (
        (0.1160243034362793, 0.10274172576862856, 0.3040699709910245, 0.09748603313345516),
        (32.8991873444507, 118.6030730518606, 806.1251187344106, 27.7053177336224),
    ),
    "gpt2": (
        (0.056390445364846165, 0.05737681025549244, 0.12120831738872218, 0.05860799580329625),
        (12.027892690516405, 51.207635324050194, 281.5671247422167, 13.873800895527436),
    ),
    "bert": (
        (0.10886588034573252, 0.10795800545284452, 0.24121246764465984, 0.10996385272595828),
        (24.658940822476886, 101.13581223524588, 581.0396806276748, 26.800202396617248),
    ),
    "deepspeech2": (
        (0.33077995634078977, 0.2356750957898912, 0.9106622208012448, 0.204212216578729),
        (77.86981257729003, 264.42458154189865, 2013.4279499064355, 58.783898889311345),
    ),
}


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_the_a100_truth_is_bit_for_bit_what_it_was(model: str) -> None:
    n, r, bs, f = (np.array(c) for c in zip(*CONFIGS, strict=True))
    step, energy = ground_truth(model).step_and_energy(n, r, bs, f)
    assert tuple(float(x) for x in step) == A100_VALUES[model][0]
    assert tuple(float(x) for x in energy) == A100_VALUES[model][1]


def test_the_a100_reference_power_is_unchanged() -> None:
    assert reference_power_w(A100) == pytest.approx(300.0934010039266, rel=0, abs=1e-9)


def test_the_speedup_is_the_cited_mlperf_pair() -> None:
    """ResNet-50, 16 GPUs each: 14.4 min on A100 SXM, 7.8 min on H100 SXM."""
    assert pytest.approx(1.846, abs=1e-3) == H100_SXM_SPEEDUP
    assert THROUGHPUT_SOURCES["H100-SXM"].synthetic
    assert not THROUGHPUT_SOURCES["A100"].synthetic


@pytest.mark.parametrize("model", MODEL_NAMES)
@pytest.mark.parametrize(("n", "r", "bs"), [(1, 1, 32), (8, 8, 16), (16, 8, 8), (64, 8, 4)])
def test_full_clock_step_is_the_a100s_divided_by_the_cited_ratio(
    model: str, n: int, r: int, bs: int
) -> None:
    a100 = ground_truth(model).step_time_s(n, r, bs, A100.max_clock_mhz)
    h100 = ground_truth(model, H100).step_time_s(n, r, bs, H100.max_clock_mhz)
    assert a100 / h100 == pytest.approx(H100_SXM_SPEEDUP, rel=1e-12)


@pytest.mark.parametrize("model", MODEL_NAMES)
@pytest.mark.parametrize(("n", "r", "bs"), [(1, 1, 64), (8, 8, 32), (32, 8, 16)])
def test_energy_minimum_lies_inside_the_h100_clock_range(
    model: str, n: int, r: int, bs: int
) -> None:
    energy = ground_truth(model, H100).energy_per_iter_j(n, r, bs, H100_CLOCKS)
    best = int(np.argmin(energy))
    assert 0 < best < len(H100_CLOCKS) - 1
    # at the A100's minimum scaled by relative clock, within a few 15 MHz steps
    a100_energy = ground_truth(model).energy_per_iter_j(n, r, bs, np.array(A100.clocks_mhz))
    a100_best = A100.clocks_mhz[int(np.argmin(a100_energy))]
    scaled = a100_best * H100.max_clock_mhz / A100.max_clock_mhz
    assert abs(H100_CLOCKS[best] - scaled) <= 3 * 15


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_power_per_gpu_lies_between_idle_and_the_board_limit(model: str) -> None:
    truth = ground_truth(model, H100)
    for n, r, bs in [(1, 1, 1), (1, 1, 512), (8, 8, 32), (16, 2, 8), (64, 8, 64)]:
        per_gpu = truth.power_w(n, r, bs, H100_CLOCKS) / n
        assert np.all(per_gpu >= H100.idle_power_w)
        assert np.all(per_gpu <= H100.max_power_w)
    # and a full-speed job draws well above the A100's board limit
    assert float(truth.power_w(1, 1, 256, H100.max_clock_mhz)) > A100.max_power_w


def test_clock_curves_are_the_a100s_at_the_same_relative_clock() -> None:
    a100, h100 = frequency_curves(A100), frequency_curves(H100)
    rel = np.linspace(0.2, 1.0, 41)
    np.testing.assert_allclose(
        h100.time_factor(rel * H100.max_clock_mhz), a100.time_factor(rel * A100.max_clock_mhz)
    )
    np.testing.assert_allclose(
        h100.dynamic_power_factor(rel * H100.max_clock_mhz),
        a100.dynamic_power_factor(rel * A100.max_clock_mhz),
    )
    assert h100.time_factor(H100.max_clock_mhz) == pytest.approx(1.0)


def test_the_knee_is_at_the_a100s_fraction_of_the_top_clock() -> None:
    assert voltage_knee_mhz(H100) == round(1095 * 1980 / 1410)
    # the catalogue's estimated f0 is the supported clock nearest to it
    assert abs(H100.f0_mhz - voltage_knee_mhz(H100)) <= 7.5


def test_the_catalogue_p_max_agrees_with_the_a100s_rule_on_the_h100_truth() -> None:
    """Both are the A100's 300.1 W per 400 W of board limit: the synthetic truth's
    powers are the board limit times the A100's ratios, so the rule adds no news."""
    assert H100.reference_power_w == pytest.approx(reference_power_w(H100), abs=0.05)


def test_a_type_without_truth_is_refused_naming_those_with_one() -> None:
    with pytest.raises(DataError, match=r"no ground truth for GPU type 'L4'.*A100, H100-SXM"):
        build("resnet50", gpu_spec("L4"))
