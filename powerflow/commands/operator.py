"""``powerflow operator``: run the DLJob operator (kopf) with PowerFlow's settings.

Watches DLJobs, their worker pods, Nodes and the budget ConfigMap, and runs
one allocation loop for the cluster. Cluster-wide unless ``--namespace``.
Peering by default: run one replica, with kopf's peering CRDs
(crds/kopf-peering.yaml) and the peering object ``powerflow``
(examples/kopf-peering.yaml); a second replica of the same priority pauses
both, so roll out with the Recreate strategy. ``--standalone`` runs without
peering. Liveness on ``--liveness``, Prometheus metrics on ``--metrics-port``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from powerflow import contract
from powerflow.errors import PowerFlowError

PEERING_NAME = "powerflow"


class OperatorConfigError(PowerFlowError):
    """The operator's command-line settings are unusable."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "operator",
        help="run the DLJob operator (allocation loop, worker pods, status)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--namespace", help="watch DLJobs in this namespace only (default: all)")
    p.add_argument("--budget-namespace", default="powerflow-system")
    p.add_argument("--budget-configmap", default=contract.BUDGET_CONFIGMAP)
    p.add_argument(
        "--peering",
        default=PEERING_NAME,
        help=f"kopf peering object name (default {PEERING_NAME})",
    )
    p.add_argument("--priority", type=int, default=0, help="kopf peering priority (default 0)")
    p.add_argument(
        "--standalone", action="store_true", help="no peering: nothing guards a second replica"
    )
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, default=9090)
    p.add_argument(
        "--debounce", type=float, default=0.02, help="seconds a burst of events is merged (0.02)"
    )
    p.add_argument(
        "--profiling-window",
        type=float,
        default=240.0,
        help="seconds a job profiles a GPU count it never ran on; 0 turns profiling off (240)",
    )
    p.set_defaults(func=run)


def kopf_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``kopf.operator`` for these options."""
    if args.debounce < 0 or args.profiling_window < 0:
        raise OperatorConfigError("--debounce and --profiling-window must be >= 0")
    options: dict[str, Any] = {
        "clusterwide": args.namespace is None,
        "namespaces": [args.namespace] if args.namespace else [],
        "standalone": args.standalone,
        "liveness_endpoint": args.liveness,
    }
    if not args.standalone:
        options.update(peering_name=args.peering, priority=args.priority)
    return options


def _api_client() -> Any:
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


def run(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    from powerflow.operator.controller import (
        Controller,
        OperatorConfig,
        default_policy,
        prior_models,
    )
    from powerflow.operator.handlers import build_registry
    from powerflow.operator.kube import Kube
    from powerflow.operator.metrics import Metrics

    options = kopf_options(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    metrics = Metrics()
    start_http_server(args.metrics_port, registry=metrics.registry)
    config = OperatorConfig(
        namespace=args.namespace,
        budget_namespace=args.budget_namespace,
        budget_name=args.budget_configmap,
        debounce_s=args.debounce,
        profiling_window_s=args.profiling_window,
    )

    def make() -> Controller:
        kube = Kube(_api_client(), args.namespace)
        return Controller(kube, config, default_policy(), prior_models(), metrics=metrics)

    registry = build_registry(make, peering=not args.standalone)
    asyncio.run(kopf.operator(registry=registry, **options))
    return 0
