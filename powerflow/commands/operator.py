"""``powerflow operator``: run the DLJob operator (kopf) with PowerFlow's settings.

Watches DLJobs, their worker pods, Nodes and the budget ConfigMap, and runs
one allocation loop for the cluster. Cluster-wide unless ``--namespace``.

Connection: ``--kubeconfig FILE``; without it the pod's service account when
running in a pod, else ``$KUBECONFIG``, else ``~/.kube/config``. kopf and the
allocation loop use that same configuration. No usable configuration: one
line on stderr saying why, exit code 2.

Replicas: leader election on the Lease ``--lease-name`` in
``--lease-namespace`` (default ``powerflow-system/powerflow-operator``; needs
get, create and update on ``leases`` there). Only the leader runs allocation
passes; another replica waits and takes over when the leader's Lease
expires (``--lease-duration``, default 15 s) or at once when the leader
shuts down cleanly. kopf runs standalone: no peering objects are needed.
``--no-leader-election`` (or ``--standalone``) for a single replica that must
not touch Leases.

Pools: GPU nodes whose hard taints the ``--tolerate`` tolerations all
tolerate (default: ``nvidia.com/gpu``); give the scheduler extender the same
options, and put matching tolerations into the DLJobs' pod templates.

Liveness on ``--liveness`` URL (empty: none; ``http://HOST:PORT/PATH``, the
port named; one that cannot be listened on fails at start, in one line),
Prometheus metrics on ``--metrics-port`` (0: any free port, logged).

Ingest: the node agents post their samples to ``--ingest-host:--ingest-port``
(default 0.0.0.0:9443, 0 turns it off; HTTPS with ``--ingest-tls-cert`` and
``--ingest-tls-key``), authenticated by a TokenReview of their projected
ServiceAccount token: only ``--ingest-service-account`` is accepted (needs
create on ``tokenreviews`` and get on ``pods``; ``powerflow.operator.ingest``).

Online refit: the accepted samples go to one ``learning.SampleStore`` (the
ingest endpoint's sink); each job's model is refitted from them, kept in
``status.model.params`` and read back from there after a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import threading
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from powerflow import __version__
from powerflow.commands.kubeconfig import add_kubeconfig_option
from powerflow.commands.tolerate import add_tolerate_option
from powerflow.core import contract
from powerflow.core.errors import PowerFlowError
from powerflow.core.taints import pool_tolerations

OPERATED = ("powerflow", "powerflow+")
"""The schedulers the operator runs (``--scheduler``), each by its registry entry
(``powerflow.lab.schedulers``): the policy and the profiling (window and clocks) that
``powerflow simulate --scheduler`` measures, except the pre-run: the operator has
none, a job profiles on its first GPU count. The baselines are there to compare
against: they keep no budget."""

if TYPE_CHECKING:
    from powerflow.core.policy.snapshot import Policy
    from powerflow.operator.controller import Controller
    from powerflow.operator.ingest import SampleSink
    from powerflow.operator.learning import SampleStore
    from powerflow.operator.pass_snapshot import ModelFactory

LEASE_NAME = "powerflow-operator"
LEASE_NAMESPACE = "powerflow-system"


class OperatorConfigError(PowerFlowError):
    """The operator's command-line settings are unusable."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "operator",
        help="run the DLJob operator (allocation loop, worker pods, status)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_kubeconfig_option(p)
    p.add_argument("--namespace", help="watch DLJobs in this namespace only (default: all)")
    p.add_argument(
        "--budget-namespace",
        default="powerflow-system",
        help="namespace of the budget ConfigMap (default powerflow-system)",
    )
    p.add_argument(
        "--budget-configmap",
        default=contract.BUDGET_CONFIGMAP,
        help=f"name of the budget ConfigMap: eta or powerLimitWatts, pMaxWatts, schedule "
        f"(docs/operator.md; default {contract.BUDGET_CONFIGMAP})",
    )
    p.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="act only while holding the Lease (default: on)",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="same as --no-leader-election: nothing guards a second replica",
    )
    p.add_argument("--lease-name", default=LEASE_NAME, help=f"default {LEASE_NAME}")
    p.add_argument("--lease-namespace", default=LEASE_NAMESPACE, help=f"default {LEASE_NAMESPACE}")
    p.add_argument(
        "--lease-duration",
        type=int,
        default=15,
        metavar="SECONDS",
        help="how long followers wait for a silent leader; the leader renews every "
        "duration/7.5 s and steps down after 2/3 of it without renewal (default 15)",
    )
    p.add_argument(
        "--leader-identity",
        help="this replica's name in the Lease (default: hostname_random)",
    )
    p.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf's liveness endpoint URL; empty for none (default http://0.0.0.0:8080/healthz)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="Prometheus metrics port; 0 for any free port (default 9090)",
    )
    p.add_argument(
        "--debounce", type=float, default=0.02, help="seconds a burst of events is merged (0.02)"
    )
    p.add_argument(
        "--scheduler",
        choices=OPERATED,
        default="powerflow",
        help="the policy and profiling of 'powerflow simulate --scheduler': powerflow "
        "(the paper's) or powerflow+ (docs/policy.md) (default powerflow)",
    )
    p.add_argument(
        "--profiling-window",
        type=float,
        metavar="SECONDS",
        help="seconds a job profiles a GPU count it never ran on; 0 turns profiling off "
        "(default: the scheduler's, 240 for powerflow, 69 for powerflow+)",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="at most one progress/energy status write per job in this time (30)",
    )
    p.add_argument(
        "--ingest-port",
        type=int,
        default=contract.INGEST_PORT,
        help=f"port of the node agents' sample ingest; 0 turns it off "
        f"(default {contract.INGEST_PORT})",
    )
    p.add_argument("--ingest-host", default="0.0.0.0", help="ingest address (default 0.0.0.0)")
    p.add_argument("--ingest-tls-cert", metavar="FILE", help="serve the ingest over HTTPS")
    p.add_argument("--ingest-tls-key", metavar="FILE", help="the certificate's key file")
    p.add_argument(
        "--ingest-service-account",
        default=contract.AGENT_ACCOUNT,
        metavar="USERNAME",
        help=f"the only account whose samples are accepted (default {contract.AGENT_ACCOUNT})",
    )
    add_tolerate_option(p, "extender")
    p.set_defaults(func=run)


def liveness_address(url: str) -> tuple[str, int] | None:
    """Where kopf will serve ``--liveness`` (None: off). Stricter than kopf, which
    reads a missing port or port 0 as 80 and a missing host as localhost: plain
    ``http`` only, host and port named."""
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme != "http" or not parts.hostname or port is None or not 0 < port < 65536:
        raise OperatorConfigError(
            f"--liveness {url!r}: expected http://HOST:PORT/PATH with a port 1-65535 "
            "(or empty for none)"
        )
    return parts.hostname, port


async def check_listen(option: str, address: tuple[str, int]) -> None:
    """Fail in one line, naming the option, when ``address`` cannot be listened on
    (kopf's liveness server would fail later, in a traceback, and stop the operator).
    Bound as aiohttp binds it, every address the host resolves to."""
    host, port = address
    try:
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host, port)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a host IDNA cannot encode
        raise OperatorConfigError(f"{option}: cannot listen on {host}:{port}: {exc}") from None
    server.close()
    await server.wait_closed()


def kopf_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``kopf.operator`` for these options (always standalone:
    the Lease, not kopf's peering, decides who acts)."""
    for option in ("--debounce", "--profiling-window", "--progress-interval"):
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None and not 0 <= value < math.inf:  # NaN fails too
            raise OperatorConfigError(f"{option} must be a finite number >= 0, got {value:g}")
    if args.lease_duration < 1:
        raise OperatorConfigError(f"--lease-duration must be >= 1 s, got {args.lease_duration}")
    if not 0 <= args.metrics_port < 65536:
        raise OperatorConfigError(f"--metrics-port {args.metrics_port} is not a TCP port")
    if not 0 <= args.ingest_port < 65536:
        raise OperatorConfigError(f"--ingest-port {args.ingest_port} is not a TCP port")
    if args.ingest_tls_key and not args.ingest_tls_cert:
        raise OperatorConfigError("--ingest-tls-key needs --ingest-tls-cert")
    liveness_address(args.liveness)
    if not args.ingest_service_account.startswith("system:serviceaccount:"):
        raise OperatorConfigError(
            f"--ingest-service-account {args.ingest_service_account!r}: expected "
            "system:serviceaccount:NAMESPACE:NAME"
        )
    # kopf watches each resource in every namespace it serves: serving one namespace,
    # the operator also serves the budget's, so that an edit of the budget starts a
    # pass at once (its DLJobs there are not run: each pass lists --namespace's).
    served = [args.namespace, args.budget_namespace] if args.namespace else []
    return {
        "clusterwide": args.namespace is None,
        "namespaces": list(dict.fromkeys(served)),
        "standalone": True,
        "liveness_endpoint": args.liveness or None,
    }


def leader_election(args: argparse.Namespace) -> bool:
    return bool(args.leader_election) and not args.standalone


def serve(
    args: argparse.Namespace,
    *,
    stop_flag: threading.Event | asyncio.Event | None = None,
    ready_flag: threading.Event | asyncio.Event | None = None,
    policy: Policy | None = None,
    models: ModelFactory | None = None,
    on_start: Callable[[Controller], None] | None = None,
    store: SampleStore | None = None,
    sink: SampleSink | None = None,
) -> int:
    """Run the operator until ``stop_flag`` (or a signal): what ``run`` does, minus logging
    setup, so that tests start exactly this.

    Seams for tests, defaulting to the product's: ``policy`` and ``models``
    (the plan and the performance models; by default each job's model is the
    store's: fitted online, else its prior), ``on_start`` (called with the
    controller once it runs), ``store`` (the online refit's sample store; by
    default a new one whose metrics go to the operator's registry), ``sink``
    (where the ingest's accepted samples go; by default the store). Raises
    ``PowerFlowError`` for unusable settings before kopf starts (a port that cannot be
    listened on once the metrics and ingest servers have started: they are stopped).
    """
    import kopf
    from prometheus_client import start_http_server

    from powerflow.core.schedulers import scheduler
    from powerflow.operator.connection import (
        api_client,
        connection_info,
        load_configuration,
        resolve_source,
    )
    from powerflow.operator.controller import (
        Controller,
        OperatorConfig,
        default_policy,
        learned_models,
    )
    from powerflow.operator.discovered import DiscoveredGpus
    from powerflow.operator.handlers import build_registry
    from powerflow.operator.ingest import (
        ClusterPower,
        ClusterView,
        ControllerLink,
        Ingest,
        IngestServer,
        start,
        tls_context,
    )
    from powerflow.operator.kube import Kube
    from powerflow.operator.leader import LeaderElector, LeaseConfig, default_identity
    from powerflow.operator.learning import SampleStore
    from powerflow.operator.metrics import Metrics
    from powerflow.operator.reported_progress import ReportedProgress
    from powerflow.operator.stuck_watchers import recancel_stuck_watchers
    from powerflow.operator.tokenreview import TokenReviewer

    options = kopf_options(args)
    try:
        tolerations = pool_tolerations(args.tolerate)
    except ValueError as exc:
        raise OperatorConfigError(f"--tolerate: {exc}") from None
    source = resolve_source(args.kubeconfig)
    load_configuration(source)  # fail now, in one line, rather than in kopf's login retries
    identity = args.leader_identity or default_identity()
    user_agent = f"powerflow-operator/{__version__} ({identity})"
    profiling = scheduler(args.scheduler).profiling
    config = OperatorConfig(
        namespace=args.namespace,
        budget_namespace=args.budget_namespace,
        budget_name=args.budget_configmap,
        debounce_s=args.debounce,
        profiling_window_s=(
            profiling.profile_s if args.profiling_window is None else args.profiling_window
        ),
        profile_sweep=profiling.sweep,
        progress_interval_s=args.progress_interval,
        pool_tolerations=tolerations,
    )
    try:
        tls = tls_context(args.ingest_tls_cert, args.ingest_tls_key)
    except (OSError, ValueError) as exc:
        raise OperatorConfigError(f"--ingest-tls-cert/--ingest-tls-key: {exc}") from None
    metrics = Metrics()
    learning = store if store is not None else SampleStore(registry=metrics.registry)
    progress = ReportedProgress()  # the ingest writes it, each pass reads it
    discovered = DiscoveredGpus()  # the same: the GPU types the agents reported
    httpd, thread = start_http_server(args.metrics_port, registry=metrics.registry)
    logging.getLogger(__name__).info("metrics on port %d", httpd.server_port)
    apis: list[Any] = []
    controllers: list[Controller] = []

    def make() -> Controller:
        api = api_client(load_configuration(source), user_agent)
        apis.append(api)
        leader = None
        if leader_election(args):
            lease = LeaseConfig.scaled(
                args.lease_namespace, args.lease_name, identity, args.lease_duration
            )
            leader = LeaderElector(api, lease)
        kube = Kube(api, args.namespace)
        if args.namespace:  # the chart grants Events there (operator.watchNamespace)
            kube.cluster_events_namespace = args.budget_namespace
        controller = Controller(
            kube,
            config,
            policy or default_policy(args.scheduler),
            models or learned_models(learning),
            metrics=metrics,
            models_on=None if models else learning.model_on,
            leader=leader,
            learning=learning,
            progress=progress,
            discovered=discovered,
        )
        controllers.append(controller)
        return controller

    def login() -> kopf.ConnectionInfo:
        return connection_info(load_configuration(source))

    def view() -> ClusterView | None:
        controller = controllers[-1] if controllers else None
        if controller is None or controller.state is None:
            return None
        leading = controller.leader is None or controller.leader.is_leader
        return ClusterView(controller.state, leading, controller.state_read_s)

    reviewer = TokenReviewer(
        lambda: apis[-1] if apis else None, contract.INGEST_AUDIENCE, args.ingest_service_account
    )

    def refused(node: str, reason: str, count: int) -> None:
        if controllers:
            controllers[-1].note_refused_sender(node, reason, count)

    def finished(job: str) -> None:
        if controllers:
            controllers[-1].trigger(f"progress of {job} reached its iterations")

    link = ControllerLink(progress, on_refused=refused, on_finished=finished, discovered=discovered)
    ingest = Ingest(reviewer, view, sink or learning, metrics, ClusterPower(), controller=link)

    async def main() -> None:
        """kopf and the ingest server on one event loop."""
        server: IngestServer | None = None
        recancel: asyncio.Task[None] | None = None
        if args.ingest_port:
            try:
                server = await start(ingest, args.ingest_host, args.ingest_port, tls)
            except OSError as exc:
                where = f"{args.ingest_host}:{args.ingest_port}"
                message = f"--ingest-port: cannot listen on {where}: {exc}"
                raise OperatorConfigError(message) from None
        try:
            live = liveness_address(args.liveness)
            if live is not None:  # after the ingest's bind, which may take the same port
                await check_listen("--liveness", live)
            # Before kopf starts: kopf leaves the tasks it finds running alone.
            recancel = asyncio.create_task(recancel_stuck_watchers(), name="powerflow-recancel")
            await kopf.operator(
                registry=registry, stop_flag=stop_flag, ready_flag=ready_flag, **options
            )
        finally:
            if recancel is not None:
                recancel.cancel()
            if server is not None:
                await server.stop()

    registry = build_registry(make, config, login, on_ready=on_start)
    try:
        asyncio.run(main())
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
        for api in apis:
            api.close()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return serve(args)
