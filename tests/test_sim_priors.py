"""Fitted runs start from priors that never saw their own model's reference profile.

The shipped priors are fitted to the reference profiles the simulator's ground
truth is built from. A fitted run's default (``held-out``) must learn nothing
from the job's own model's prior; the recurring-job case (``recurring``) starts
from it on purpose and is reported apart.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from powerflow.cli import main
from powerflow.core.models import priors as priors_module
from powerflow.core.models.params import ModelParams
from powerflow.core.models.priors import generic_prior, held_out_prior, load_prior, shipped_priors
from powerflow.lab.sim.config import SimConfig
from powerflow.lab.sim.metrics import summarise
from powerflow.lab.sim.priors import HELD_OUT, RECURRING, main_run, run_name
from powerflow.lab.sim.runner import RunSpec, TraceSpec, simulate

HEADER = "job_id,submit_time,num_gpu,duration,model_name,global_batch_size,num_iteration,cluster\n"
ONE_MODEL = (
    "a,0,1,0,resnet50,128,3000,c\n"
    "b,30,2,0,resnet50,256,2000,c\n"
    "c,60,4,0,resnet50,128,4000,c\n"
    "d,400,1,0,resnet50,256,3000,c\n"
)


@pytest.fixture
def one_model(tmp_path: Path) -> Path:
    path = tmp_path / "resnet50.csv"
    path.write_text(HEADER + ONE_MODEL)
    return path


def _vectors(p: ModelParams) -> np.ndarray:
    return np.concatenate([p.throughput.to_vector(), p.energy.to_vector()])


def test_the_held_out_prior_is_the_other_models_median() -> None:
    names = sorted(shipped_priors())
    assert len(names) >= 3
    for name in names:
        held = held_out_prior(name)
        assert np.array_equal(_vectors(held), _vectors(generic_prior(exclude=name)))
        assert not np.array_equal(_vectors(held), _vectors(load_prior(name)))
        # the hint is read as the operator reads it: case and blanks do not matter
        assert np.array_equal(_vectors(held_out_prior(f"  {name.upper()} ")), _vectors(held))
    # a model with no shipped prior, or none named, gets the median of them all
    assert np.array_equal(_vectors(held_out_prior("a-new-model")), _vectors(generic_prior()))
    assert np.array_equal(_vectors(held_out_prior(None)), _vectors(generic_prior()))


def _spoiled(name: str) -> dict[str, ModelParams]:
    """The shipped priors with ``name``'s own far off: 10x its synchronisation
    time, 3x its synchronisation power (what a 1-GPU pre-run cannot correct)."""
    out = dict(shipped_priors())
    own = out[name]
    throughput = dataclasses.replace(own.throughput, sync_step_s=own.throughput.sync_step_s * 10)
    energy = dataclasses.replace(own.energy, p_sync_w=own.energy.p_sync_w * 3.0)
    out[name] = dataclasses.replace(own, throughput=throughput, energy=energy)
    return out


def _run(trace: Path, priors: str) -> dict[str, float]:
    config = SimConfig(nodes=1, gpus_per_node=4, interval_s=300.0)
    result = summarise(
        simulate(RunSpec("powerflow", 0.6, TraceSpec(str(trace)), config, priors=priors))
    )
    return {k: result[k] for k in ("avg_jct_s", "total_energy_j", "makespan_s")}


def test_a_fitted_run_learns_nothing_from_its_jobs_own_prior(
    one_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every job is a ResNet-50: spoiling ResNet-50's own prior leaves the default
    run unchanged to the last bit, and moves the recurring-job run."""
    held, recurring = _run(one_model, HELD_OUT), _run(one_model, RECURRING)
    spoiled = _spoiled("resnet50")
    monkeypatch.setattr(priors_module, "shipped_priors", lambda: spoiled)
    assert _run(one_model, HELD_OUT) == held
    assert _run(one_model, RECURRING) != recurring


def test_the_main_comparison_leaves_the_recurring_and_oracle_runs_out() -> None:
    base = {"scheduler": "powerflow", "eta": 0.6, "oracle": False}
    assert main_run({**base, "priors": HELD_OUT}) and main_run({**base, "scheduler": "afs"})
    assert not main_run({**base, "priors": RECURRING})
    assert not main_run({**base, "oracle": True})
    assert not main_run({**base, "priors": HELD_OUT, "tag": "interval=300"})
    assert run_name({**base, "priors": RECURRING}) == "powerflow (recurring)"
    assert run_name({**base, "oracle": True}) == "powerflow (oracle)"
    assert run_name({**base, "priors": HELD_OUT}) == "powerflow"


def test_a_run_spec_refuses_unknown_priors() -> None:
    with pytest.raises(Exception, match="priors 'own': expected one of held-out, recurring"):
        RunSpec("powerflow", 0.6, priors="own")


def test_priors_on_the_command_line(one_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scheduler", "powerflow", "--eta", "0.6", "--trace", str(one_model)]
    args += ["--nodes", "1", "--gpus-per-node", "4", "--json"]
    rows = {}
    for priors in ("held-out", "recurring"):
        assert main([*args, "--priors", priors]) == 0
        rows[priors] = json.loads(capsys.readouterr().out)
        assert rows[priors]["priors"] == priors
    assert main([*args]) == 0
    assert json.loads(capsys.readouterr().out)["priors"] == "held-out"  # the default
    # where the flag cannot mean anything: one clear line, exit 2
    gandiva = ["simulate", "--scheduler", "gandiva", "--frequency", "1410"]
    gandiva += ["--trace", str(one_model), "--nodes", "1", "--gpus-per-node", "4"]
    for argv in ([*args, "--oracle", "--priors", "recurring"], [*gandiva, "--priors", "recurring"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--priors" in err and err.count("\n") == 1


def test_the_remembered_generic_prior_is_the_median_computed_afresh() -> None:
    """``generic_prior`` is computed once per left-out model: the value handed out
    again is the one a fresh computation gives, and nothing a caller holds can change it."""
    for exclude in (None, *sorted(shipped_priors())):
        kept = generic_prior(exclude)
        assert generic_prior(exclude) is kept
        fresh = generic_prior.__wrapped__(exclude)
        assert np.array_equal(_vectors(kept), _vectors(fresh))
        assert kept == fresh
        rows = [_vectors(p) for name, p in shipped_priors().items() if name != exclude]
        assert np.array_equal(_vectors(kept), np.median(rows, axis=0))
