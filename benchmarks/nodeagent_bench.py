"""The node agent: its CPU at 1 Hz on 8 simulated GPUs with 8 pods, and how soon a clock
annotation change reaches the GPU.

Targets: under 1 % of one core; clock applied within 1 s of the
annotation change. Both against the emulated API server
(``tests/support/kube_emulator.py``, real HTTP):

- CPU: ``powerflow nodeagent --simulate 8`` in a process of its own (metrics
  on, a pass and a metrics sample every second, each simulated GPU running its
  pod's ground truth), its user+system CPU time from ``/proc`` over a steady
  stretch after start-up, divided by the stretch's wall time;
- reaction: the agent through ``serve`` in a thread, the pod's annotation
  patched, the time until the simulated GPU's lock changes (polled each ms).

    python -m benchmarks.nodeagent_bench [--seconds 20] [--reactions 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

TESTS = Path(__file__).resolve().parent.parent / "tests"
GPUS = 8


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (``/proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(seconds: float, reactions: int) -> tuple[float, list[float]]:
    sys.path.insert(0, str(TESTS))
    import httpx
    from kmock._internal import apps
    from support.kube_emulator import KubeEmulator
    from support.nodeagent_harness import (
        NODE,
        PODS,
        NodeAgent,
        RecordingGpus,
        agent_args,
        worker_pod,
    )
    from support.operator_harness import free_port, write_kubeconfig

    async with KubeEmulator() as emulator, apps.Server(emulator):
        emulator.load_builtins()
        async with httpx.AsyncClient(base_url=str(emulator.url)) as api:
            await api.post("/api/v1/nodes", json={"metadata": {"name": NODE}})
            for i in range(GPUS):
                body = worker_pod(f"w{i}", i, job=f"j{i}", frequency_mhz="1200", model="resnet50")
                assert (await api.post(PODS, json=body)).status_code == 201
            kubeconfig = write_kubeconfig(Path(tempfile.mkdtemp()) / "kc", str(emulator.url))

            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "powerflow", "nodeagent", "--kubeconfig", str(kubeconfig)),
                *("--node-name", NODE, "--simulate", str(GPUS), "--worker-port", "0"),
                *("--metrics-port", str(free_port())),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                await asyncio.sleep(5.0)  # start-up (imports, first passes) is not steady
                cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
                await asyncio.sleep(seconds)
                share = (_cpu_s(proc.pid) - cpu0) / (time.monotonic() - t0)
            finally:
                proc.terminate()
                await proc.wait()

            gpus = RecordingGpus(GPUS, clock=time.monotonic)
            latencies: list[float] = []
            async with NodeAgent(agent_args(kubeconfig, "--simulate", str(GPUS)), gpus):
                while gpus.locked(0) != 1200:
                    await asyncio.sleep(0.01)
                for r in range(reactions):
                    await asyncio.sleep(0.3)  # between passes, as a change arrives
                    clock = 1005 if r % 2 == 0 else 1200
                    patch = {
                        "metadata": {"annotations": {"powerflow.io/frequency-mhz": str(clock)}}
                    }
                    start = time.perf_counter()
                    await api.patch(
                        f"{PODS}/w0",
                        json=patch,
                        headers={"Content-Type": "application/merge-patch+json"},
                    )
                    while gpus.locked(0) != clock:
                        await asyncio.sleep(0.001)
                    latencies.append(time.perf_counter() - start)
    return share, latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--reactions", type=int, default=10)
    args = parser.parse_args(argv)
    share, latencies = asyncio.run(measure(args.seconds, args.reactions))
    table = Table(title=f"node agent: {GPUS} simulated A100s, {GPUS} pods, 1 Hz")
    for col in ("measure", "n", "median", "max", "target"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    table.add_row(
        f"CPU, % of one core (process, {args.seconds:g} s steady)",
        "1",
        f"{100 * share:.2f}",
        "",
        "1",
    )
    if latencies:
        ms = np.asarray(latencies) * 1e3
        table.add_row(
            "annotation patched -> clock locked, ms",
            str(len(ms)),
            f"{np.median(ms):.1f}",
            f"{ms.max():.1f}",
            "1000",
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
