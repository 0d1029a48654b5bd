"""``powerflow operator``: run the DLJob operator (kopf) with PowerFlow's settings.

Watches DLJobs, their worker pods, Nodes and the budget ConfigMap, and runs
one allocation loop for the cluster. Cluster-wide unless ``--namespace``;
with peering (one active replica; needs kopf's ``ClusterKopfPeering`` CRD)
unless ``--standalone``. Liveness on ``--liveness``, Prometheus metrics on
``--metrics-port``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from powerflow import contract


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
    p.add_argument("--peering", default="powerflow", help="kopf peering name (default powerflow)")
    p.add_argument("--standalone", action="store_true", help="no peering (single replica)")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, default=9090)
    p.add_argument("--debounce", type=float, default=0.05, help="seconds (default 0.05)")
    p.set_defaults(func=run)


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

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    metrics = Metrics()
    start_http_server(args.metrics_port, registry=metrics.registry)
    config = OperatorConfig(
        namespace=args.namespace,
        budget_namespace=args.budget_namespace,
        budget_name=args.budget_configmap,
        debounce_s=args.debounce,
    )

    def make() -> Controller:
        kube = Kube(_api_client(), args.namespace)
        return Controller(kube, config, default_policy(), prior_models(), metrics=metrics)

    registry = build_registry(make, peering=not args.standalone)
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=args.namespace is None,
            namespaces=[args.namespace] if args.namespace else (),
            standalone=args.standalone,
            peering_name=args.peering,
            liveness_endpoint=args.liveness,
        )
    )
    return 0
