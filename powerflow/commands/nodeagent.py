"""``powerflow nodeagent``: the node agent (a DaemonSet on GPU nodes).

Applies each PowerFlow pod's ``powerflow.io/frequency-mhz`` (or its
profiling sweep's clock) as locked clocks on the pod's GPUs and its
``powerflow.io/power-limit-watts`` as their power limit, within a second of a
change; resets GPUs no PowerFlow pod uses; parks idle GPUs of a node the
operator marked powered down; exports GPU power, energy and clocks for
Prometheus; serves the worker library's iteration reports and sends
per-iteration energy samples to the operator's ingest endpoint.

Default clocks and power limits are restored on every GPU at start (a
crashed agent may have left them set) and on SIGTERM/SIGINT.

Connection: ``--kubeconfig FILE``; without it the pod's service account when
running in a pod, else ``$KUBECONFIG``, else ``~/.kube/config``. GPUs:
NVML (needs the NVIDIA driver, and root or CAP_SYS_ADMIN to set clocks);
``--simulate N`` runs N simulated A100s instead (the ground truth of each
pod's model). No GPU, or no usable configuration: one line on stderr, exit 2.

``--once``: one pass (read the node's pods, apply), print what it did, exit.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import math
import os
import signal
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from powerflow.cli import LAB_CODE
from powerflow.commands.kubeconfig import add_kubeconfig_option
from powerflow.core import contract
from powerflow.core.errors import PowerFlowError
from powerflow.core.telemetry import NodePower

if TYPE_CHECKING:
    from powerflow.core.devices import GpuDevices
    from powerflow.nodeagent.agent import Agent, PodResourcesSource, TelemetryPart
    from powerflow.nodeagent.kube import AgentKube

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
ONCE_TIMEOUT_S = 30.0
log = logging.getLogger("powerflow.nodeagent")


class NodeAgentConfigError(PowerFlowError):
    """The node agent's command-line settings are unusable."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "nodeagent",
        help="run the node agent (GPU clocks, power limits, telemetry) on a GPU node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kubeconfig_option(p)
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (default: $NODE_NAME, from the downward API's spec.nodeName)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=contract.AGENT_METRICS_PORT,
        help=f"Prometheus metrics port; 0 for none (default {contract.AGENT_METRICS_PORT})",
    )
    p.add_argument(
        "--worker-host", default="0.0.0.0", help="address of the worker endpoint (0.0.0.0)"
    )
    p.add_argument(
        "--worker-port",
        type=int,
        default=contract.AGENT_WORKER_PORT,
        help=f"port of the worker library's endpoint; 0 for none "
        f"(default {contract.AGENT_WORKER_PORT})",
    )
    p.add_argument(
        "--pod-resources-socket",
        default=DEFAULT_POD_RESOURCES_SOCKET,
        metavar="PATH",
        help="the kubelet's PodResources socket: which GPUs each container holds "
        f"(default {DEFAULT_POD_RESOURCES_SOCKET})",
    )
    p.add_argument(
        "--ingest-url",
        default="",
        help="the operator's ingest endpoint, e.g. "
        f"http://powerflow-ingest.powerflow-system.svc:{contract.INGEST_PORT} (samples go "
        f"to its {contract.SAMPLES_PATH}); empty: samples are not sent",
    )
    p.add_argument(
        "--daemonset",
        default="",
        metavar="NAMESPACE/NAME",
        help="the agent's own DaemonSet: on SIGTERM, while it exists (a rolling update, a "
        "restart: another agent follows), the GPUs of PowerFlow's workers keep their "
        "clocks and power limits instead of running uncapped until the next agent's first "
        "pass; without it, or once it is gone (uninstalled), every GPU is reset",
    )
    p.add_argument(
        "--ingest-ca",
        default="",
        metavar="FILE",
        help="PEM certificates the ingest's HTTPS certificate must chain to (the chart's "
        "CA); empty: the system's",
    )
    p.add_argument(
        "--token-file",
        default="/var/run/secrets/powerflow/ingest/token",
        metavar="FILE",
        help=f"projected ServiceAccount token (audience {contract.INGEST_AUDIENCE}) "
        "presented to the ingest endpoint, re-read on every send",
    )
    p.add_argument(
        "--window",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a sample window closes at the first iteration report after this (default 5)",
    )
    p.add_argument(
        "--simulate",
        type=int,
        default=0,
        metavar="N",
        help="drive N simulated A100 GPUs instead of NVML (default 0: real GPUs)",
    )
    p.add_argument("--once", action="store_true", help="one pass: read pods, apply, print, exit")
    p.set_defaults(func=run)


def check(args: argparse.Namespace) -> None:
    """Refuse unusable settings before anything starts."""
    if not args.node_name:
        raise NodeAgentConfigError("--node-name is required (or set NODE_NAME)")
    for name in ("metrics_port", "worker_port"):
        if not 0 <= getattr(args, name) < 65536:
            raise NodeAgentConfigError(f"--{name.replace('_', '-')} is not a TCP port")
    if args.simulate < 0:
        raise NodeAgentConfigError("--simulate needs a GPU count >= 1 (0: real GPUs)")
    if args.simulate and importlib.util.find_spec(LAB_CODE) is None:
        raise NodeAgentConfigError(
            "--simulate runs the ground truth, which is part of the lab "
            f"({LAB_CODE} is not installed): pip install 'powerflow[lab]'"
        )
    if not args.window > 0:
        raise NodeAgentConfigError("--window must be > 0 s")
    if args.ingest_url:
        url = urllib.parse.urlsplit(args.ingest_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise NodeAgentConfigError(
                f"--ingest-url {args.ingest_url!r}: expected http(s)://HOST[:PORT]"
            )
    if args.daemonset and not all(daemonset(args)):
        raise NodeAgentConfigError(f"--daemonset {args.daemonset!r}: expected NAMESPACE/NAME")
    if args.ingest_ca:
        if not args.ingest_url.startswith("https://"):
            raise NodeAgentConfigError("--ingest-ca needs an https:// --ingest-url")
        try:
            ssl.create_default_context(cafile=args.ingest_ca)
        except (OSError, ssl.SSLError) as exc:
            raise NodeAgentConfigError(f"--ingest-ca {args.ingest_ca}: {exc}") from None


def daemonset(args: argparse.Namespace) -> tuple[str, str]:
    """``--daemonset NAMESPACE/NAME`` as its two parts ("" for a part that is missing)."""
    namespace, _, name = args.daemonset.partition("/")
    return (namespace, "" if "/" in name else name)


def open_devices(args: argparse.Namespace, clock: Callable[[], float]) -> GpuDevices:
    """``--simulate N`` simulated A100s, else the node's GPUs through NVML
    (``GpuUnavailable``, one line, when there are none)."""
    if args.simulate:
        from powerflow.lab.simulated_gpus import SimulatedGpus

        return SimulatedGpus(args.simulate, node=args.node_name, clock=ticks(clock, SIM_TICK_S))
    from powerflow.nodeagent.nvml import open_nvml_gpus

    return open_nvml_gpus()


SUCCESSOR_TIMEOUT_S = 5.0
"""How long a stopping agent asks whether its DaemonSet still exists (``--daemonset``)."""

SIM_TICK_S = 0.01
"""Simulated GPUs advance in steps of this: a burst of reads (one metrics sample
reads three values of every GPU) then costs one noisy draw per GPU rather than
one per read and GPU, while energy between iteration reports stays exact to 10 ms."""


def ticks(clock: Callable[[], float], step_s: float) -> Callable[[], float]:
    """``clock`` rounded down to whole ``step_s``."""

    def now() -> float:
        return math.floor(clock() / step_s) * step_s

    return now


def default_podresources(args: argparse.Namespace) -> PodResourcesSource | None:
    from powerflow.nodeagent.podresources import PodResourcesClient

    client: PodResourcesSource = PodResourcesClient(args.pod_resources_socket)
    return client


@dataclass(frozen=True)
class Parts:
    """The telemetry side of the agent: ``Telemetry`` (None: clocks follow
    ``frequency-mhz`` only), the worker endpoint's aiohttp application, the sender."""

    telemetry: TelemetryPart | None
    app: Any = None
    sender: Any = None


def default_parts(
    args: argparse.Namespace,
    devices: GpuDevices,
    clock: Callable[[], float],
    locked_clock_of: Callable[[int], int | None],
    registry: Any = None,
    ready: Callable[[], bool] = lambda: True,
) -> Parts:
    from powerflow.nodeagent.iterations import worker_app
    from powerflow.nodeagent.sender import IngestConnection, SampleSender
    from powerflow.nodeagent.telemetry import Telemetry

    sender = None
    if args.ingest_url:
        connection = IngestConnection(args.ingest_url, args.token_file, args.ingest_ca or None)
        sender = SampleSender(connection, args.node_name, registry=registry)
    telemetry = Telemetry(
        node=args.node_name,
        devices=devices,
        clock=clock,
        window_s=args.window,
        sender=sender,
        locked_clock_of=locked_clock_of,
    )
    app = None
    if args.worker_port:
        app = worker_app(telemetry.report, ready=ready)
    return Parts(telemetry, app, sender)


@dataclass(frozen=True)
class RunControl:
    """How a caller that runs the agent on a thread of its own process (a test) stops
    and watches it, where signals cannot reach: ``stop_flag`` ends the run as SIGTERM
    does, ``ready_flag`` is set after the first pass, ``on_start`` is called with the
    agent once it runs."""

    stop_flag: threading.Event | asyncio.Event | None = None
    ready_flag: threading.Event | None = None
    on_start: Callable[[Agent], None] | None = None


def serve(
    args: argparse.Namespace,
    *,
    control: RunControl | None = None,
    devices: GpuDevices | None = None,
    clock: Callable[[], float] | None = None,
    podresources: PodResourcesSource | None = None,
    parts: Callable[..., Parts] | None = None,
    out: Any = None,
) -> int:
    """Run the agent until ``control.stop_flag`` or SIGTERM/SIGINT: what ``run`` does,
    minus logging setup, so that tests start exactly this.

    Seams for tests: ``control`` (stop the agent, learn when it runs and when its
    first pass is done), ``devices`` (instead of NVML or ``--simulate``'s GPUs;
    the caller closes them), ``clock`` (what telemetry and simulated GPUs
    read; default ``time.monotonic``), ``podresources`` and ``parts`` (the
    kubelet client and the telemetry side, defaulting to the product's), ``out``
    (where ``--once`` prints; default stdout). Raises ``PowerFlowError`` for
    unusable settings before anything starts.
    """
    from powerflow.nodeagent.kube import AgentKube, load_configuration

    check(args)
    cfg = load_configuration(args.kubeconfig)
    clock = clock or time.monotonic
    owned = devices is None
    gpus = devices if devices is not None else open_devices(args, clock)
    try:
        kube = AgentKube(cfg, args.node_name)
        try:
            return asyncio.run(
                _main(
                    args,
                    kube,
                    gpus,
                    control or RunControl(),
                    clock=clock,
                    podresources=podresources
                    if podresources is not None
                    else default_podresources(args),
                    parts=parts or default_parts,
                    out=out or sys.stdout,
                )
            )
        finally:
            kube.close()
    finally:
        if owned:
            gpus.close()


async def _main(
    args: argparse.Namespace,
    kube: AgentKube,
    devices: GpuDevices,
    control: RunControl,
    *,
    clock: Callable[[], float],
    podresources: PodResourcesSource | None,
    parts: Callable[..., Parts],
    out: Any,
) -> int:
    from powerflow.nodeagent.agent import Agent, gpu_report
    from powerflow.nodeagent.metrics import GpuMetrics

    stop = asyncio.Event()
    metrics = GpuMetrics(args.node_name)
    agent = Agent(
        args.node_name,
        devices,
        post_event=kube.post_event,
        podresources=podresources,
        simulate=bool(args.simulate),
        metrics=metrics,
    )
    side = parts(
        args,
        devices,
        clock,
        agent.applier.locked_clock_mhz,
        metrics.registry,
        ready=lambda: agent.passes > 0,
    )
    if side.sender is not None:
        sender = side.sender
        agent.on_power = lambda watts: sender.set_power(NodePower(watts, time.time()))
        sender.gpu_report = gpu_report(args.node_name, agent.infos, agent.limits)
    if side.telemetry is not None:
        agent.telemetry = side.telemetry
        side.telemetry.on_clock_change = agent.wake
        if hasattr(side.telemetry, "on_gpus_reported"):  # a worker's UUIDs: a new mapping
            side.telemetry.on_gpus_reported = agent.wake
    watches = [
        kube.pod_watch(agent.on_pods_listed, agent.on_pod_event),
        kube.node_watch(agent.on_node_listed, agent.on_node_event),
    ]
    for w in watches:
        w.start()
    try:
        if args.once:
            try:
                async with asyncio.timeout(ONCE_TIMEOUT_S):
                    await agent.listed()
            except TimeoutError:
                raise NodeAgentConfigError(
                    f"could not list the pods and the node {args.node_name} "
                    f"in {ONCE_TIMEOUT_S:g} s (see the log above)"
                ) from None
            applied = await agent.step()
            for line in applied.changes or ("nothing to change",):
                print(line, file=out)
            for event in applied.events:
                print(f"{event.reason} on {event.pod[0]}/{event.pod[1]}: {event.message}", file=out)
            for error in applied.errors:
                print(f"error: {error}", file=out)
            return 1 if applied.errors else 0

        async def successor() -> bool:
            """Whether another agent follows (``--daemonset``); False when unsure within
            ``SUCCESSOR_TIMEOUT_S`` (the kubelet kills the pod 30 s after SIGTERM, and a
            reset must happen before that)."""
            if not args.daemonset:
                return False
            namespace, name = daemonset(args)
            try:
                async with asyncio.timeout(SUCCESSOR_TIMEOUT_S):
                    return await asyncio.to_thread(kube.successor_coming, namespace, name)
            except TimeoutError:
                return False

        return await _daemon(args, agent, side, metrics, stop, control, successor)
    finally:
        for w in watches:
            w.stop()
        if podresources is not None:
            await podresources.close()


async def _daemon(
    args: argparse.Namespace,
    agent: Agent,
    side: Parts,
    metrics: Any,
    stop: asyncio.Event,
    control: RunControl,
    successor: Callable[[], Awaitable[bool]],
) -> int:
    from prometheus_client import start_http_server

    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    stop_flag = control.stop_flag
    watcher = asyncio.create_task(_watch_flag(stop_flag, stop)) if stop_flag else None
    httpd = None
    if args.metrics_port:
        httpd, thread = start_http_server(args.metrics_port, registry=metrics.registry)
        log.info("metrics on port %d", httpd.server_port)
    runner = None
    tasks: list[asyncio.Task[Any]] = []
    if args.daemonset:
        # A predecessor of this DaemonSet may have left its workers' GPUs set (so that
        # they did not run uncapped meanwhile): the first pass writes every GPU anyway
        # (it knows none), resetting the others; a reset now would open that gap.
        log.info("GPU settings left as they are until the first pass (--daemonset)")
    else:
        agent.restore_defaults()  # what a crashed agent left set: its memory of it is gone
    try:
        if side.app is not None:
            from aiohttp import web

            runner = web.AppRunner(side.app)
            await runner.setup()
            await web.TCPSite(runner, args.worker_host, args.worker_port).start()
            log.info("worker endpoint on %s:%d", args.worker_host, args.worker_port)
        if side.sender is not None:
            tasks.append(asyncio.create_task(side.sender.run(stop)))
        if control.on_start is not None:
            control.on_start(agent)
        first = True

        def passed() -> None:
            nonlocal first
            if first and control.ready_flag is not None:
                control.ready_flag.set()
            first = False

        await agent.run(stop, on_pass=passed)
    finally:
        stop.set()
        agent.restore_defaults(keep_workers=await successor())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if watcher is not None:
            watcher.cancel()
        if runner is not None:
            await runner.cleanup()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
            thread.join()
    return 0


async def _watch_flag(flag: threading.Event | asyncio.Event, stop: asyncio.Event) -> None:
    """Forward a stop flag set from another thread (or loop) to ``stop``."""
    while not flag.is_set():
        await asyncio.sleep(0.05)
    stop.set()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return serve(args)
