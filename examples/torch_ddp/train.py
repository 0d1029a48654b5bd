"""A tiny data-parallel training job that tells PowerFlow its iteration boundaries.

The operator runs one worker pod per GPU and sets the rendezvous env
(``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``LOCAL_BATCH_SIZE``, ``POWERFLOW_ITERATIONS``, ...), so each pod starts
torchrun with one process::

    torchrun --nnodes="$WORLD_SIZE" --node-rank="$RANK" --nproc-per-node=1 \\
        --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \\
        examples/torch_ddp/train.py --checkpoint /ckpt/model.pt

On CPU (no GPU, ``gloo``), two processes on one machine::

    torchrun --nnodes=1 --nproc-per-node=2 examples/torch_ddp/train.py --iterations 200

``powerflow.worker.Worker`` does two things here: ``step()`` reports each
iteration boundary and the count so far to the node agent (fire and forget;
the agent passes the count on to the operator as the job's progress), and
SIGTERM (a rescale, a preemption)
saves a checkpoint at the next boundary, from which a restarted worker
resumes (``start_iteration``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from powerflow.worker import Worker
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--iterations", type=int, default=int(os.environ.get("POWERFLOW_ITERATIONS", "100"))
    )
    parser.add_argument(
        "--batch-size", type=int, default=int(os.environ.get("LOCAL_BATCH_SIZE", "32"))
    )
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint.pt"))
    parser.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
    args = parser.parse_args()

    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)  # the same initial weights on every rank
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = DistributedDataParallel(net.to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    start = 0
    if args.checkpoint.exists():
        state = torch.load(args.checkpoint, map_location=device)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["iteration"])

    def save() -> None:
        if rank == 0:  # the weights are the same everywhere; one copy is enough
            state = {
                "model": net.state_dict(),
                "optimizer": optimizer.state_dict(),
                "iteration": worker.iterations,
            }
            torch.save(state, args.checkpoint)

    worker = Worker(checkpoint=save, start_iteration=start)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    loss = torch.zeros(())
    with worker:
        while worker.iterations < args.iterations:
            with worker.step():
                x = torch.randn(args.batch_size, 16, generator=data).to(device)
                y = x.sum(dim=1, keepdim=True)
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        save()
    print(f"rank {rank}: {worker.iterations} iterations, loss {loss.item():.4f}", flush=True)
    # Every rank reaches the end before any tears the group down: a rank that destroys
    # it while its peer is still on its way out can hang there, on a loaded machine for
    # minutes after its last iteration (pytorch/pytorch#75097).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
