"""``powerflow extender``: serve the kube-scheduler extender (filter, prioritize, bind).

Runs beside a second kube-scheduler (``powerflow-scheduler``) in the same pod,
which reaches it on localhost (``helm/powerflow/files/kube-scheduler-config.yaml``).
It starts even when the API server cannot be reached or the kubeconfig is
unusable: one log line and ``/readyz`` then say why, and pods that are not
PowerFlow's still pass through.

Pools: GPU nodes that are Ready, not cordoned, and whose hard taints
(``NoSchedule``, ``NoExecute``) the ``--tolerate`` tolerations all tolerate
(default: ``nvidia.com/gpu``, the managed GPU pools' taint). Give the
operator the same ``--tolerate`` options, and put matching tolerations into
the DLJobs' pod templates: a pod is placed only on nodes whose taints its own
tolerations tolerate.

Metrics: the app serves ``/metrics`` on ``--host``, which is loopback in the
chart (its ``/bind`` acts with the pod's rights), out of Prometheus's reach.
``--metrics-port PORT`` serves the same registry, and nothing else, on
0.0.0.0:PORT for Prometheus (the chart uses 9403); 0, the default, serves none.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from powerflow.commands.tolerate import add_tolerate_option
from powerflow.core.errors import PowerFlowError
from powerflow.core.taints import pool_tolerations

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8888
"""The port in the scheduler configuration's ``urlPrefix``; change both together."""


class ExtenderConfigError(PowerFlowError):
    """The extender's command-line settings are unusable."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "extender",
        help="serve the kube-scheduler extender (buddy placement of gang workers)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: the scheduler shares the pod; "
        "use 0.0.0.0 for HTTP probes from the kubelet)",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="also serve the Prometheus metrics, and only them, on 0.0.0.0:PORT, for "
        "Prometheus to scrape while --host stays on loopback; 0 for none (default 0)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--kubeconfig", metavar="PATH", help="kubeconfig file (default: $KUBECONFIG)"
    )
    where.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    p.add_argument(
        "--reservation-ttl",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long a gang's reservation waits for all its workers (default 120)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="refuse verb requests with larger bodies with 413 (default 4 MiB: a pod and the "
        "names of 5,000 nodes, as kube-scheduler sends with nodeCacheCapable: true)",
    )
    add_tolerate_option(p, "operator")
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least severe log lines written (default info; debug adds a line per request)",
    )
    p.set_defaults(func=run)


def app_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``create_app`` for these options; raises
    ``ExtenderConfigError`` for unusable ones (before anything starts)."""
    if not args.reservation_ttl > 0:
        raise ExtenderConfigError(f"--reservation-ttl must be positive, got {args.reservation_ttl}")
    from powerflow.extender.app import MAX_BODY_BYTES, BodyLimits
    from powerflow.extender.state import ClusterState

    max_body = MAX_BODY_BYTES if args.max_body_bytes is None else args.max_body_bytes
    if max_body < 1:
        raise ExtenderConfigError(f"--max-body-bytes must be positive, got {max_body}")
    try:
        tolerations = pool_tolerations(args.tolerate)
    except ValueError as exc:
        raise ExtenderConfigError(f"--tolerate: {exc}") from None
    return {
        "kubeconfig": args.kubeconfig,
        "in_cluster": args.in_cluster,
        "state": ClusterState(ttl_s=args.reservation_ttl, pool_tolerations=tolerations),
        "limits": BodyLimits(max_body_bytes=max_body),
    }


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise ExtenderConfigError(f"--port {args.port} is not a TCP port")
    if not 0 <= args.metrics_port < 65536:
        raise ExtenderConfigError(f"--metrics-port {args.metrics_port} is not a TCP port")
    options = app_options(args)
    from prometheus_client import start_http_server

    from powerflow.extender import create_app

    configure_logging(args.log_level)
    app = create_app(**options)
    if args.metrics_port:
        # prometheus_client's own server in a daemon thread: the registry's exposition on
        # every path, none of the app's routes (no /bind on a routable address).
        registry = app.state.extender.metrics.registry
        httpd, _ = start_http_server(args.metrics_port, addr="0.0.0.0", registry=registry)
        logging.getLogger(__name__).info("metrics on 0.0.0.0:%d", httpd.server_port)
    serve(app, args.host, args.port, args.log_level)
    return 0


def configure_logging(level: str) -> None:
    """The command's log lines: ``level`` and above, one line each."""
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")


def serve(app: Any, host: str, port: int, log_level: str) -> None:
    """Serve ``app`` with uvicorn until it is stopped, as the command does
    (``benchmarks/extender_bench.py`` serves its app through this too).

    httptools parses HTTP and uvloop runs the event loop (both dependencies: with
    uvicorn's pure-Python parser and the stdlib loop a small call costs twice the CPU).
    A line per request only at ``debug``: kube-scheduler may call thousands of times a
    second, and the metrics count the calls.
    """
    import uvicorn

    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http="httptools",
        loop="auto",  # uvloop: a dependency wherever it runs (not on Windows)
        access_log=log_level == "debug",
    )
