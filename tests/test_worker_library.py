"""The worker library against a real agent endpoint and the emulated API server.

Reports go over real HTTP to ``nodeagent.iterations.worker_app``; progress
goes through the ``kubernetes`` client to the emulator, found through a
kubeconfig as a user outside the cluster would; SIGTERM is sent to a real
child process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import powerflow.worker as pf
import pytest
from powerflow.nodeagent.iterations import IterationReport, worker_app
from powerflow.worker import EXIT_ON_SIGTERM, Worker, read_env
from support.agent_endpoint import serve_in_thread
from support.kube_emulator import KubeEmulator

from powerflow.core import contract

UID = "7e3f0b52-1d4c-4c4f-8f55-0c8a3f7f2b10"


def pod_env(port: int, **extra: str) -> dict[str, str]:
    return {
        "POWERFLOW_POD_NAME": "job-g1-w0",
        "POWERFLOW_POD_NAMESPACE": "ml",
        "POWERFLOW_POD_UID": UID,
        "POWERFLOW_AGENT_HOST": "127.0.0.1",
        "POWERFLOW_AGENT_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "2",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa-1",
        **extra,
    }


class Agent:
    """The agent's endpoint with a handler that records, and can hold a request."""

    def __init__(self) -> None:
        self.reports: list[IterationReport] = []
        self.release = threading.Event()
        self.release.set()
        self.arrived = threading.Event()

    def __call__(self, r: IterationReport) -> str | None:
        self.arrived.set()
        assert self.release.wait(30)
        self.reports.append(r)
        return None


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture
def agent() -> Iterator[tuple[Agent, int]]:
    a = Agent()
    with serve_in_thread(lambda: worker_app(a)) as url:
        yield a, int(url.rsplit(":", 1)[1])


def wait_for(check: object, what: str) -> None:
    done = threading.Event()
    for _ in range(2000):
        if check():  # type: ignore[operator]
            return
        done.wait(0.005)
    raise AssertionError(f"never happened: {what}")


def test_the_env_the_operator_sets_is_read() -> None:
    env = read_env(
        {
            **pod_env(9402),
            "POWERFLOW_JOB": "job",
            "POWERFLOW_GENERATION": "1",
            "POWERFLOW_ITERATIONS": "5000",
            "POWERFLOW_GRACE_SECONDS": "45",
            "NVIDIA_VISIBLE_DEVICES": "GPU-a, MIG-b,all,void",
        }
    )
    assert (env.pod, env.namespace, env.uid, env.agent_host) == (
        "job-g1-w0",
        "ml",
        UID,
        "127.0.0.1",
    )
    assert (env.agent_port, env.rank, env.world_size) == (9402, 0, 2)
    assert (env.job, env.generation, env.iterations_total, env.grace_s) == ("job", 1, 5000, 45.0)
    assert env.gpu_uuids == ("GPU-a", "MIG-b")
    assert env.in_pod
    junk = read_env(
        {"POWERFLOW_AGENT_PORT": "99999", "RANK": "x", "POWERFLOW_GRACE_SECONDS": "nan"}
    )
    assert (junk.agent_port, junk.rank, junk.grace_s) == (contract.AGENT_WORKER_PORT, 0, 30.0)
    assert not junk.in_pod


def test_reports_reach_the_agent_at_boundaries(agent: tuple[Agent, int]) -> None:
    a, port = agent
    with Worker(env=pod_env(port), min_interval_s=0.0) as w:
        for _ in range(30):
            with w.step():
                pass
            wait_for(lambda: not w.reporter._busy, "the report in flight to finish")  # type: ignore[union-attr]
        assert w.iterations == 30
    counts = [r.iterations for r in a.reports]
    assert counts == list(range(1, 31))  # one per boundary: none was in flight
    r = a.reports[-1]
    assert (r.namespace, r.pod, r.uid, r.gpu_uuids) == ("ml", "job-g1-w0", UID, ("GPU-aaaa-1",))


def test_reports_are_rate_bounded(agent: tuple[Agent, int]) -> None:
    a, port = agent
    w = Worker(env=pod_env(port), min_interval_s=3600.0)
    for _ in range(100):
        w.report_iteration()
    assert wait_until(lambda: len(a.reports) == 1)
    w.close()
    # the first boundary, then the last count at close (the job's progress)
    assert [r.iterations for r in a.reports] == [1, 100]
    # an explicit count (a resumed run) is what is reported and counted on from
    w = Worker(env=pod_env(port), min_interval_s=3600.0)
    w.report_iteration(500)
    w.report_iteration()
    assert wait_until(lambda: len(a.reports) == 3)
    w.close()
    assert [r.iterations for r in a.reports] == [1, 100, 500, 501]
    assert w.iterations == 501
    w.close()  # closing again sends nothing more
    assert len(a.reports) == 4


def test_a_slow_agent_never_blocks_a_step(agent: tuple[Agent, int]) -> None:
    a, port = agent
    a.release.clear()  # the agent holds the first report
    w = Worker(env=pod_env(port), min_interval_s=0.0)
    w.report_iteration()
    assert a.arrived.wait(10)
    for _ in range(200):  # these return although the first report is still in flight
        w.report_iteration()
    assert w.reporter is not None and w.reporter.dropped == 200
    a.release.set()
    w.close()
    assert [r.iterations for r in a.reports] == [1, 201]  # the dropped ones' last count


def test_an_unreachable_agent_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with serve_in_thread(lambda: worker_app(lambda r: None)) as url:
        port = int(url.rsplit(":", 1)[1])  # closed when the block ends: nobody listens
    caplog.set_level(logging.WARNING, "powerflow.worker")
    w = Worker(env=pod_env(port), min_interval_s=0.0)
    for _ in range(20):
        w.report_iteration()
        wait_for(lambda: not w.reporter._busy, "the failed post")  # type: ignore[union-attr]
    w.close()
    warnings = [r for r in caplog.records if "agent 127.0.0.1" in r.getMessage()]
    assert len(warnings) == 1
    assert w.iterations == 20


def test_outside_a_pod_it_only_counts() -> None:
    w = Worker(env={}, min_interval_s=0.0)
    w.report_iteration()
    with w.step():
        pass
    assert (w.iterations, w.reporter) == (2, None)
    w.close()


def test_the_module_level_worker(agent: tuple[Agent, int]) -> None:
    a, port = agent
    w = pf.init(env=pod_env(port), min_interval_s=3600.0)
    pf.report_iteration()
    with pf.step():
        pass
    assert w.iterations == 2
    assert wait_until(lambda: len(a.reports) == 1)
    pf.close()
    assert [r.iterations for r in a.reports] == [1, 2]


# -- progress through the API server ---------------------------------------------

pytestmark_kmock = pytest.mark.kmock(cls=KubeEmulator)


def test_the_library_never_reaches_for_the_api_server() -> None:
    """In a pod, through reports and close, it neither imports a Kubernetes client nor
    reads credentials: its progress goes through the node agent."""
    code = textwrap.dedent(
        """
        import json, sys
        from powerflow.worker import Worker
        w = Worker(env=json.loads(sys.argv[1]), min_interval_s=0.0)
        for _ in range(3):
            w.report_iteration()
        w.close()
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes", "numpy"))
        assert not heavy, heavy
        """
    )
    env = json.dumps(pod_env(1))
    done = subprocess.run(
        [sys.executable, "-c", code, env], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "credentials" not in done.stderr


# -- SIGTERM ------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys, time
    from powerflow.worker import Worker

    def checkpoint():
        open(sys.argv[1], "w").write(str(w.iterations))

    w = Worker(env={"POWERFLOW_GRACE_SECONDS": sys.argv[3]}, checkpoint=checkpoint)
    print("ready", flush=True)
    while True:
        with w.step():
            time.sleep(float(sys.argv[2]))
    """
)


def _run_child(tmp_path: Path, step_s: float, grace_s: float) -> tuple[int, Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = tmp_path / "checkpoint"
    with subprocess.Popen(
        [sys.executable, str(script), str(out), str(step_s), str(grace_s)],
        stdout=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("POWERFLOW_")},
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        proc.send_signal(signal.SIGTERM)
        return proc.wait(60), out


def test_sigterm_checkpoints_at_the_next_boundary_and_exits(tmp_path: Path) -> None:
    status, out = _run_child(tmp_path, step_s=0.01, grace_s=30)
    assert status == EXIT_ON_SIGTERM == 143
    assert out.read_text().isdigit()  # the hook ran, with the count at a boundary


def test_a_step_that_never_ends_still_exits_within_the_grace_period(tmp_path: Path) -> None:
    status, out = _run_child(tmp_path, step_s=3600, grace_s=2)
    assert status == EXIT_ON_SIGTERM
    assert not out.exists()  # no boundary came: no checkpoint from the middle of a step


def test_after_close_sigterm_is_the_default_again(tmp_path: Path) -> None:
    script = tmp_path / "closed.py"
    script.write_text(
        "import time\n"
        "from powerflow.worker import Worker\n"
        "w = Worker(env={}, checkpoint=lambda: None)\n"
        "w.close()\n"
        "print('ready', flush=True)\n"
        "time.sleep(3600)\n"
    )
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM  # no boundary will come: not held back
