"""``powerflow fit``: fit the performance models and report their accuracy.

Modes (see README "Performance models"):

* no ``--samples``: every ground-truth model, fitted on a seeded 90% of its
  dense profile, MAPE on the other 10% (paper Table 2); ``--plot DIR`` also
  draws measured points against fitted curves (paper Figs 3 and 5);
  ``--write-priors [DIR]`` fits each model on its whole profile and writes the
  priors the operator starts new jobs from.
* ``--samples FILE.csv``: fit measured samples and write the parameters
  JSON (to ``--out``, default ``FILE.params.json`` beside the CSV, ``-`` for
  stdout); with ``--json`` also the held-out MAPE of a seeded 90/10 split.
  The fit is anchored to the prior of ``--model`` (generic without one) carried
  over to ``--gpu`` by relative clock, as the operator's online learner anchors
  a job on that type.
  ``--gpu`` names a catalogue type (short or NVML name); a type not in the
  catalogue needs ``--clocks-from-samples``: its clocks are the samples'
  frequencies, its board limit the highest per-GPU power in them, and the
  rest (f0 among them) is estimated by ``powerflow.core.gpus``'s rules.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from powerflow.commands import checks
from powerflow.core.errors import DataError, ModelError
from powerflow.core.gpus import ESTIMATION_RULES, GPU_SPECS, GpuSpec, estimated_spec, gpu_spec
from powerflow.core.models.fitted import FittedModel
from powerflow.core.models.fitting import MIN_SAMPLES, FitOptions, fit_profile
from powerflow.core.models.metrics import Accuracy, accuracy, split
from powerflow.core.models.params import ModelParams
from powerflow.core.models.priors import load_prior, prior_on, priors_path, write_prior
from powerflow.core.models.samples import Samples, read_samples_csv


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fit",
        help="fit the throughput and energy models, report held-out MAPE",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("--samples", type=Path, metavar="FILE.csv", help="fit measured samples")
    p.add_argument(
        "--gpu",
        default="A100",
        help="GPU type of the samples, short or NVML name (default A100)",
    )
    p.add_argument(
        "--clocks-from-samples",
        action="store_true",
        help="--gpu is not in the catalogue: take its clocks from the samples, estimate the rest",
    )
    p.add_argument(
        "--out",
        metavar="PATH",
        help="parameters JSON for --samples, in a folder that exists ('-' for stdout)",
    )
    p.add_argument(
        "--model", metavar="NAME", help="DNN of --samples: picks the prior (default generic)"
    )
    p.add_argument("--plot", type=Path, metavar="DIR", help="write one PNG per model to DIR")
    p.add_argument(
        "--write-priors",
        nargs="?",
        const=priors_path(),
        type=Path,
        metavar="DIR",
        help="fit each ground-truth model's whole profile and write DIR/<model>.json "
        "(default: the package's priors)",
    )
    p.add_argument(
        "--models",
        metavar="A,B",
        help="ground-truth models to fit (comma-separated; default all)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of profiles and splits")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class _Result:
    name: str
    accuracy: Accuracy
    params: ModelParams | None


def run(args: argparse.Namespace) -> int:
    """Refuse options of the other mode and unwritable outputs, then fit."""
    if args.seed < 0:
        raise checks.ArgumentError(f"--seed must be >= 0, got {args.seed}")
    mode = "--samples" if args.samples is not None else "the ground-truth fit"
    foreign = (
        ("--plot", "--write-priors", "--models")
        if args.samples is not None
        else ("--out", "--model")
    )
    given = [o for o in foreign if getattr(args, o[2:].replace("-", "_")) is not None]
    if args.clocks_from_samples and args.samples is None:
        given.append("--clocks-from-samples")
    if given:
        raise checks.ArgumentError(f"{', '.join(given)}: not an option of {mode}")
    if args.samples is not None:
        return _run_samples(args)
    gpu = gpu_spec(args.gpu)
    if args.plot is not None:
        checks.output_folder(args.plot, "--plot")
    if args.write_priors is not None:
        checks.output_folder(args.write_priors, "--write-priors")
    return _run_ground_truth(args, gpu)


def _report(results: list[_Result], as_json: bool) -> None:
    if as_json:
        doc = {
            "models": {
                r.name: {
                    "throughput_mape": r.accuracy.throughput_mape,
                    "energy_mape": r.accuracy.energy_mape,
                }
                for r in results
            }
        }
        print(json.dumps(doc, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Held-out MAPE (fit on 90%, evaluated on 10%)")
    table.add_column("model")
    table.add_column("throughput", justify="right")
    table.add_column("energy", justify="right")
    for r in results:
        table.add_row(
            r.name,
            f"{100 * r.accuracy.throughput_mape:.1f}%",
            f"{100 * r.accuracy.energy_mape:.1f}%",
        )
    Console().print(table)


def _held_out(samples: Samples, gpu: GpuSpec, seed: int, prior: ModelParams | None) -> Accuracy:
    train, test = split(samples, seed=seed)
    params = fit_profile(train, gpu, prior=prior, options=FitOptions(seed=seed))
    return accuracy(FittedModel(params, spec=gpu), test)


def _catalogue_names() -> set[str]:
    return {n.lower() for spec in GPU_SPECS.values() for n in (spec.name, *spec.nvml_names)}


def _samples_gpu(args: argparse.Namespace, need: int) -> tuple[Samples, GpuSpec]:
    """The samples and their GPU type: the catalogue's, or one from the samples."""
    path: Path = args.samples
    if not args.clocks_from_samples:
        try:
            gpu = gpu_spec(args.gpu)
        except DataError as exc:
            raise DataError(f"{exc}; --clocks-from-samples fits a type not listed") from None
        return read_samples_csv(path, min_rows=need, gpu=gpu), gpu
    if args.gpu.strip().lower() in _catalogue_names():
        raise checks.ArgumentError(
            f"--clocks-from-samples: {args.gpu} is in the catalogue, which gives its clocks"
        )
    samples = read_samples_csv(path, min_rows=need)
    clocks = sorted({round(float(f)) for f in samples.f})
    per_gpu_w = samples.energy_j / (samples.n * samples.step_time_s)
    gpu = estimated_spec(
        args.gpu.strip(), clocks, round(float(per_gpu_w.max()), 1), estimated=("max_power_w",)
    )
    rules = "; ".join(f"{f}: {ESTIMATION_RULES[f]}" for f in gpu.estimated)
    print(
        f"{gpu.name} is not in the catalogue: {len(clocks)} clocks from the samples "
        f"({clocks[0]}-{clocks[-1]} MHz), f0 {gpu.f0_mhz} MHz; estimated: {rules}",
        file=sys.stderr,
    )
    return samples, gpu


def _run_samples(args: argparse.Namespace) -> int:
    path: Path = args.samples
    out = args.out if args.out is not None else str(path.with_suffix(".params.json"))
    if out == "-" and args.json:
        raise DataError("--json and --out - would both write to stdout; pick one")
    # A held-out MAPE needs enough rows that its 90% still meets MIN_SAMPLES.
    need = 2 * MIN_SAMPLES if args.json else MIN_SAMPLES
    samples, gpu = _samples_gpu(args, need)
    if out != "-":  # before the fit, not after it
        checks.output_file(Path(out), "--out" if args.out is not None else "--out (default)")
    prior = _prior_for(args.model, gpu)
    params = fit_profile(samples, gpu, prior=prior, model=args.model or path.stem)
    if out == "-":
        sys.stdout.write(params.to_json())
        return 0
    Path(out).write_text(params.to_json())
    print(f"wrote {out}", file=sys.stderr)
    if len(samples) >= 2 * MIN_SAMPLES:
        acc = _held_out(samples, gpu, args.seed, prior)
        _report([_Result(path.stem, acc, params)], args.json)
    return 0


def _prior_for(model: str | None, gpu: GpuSpec) -> ModelParams | None:
    """The shipped prior of ``model`` (generic without one) carried over to ``gpu`` by
    relative clock (``prior_on``; the A100's own on an A100): the anchor the operator's
    online learner fits the same type's samples with (``FittedLearner``). None without
    shipped priors (before ``--write-priors`` made them): the data alone decide."""
    try:
        prior = load_prior(model)
    except ModelError:
        return None
    return prior_on(prior, gpu)


def _run_ground_truth(args: argparse.Namespace, gpu: GpuSpec) -> int:
    from powerflow.lab import groundtruth as gt

    names = gt.MODEL_NAMES
    if args.models:
        names = tuple(m.strip() for m in args.models.split(",") if m.strip())
        if not names:
            raise DataError(f"--models names no model; known: {', '.join(gt.MODEL_NAMES)}")
        unknown = [m for m in names if m not in gt.MODEL_NAMES]
        if unknown:
            raise DataError(
                f"unknown model(s) {', '.join(unknown)}; known: {', '.join(gt.MODEL_NAMES)}"
            )
    results: list[_Result] = []
    profiles: dict[str, Samples] = {}
    for name in names:
        truth = gt.ground_truth(name, gpu=gpu)
        profile = gt.dense_profile(truth, rng=np.random.default_rng(args.seed))
        profiles[name] = profile
        acc = _held_out(profile, gpu, args.seed, None)
        if args.write_priors is not None or args.plot is not None:
            params = fit_profile(profile, gpu, options=FitOptions(seed=args.seed), model=name)
        else:
            params = None
        results.append(_Result(name, acc, params))
        if args.write_priors is not None and params is not None:
            path = write_prior(params, args.write_priors)
            print(f"wrote {path}", file=sys.stderr)
    if args.plot is not None:
        from powerflow.commands.fit_plots import plot_model

        for r in results:
            if r.params is not None:
                path = plot_model(r.name, profiles[r.name], r.params, gpu, args.plot)
                print(f"wrote {path}", file=sys.stderr)
    _report(results, args.json)
    return 0
