"""Ground truth: the "real GPUs" of this project, built from public measurements.

Pure computation over the CSVs in ``powerflow/data/profiles`` (no I/O beyond
reading them once). The simulator and every model test use it as hardware; the
performance models in ``powerflow.core.models`` are fitted to noisy samples of it.
It is deliberately NOT of the paper's form (no T_IO/T_grad/T_sync with gammas,
no piecewise-cubic P_grad): it interpolates measurements.

Recipe, for trace model M on an A100 (n GPUs, r GPUs per node, local batch bs,
core clock f; "full clock" = 1410 MHz):

1. Full-clock step time, one GPU: the table's 1-GPU column
   (``a100-throughput/M.csv``, iterations/s -> s/iteration at bs = global batch)
   interpolated log-log between its 2-3 batch sizes. Below the smallest it
   continues affinely through the two smallest points (a fixed per-iteration
   overhead ``o`` plus a per-sample cost: the GPU is under-filled at small
   batches), above the largest affinely through the two largest (compute-bound,
   linear in bs). ``o`` is 15-52 ms depending on the model.
2. Exposed synchronisation at full clock, packed (r = min(n, 8), ceil(n/8)
   nodes): at every table cell with n >= 2, the table's step time minus step 1's
   compute time at bs = gb/n. All cells come out positive (1-64% of the step;
   Pollux's T4 data shows the same range, 1-12% on one node and 19-69% across
   nodes). Between cells: bilinear in (log2 n, log2 gb) of log sync, so every
   table cell is reproduced exactly. The one empty cell (deepspeech2, gb 32,
   64 GPUs) is filled with the gb-ratio of its 32-GPU neighbours. Above the
   table's largest global batch, bigger local batches hide more of the
   all-reduce behind the backward pass: exposed sync shrinks as
   (1 + extra compute / sync) ** e, with e the Pollux T4 elasticity of sync
   time to local batch (``pollux-t4``, one intercept per (GPUs, nodes) group:
   -0.84 imagenet, -0.27 bert, -0.14 deepspeech2; clipped to [-0.5, 0], which
   keeps the step time growing with the batch). Below the smallest global
   batch it holds the edge value. n > 64 holds the 64-GPU value; 1 < n < 2
   ramps from zero.
   Nearest Pollux model: resnet50/vgg16/inception3 -> imagenet,
   bert/gpt2 -> bert, deepspeech2 -> deepspeech2.
3. Placement (r < min(n, 8), so k = ceil(n/r) nodes instead of ceil(n/8)).
   Pollux's shape: a jump when the job first leaves one node, then a weak
   dependence on how many nodes. Its T4 numbers are not transplanted: its jump
   (3-13x, PCIe vs 10 GbE) would make an 8-GPU job split over two A100 nodes
   sync slower than the table's 16-GPU job on two nodes, and its node
   elasticity is slightly negative (-0.05 to -0.24: four T4s share one NIC, an
   A100 node has one InfiniBand NIC per GPU). Instead, on A100:
   - n > 8: sync x (k / ceil(n/8)) ** e, where e is the growth of sync along
     the table's own multi-node diagonal at a fixed local batch (16->32->64 GPUs
     at gb->2gb), median per model, clipped to [0.05, 1] (0.15-0.43);
   - n <= 8 split over k >= 2 nodes: the table's two-node sync (16 GPUs, same
     bs) scaled to n GPUs by ring all-reduce traffic 2(n-1)/n, at least 1.1x the
     one-node sync (crossing a node never helps), times (k/2) ** e.
4. Frequency (``perseus-a100-frequency``, see ``frequency``): the iteration
   splits into a GPU-heavy part (per-sample compute, step 1 minus ``o``) whose
   time scales with the measured relative compute time tau(f), and a GPU-light
   part (``o`` plus exposed sync) of which only 15% follows tau(f) (assumption:
   the all-reduce is bound by link bandwidth, the overhead by the host and
   memory). Below 855 MHz, tau continues as a compute-bound share (0.94, the
   measured elasticity below the knee) going as 1/f.
5. Power per GPU: idle (A100 README table: 52.5 W) plus a dynamic part that
   follows the measured relative dynamic power rho(f) (Perseus power minus idle,
   relative to 1410 MHz; linear in f below 855 MHz: flat voltage).
   Heavy phases draw ``P_act`` at full clock: the Zeus power-limit sweeps'
   average power at each GPU's top limit over that limit, median over batch
   sizes then over V100/A40/P100/RTX6000, times the A100's 400 W (nearest Zeus
   network: CNNs -> resnet50 0.845, transformers -> bert_base_uncased 0.896,
   deepspeech2 -> deepspeech2 0.636). Light phases draw ``P_light`` the same way
   from Zeus's ncf (a recommender that leaves the GPU mostly waiting: 0.204,
   82 W), so synchronisation draws less than compute and average power rises
   sublinearly with the local batch. Power stays in [idle, 400 W].
6. Energy per iteration = n x (P_heavy(f) x heavy time + P_light(f) x light
   time). At full clock, packed, bs = gb/n, the step time is the table's.
   Energy has an interior minimum over f (near the 1095 MHz voltage knee):
   below it the idle power integrates over longer steps, above it voltage rises.

H100 SXM (``H100-SXM``; SYNTHETIC: no public table measures these models on
it). The same recipe on the A100's data, changed in three places:

- Full clock: every step time of the A100 table divided by one public
  training-throughput ratio, 1.85 (``truth.H100_SXM_SPEEDUP``: MLPerf Training
  v3.0 ResNet-50, two Dell systems alike but for the GPUs, 16 x A100-SXM-80GB
  in 14.4 min against 16 x H100-SXM5-80GB in 7.8 min). So compute, the fixed
  overhead and the exposed sync all shrink by the same factor, and placement,
  batch and GPU-count shapes are the A100's. One ratio for every model: the
  source gives no like-for-like pair for the others without FP8.
- Frequency: the A100's curves at the same fraction of the top clock (1980
  MHz), so the knee moves to 1095/1410 of it (1538 MHz; the catalogue's f0 is
  1545) and energy is least at the A100's best relative clock (see
  ``frequency``; ``tests/test_groundtruth_h100.py`` checks both).
- Power: the catalogue's H100 idle (75 W) and board limit (700 W) with the
  same Zeus ratios (heavy phases 0.636-0.896, light 0.204 of 700 W).

The A100's P_max rule (``reference_power_w``) on this truth gives 525.2 W,
the catalogue's estimate (board limit x 300.1/400): both are the A100's
ratio, as the synthetic powers are the board limit times the A100's ratios,
so the agreement checks the arithmetic, not the hardware.
"""

from __future__ import annotations

from powerflow.core.gpus import A100, GpuSpec
from powerflow.lab.groundtruth.built import MODEL_NAMES, ground_truth
from powerflow.lab.groundtruth.measure import (
    dense_configs,
    dense_profile,
    measure,
    one_gpu_sweep,
    sweep_plan,
)
from powerflow.lab.groundtruth.tracecheck import DurationError, trace_duration_error
from powerflow.lab.groundtruth.truth import GroundTruth


def reference_power_w(gpu: GpuSpec = A100) -> float:
    """The per-GPU power a budget's ``eta`` is a fraction of (``GpuSpec.reference_power_w``).

    The mean over the reference workloads (``MODEL_NAMES``) of each one's
    mean per-GPU power on one GPU at the top clock over its throughput
    table's global batch sizes: what a typical training job draws at full
    speed, from measured data only, so that it depends on neither a
    scheduler's models nor the jobs queued. One GPU, because that is where
    every table has a column and no synchronisation dilutes the power.
    """
    means = []
    for name in MODEL_NAMES:
        truth = ground_truth(name, gpu)
        top = gpu.max_clock_mhz
        powers = [float(truth.power_w(1, 1, gb, top)) for gb in truth.global_batch_sizes]
        means.append(sum(powers) / len(powers))
    return sum(means) / len(means)


__all__ = [
    "MODEL_NAMES",
    "DurationError",
    "GroundTruth",
    "dense_configs",
    "dense_profile",
    "ground_truth",
    "measure",
    "one_gpu_sweep",
    "reference_power_w",
    "sweep_plan",
    "trace_duration_error",
]
