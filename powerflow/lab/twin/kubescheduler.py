"""``python -m powerflow.lab.twin.kubescheduler --config FILE``: kube-scheduler's stand-in.

kube-scheduler cannot run here, so in the chart twin its container runs this
(from the PowerFlow image, which carries the twin) with the container's own
flags and volumes: it reads the chart's rendered ``KubeSchedulerConfiguration``
(``scheduler.SchedulerConfig.from_config``: the profile's scheduler name, the
extender's URL, verbs, weight, timeout, ``nodeCacheCapable``,
``managedResources``, ``ignorable``, ``percentageOfNodesToScore``), logs in
as kube-scheduler does in a pod (the in-cluster service account: token and CA
from ``/var/run/secrets/kubernetes.io/serviceaccount``, the API server at
``KUBERNETES_SERVICE_HOST``), takes the config's leader-election Lease as
client-go's ``leaderelection`` does (get, create when absent, update to renew),
serves ``/livez``, ``/readyz`` and ``/healthz`` over HTTPS on
``--secure-port``, and schedules with ``scheduler.Scheduler``'s loop once it
leads. Flags it does not know are refused: a chart that passes kube-scheduler
a flag the stand-in would ignore fails its test.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import logging
import os
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from powerflow.core.timefmt import format_time
from powerflow.lab.twin import stop_signal
from powerflow.lab.twin.scheduler import Scheduler, SchedulerConfig
from powerflow.lab.twin.stop_signal import StopSignal

log = logging.getLogger("kube-scheduler")
SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVING = Path("/run/powerflow-twin/serving")
"""Where the twin's kubelet mounts this container's serving certificate (kube-scheduler
makes a self-signed one in memory; Python's ``ssl`` cannot, so the kubelet gives one)."""
LEASE_S, RENEW_S = 15, 2.0


class _Health(http.server.BaseHTTPRequestHandler):
    leading = threading.Event()

    def do_GET(self) -> None:
        ok = self.path.split("?")[0] in ("/livez", "/readyz", "/healthz")
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"ok" if ok else b"not found")

    def log_message(self, *args: Any) -> None:
        pass


def _serve_health(port: int) -> None:
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), _Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(SERVING / "tls.crt", SERVING / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def _lease(api: httpx.Client, namespace: str, name: str, identity: str) -> bool:
    """One round of client-go's ``tryAcquireOrRenew``: True while this one holds it."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    stamp = format_time(time.time())
    got = api.get(f"{path}/{name}")
    if got.status_code == 404:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "holderIdentity": identity,
                "leaseDurationSeconds": LEASE_S,
                "acquireTime": stamp,
                "renewTime": stamp,
            },
        }
        made = api.post(path, json=body)
        if made.status_code >= 300:
            log.warning("lease %s/%s: create: %s %s", namespace, name, made.status_code, made.text)
        return made.status_code < 300
    if got.status_code >= 300:
        log.warning("lease %s/%s: get: %s %s", namespace, name, got.status_code, got.text)
        return False
    lease = got.json()
    spec = lease.get("spec") or {}
    if spec.get("holderIdentity") not in (None, "", identity):
        renewed = spec.get("renewTime") or ""
        try:
            at = datetime.datetime.fromisoformat(renewed.replace("Z", "+00:00")).timestamp()
        except ValueError:
            at = 0.0
        if time.time() - at < float(spec.get("leaseDurationSeconds") or LEASE_S):
            return False
    spec.update(holderIdentity=identity, renewTime=stamp, leaseDurationSeconds=LEASE_S)
    lease["spec"] = spec
    put = api.put(f"{path}/{name}", json=lease)
    if put.status_code >= 300:
        log.warning("lease %s/%s: update: %s %s", namespace, name, put.status_code, put.text)
    return put.status_code < 300


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kube-scheduler (the twin's stand-in)")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--secure-port", type=int, default=10259)
    parser.add_argument("-v", "--v", type=int, default=0)
    args = parser.parse_args(argv)
    terminated = on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    doc = yaml.safe_load(args.config.read_text())
    config = SchedulerConfig.from_config(doc)
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    api_url = f"https://{host}:{port}"
    token = (SA / "token").read_text().strip()
    ca = str(SA / "ca.crt")
    _serve_health(args.secure_port)
    election = doc.get("leaderElection") or {}
    identity = f"{socket.gethostname()}_{os.getpid()}"
    if election.get("leaderElect", True):
        api = httpx.Client(
            base_url=api_url,
            verify=ca,
            timeout=10.0,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "kube-scheduler"},
        )
        namespace = election.get("resourceNamespace", "kube-system")
        name = election.get("resourceName", "kube-scheduler")
        while not _lease(api, namespace, name, identity):
            if terminated.wait(RENEW_S):  # stopped while it waited for the lease
                return 0
        log.info("leading on lease %s/%s as %s", namespace, name, identity)

        def renew() -> None:
            while True:
                time.sleep(RENEW_S)
                try:
                    if not _lease(api, namespace, name, identity):
                        log.error("leader election lost")
                        os._exit(1)  # kube-scheduler exits when it loses its lease
                except httpx.HTTPError as exc:
                    log.warning("lease renewal: %s", exc)

        threading.Thread(target=renew, daemon=True).start()
    scheduler = Scheduler(api_url, config.url_prefix, config=config, token=token, verify=ca)
    scheduler.start()
    while not terminated.wait(1.0):
        pass
    log.info("terminated: stopping")
    scheduler.stop()
    return 0


def on_sigterm() -> StopSignal:
    """A stop that SIGTERM (the kubelet's stop) sets: kube-scheduler ends on it. A
    container's PID 1 gets no default action for SIGTERM, so without this handler the
    stand-in would run out its pod's grace period (30 s) at each rollout and at the
    chart twin's end, until the SIGKILL."""
    return stop_signal.on_sigterm()


if __name__ == "__main__":
    raise SystemExit(main())
