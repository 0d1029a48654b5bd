"""PowerFlow's components, started as a user starts them.

The operator and the extender run as their own processes, ``python -m powerflow
operator|extender --kubeconfig FILE ...``: the command a user runs, with the
product's defaults (the PowerFlow policy, the shipped priors, online refits)
and nothing of the twin inside them. Processes, so that a fault test can kill
one (``signal``) and start it again. Their logs go to files in the twin's folder.

The node agents run as processes too, one per node, through
``powerflow.commands.nodeagent.serve`` (what ``powerflow nodeagent`` runs): their
GPUs are the twin's (``TwinGpus``, which the workers drive in this process), served
to them over a local socket in place of NVML (``agentproc``), so that a test can
SIGKILL an agent and nothing of it runs.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from powerflow.lab.twin.agentproc import GpuServer
from powerflow.lab.twin.gpus import TwinGpus
from powerflow.lab.twin.kubelet import PROGRESS_INTERVAL_S
from powerflow.lab.twin.ports import free_port
from powerflow.lab.twin.timescale import (
    PROFILE_WINDOW_S,
    SAMPLE_WINDOW_S,
    TimeScale,
)
from powerflow.nodeagent.iterations import READY_PATH


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the twin's process ends (Linux
    ``PR_SET_PDEATHSIG``), so that a twin killed mid-run leaves no operator behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _environment() -> dict[str, str]:
    """This environment without anything pointing at a real cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.pop("KUBECONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Process:
    """``python -m MODULE ARGS`` (``powerflow ARGS``) in a child process; ``ready`` is an
    HTTP URL that answers once it serves."""

    def __init__(
        self, name: str, args: list[str], ready: str, log: Path, module: str = "powerflow"
    ) -> None:
        self.name, self.args, self.ready, self.log = name, args, ready, log
        self.module = module
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self.starts = 0

    def start(self, timeout_s: float = 120.0) -> Process:
        """Launch, then wait until ``ready`` answers (``timeout_s``)."""
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> Process:
        """Start the process without waiting for it to serve (a fault test kills it at
        any moment of its life, its start-up included)."""
        if self._out is not None:
            self._out.close()
        self._out = self.log.open("ab")
        argv = [sys.executable, "-m", self.module, *self.args]
        self.proc = subprocess.Popen(
            argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=_environment(),
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.starts += 1
        return self

    def wait_ready(self, timeout_s: float = 120.0) -> Process:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(self.ready, timeout=1.0).status_code < 500:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not become ready in {timeout_s:g} s: {self.tail()}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit status."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self._out is not None:
            self._out.close()
        return self.proc.returncode

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def apiserver_process(
    folder: Path,
    port: int,
    tokens: list[dict[str, Any]],
    *,
    toleration_s: int | None = None,
    fault_control: bool = False,
    enforce_rbac: bool = False,
    extended_resource_toleration: bool = False,
) -> Process:
    """The emulated API server in a process of its own (``apiserver``), knowing ``tokens``;
    bound pods wait for their kubelet's delete (the twin has kubelets), with
    ``toleration_s`` pods get the ``DefaultTolerationSeconds`` admission's tolerations,
    ``fault_control`` opens its fault routes (``apiserver.FaultControl``), and
    ``enforce_rbac`` authorizes ServiceAccounts' requests by the RBAC objects it holds,
    ``extended_resource_toleration`` turns that admission plugin on."""
    path = folder / "tokens.json"
    path.write_text(json.dumps(tokens))
    args = ["--port", str(port), "--tokens", str(path), "--kubelets"]
    if toleration_s is not None:
        args += ["--default-toleration-seconds", str(toleration_s)]
    args += ["--fault-control"] if fault_control else []
    args += ["--enforce-rbac"] if enforce_rbac else []
    args += ["--extended-resource-toleration"] if extended_resource_toleration else []
    ready = f"http://127.0.0.1:{port}/api/v1/nodes"
    return Process(
        "apiserver", args, ready, folder / "apiserver.log", "powerflow.lab.twin.apiserver"
    )


def operator_process(
    kubeconfig: Path, folder: Path, ingest_port: int, *, scale: TimeScale
) -> Process:
    """``powerflow operator`` with its durations on the twin's time scale.

    Every port is explicit and from ``free_port``: with ``--metrics-port 0`` the
    operator's metrics server once took, from the kernel, the very port just chosen for
    its ingest (released a moment before), and the operator exited on the ingest's
    bind; ``free_port`` returns none the kernel hands out, nor one twice in a row
    (unless the kernel leaves no room outside its range: ``powerflow.lab.twin.ports``)."""
    live = free_port()
    metrics = free_port()
    args = [
        "operator",
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-port",
        str(metrics),
        "--liveness",
        f"http://127.0.0.1:{live}/healthz",
        "--ingest-host",
        "127.0.0.1",
        "--ingest-port",
        str(ingest_port),
        "--profiling-window",
        f"{scale(PROFILE_WINDOW_S):g}",
        "--progress-interval",
        f"{PROGRESS_INTERVAL_S:g}",
        # A lease of 60 s, not 15: a pass's first policy call compiles its kernels
        # (numba) for seconds of CPU, and on a loaded 2-core machine renewals then came
        # late enough that the operator stepped down every few seconds.
        "--lease-duration",
        "60",
        # One replica under a stable name (a StatefulSet's pod name): an operator started
        # again after a kill takes its own Lease back at once, where a new name would wait
        # out a SIGKILLed leader's 60 s (tests/test_twin_faults.py kills it 4 times).
        "--leader-identity",
        "twin-operator",
    ]
    return Process("operator", args, f"http://127.0.0.1:{live}/healthz", folder / "operator.log")


def extender_process(kubeconfig: Path, folder: Path, port: int) -> Process:
    """``powerflow extender`` on ``port`` (the scheduler's ``urlPrefix``)."""
    args = ["extender", "--kubeconfig", str(kubeconfig), "--port", str(port)]
    args += ["--log-level", "warning"]
    return Process("extender", args, f"http://127.0.0.1:{port}/healthz", folder / "extender.log")


class Agent:
    """One node's ``powerflow nodeagent`` in a process of its own (``agentproc``: a kill
    is a kill), on the twin's GPUs served by ``gpu_server``. ``stop`` sends SIGTERM (the
    agent restores the GPUs' defaults and exits), ``kill`` SIGKILL (nothing runs: the
    GPUs keep what it set); ``start`` again brings up a new agent on the same port."""

    def __init__(
        self,
        node: str,
        gpus: TwinGpus,
        kubeconfig: Path,
        *,
        scale: TimeScale,
        ingest_url: str,
        token_file: Path,
        gpu_server: GpuServer,
        folder: Path,
    ) -> None:
        self.node, self.gpus = node, gpus
        self.port = free_port()
        argv = ["--gpus", gpu_server.address, "--key-file", str(gpu_server.key_file), "--"]
        argv += ["--kubeconfig", str(kubeconfig), "--node-name", node]
        argv += ["--metrics-port", "0", "--worker-host", "127.0.0.1"]
        argv += ["--worker-port", str(self.port)]
        argv += ["--pod-resources-socket", "/nonexistent/pod-resources/kubelet.sock"]
        argv += ["--ingest-url", ingest_url, "--token-file", str(token_file)]
        argv += ["--window", f"{scale(SAMPLE_WINDOW_S):g}"]
        self.process = Process(
            f"agent-{node}",
            argv,
            f"http://127.0.0.1:{self.port}{READY_PATH}",
            folder / f"agent-{node}.log",
            "powerflow.lab.twin.agentproc",
        )

    def start(self, timeout_s: float = 120.0) -> Agent:
        """Launch and wait until it is ready, as the chart's readiness probe asks: its first
        pass has applied the node's settings (after it restored the GPUs' defaults, as
        every agent does at start)."""
        self.process.start(timeout_s)
        return self

    def stop(self) -> None:
        """SIGTERM, as the kubelet stops the pod: the agent restores the defaults."""
        self.process.stop()

    def kill(self) -> None:
        """SIGKILL: the agent ends at once, running nothing (module docstring)."""
        proc = self.process.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)
