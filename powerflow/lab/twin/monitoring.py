"""A real Prometheus scraping the chart twin's pods through the chart's ServiceMonitors.

What the Prometheus Operator makes of a ``ServiceMonitor`` (its generated scrape
configuration, ``pkg/prometheus/promcfg.go``), done here for the chart's: one
scrape job per endpoint, named ``serviceMonitor/NAMESPACE/NAME/INDEX``, at the
endpoint's ``interval``, whose targets are the ready endpoints of the Services
in the monitor's namespace whose labels match its ``selector``, at the Service
port the endpoint names (``port``) and the container port that port targets;
each target labelled ``namespace``, ``service``, ``pod``, ``endpoint`` and
``job`` (the Service's name), ``instance`` its address. Targets are written to
file-based service discovery and refreshed every ``refresh_s``, so Prometheus
follows pods that start, stop or become ready, as the operator's endpoint
discovery does.

Prometheus itself is the machine's (Debian's ``prometheus`` package): it runs
on this machine and reaches the pods at their nodes' addresses.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from powerflow.lab.twin.chartpods import matches, ready_endpoints

Obj = dict[str, Any]
Lister = Callable[[str, str], list[Obj]]
"""(namespace, plural) -> the objects the API server lists."""


def targets(monitor: Obj, endpoint: Obj, services: list[Obj], pods: list[Obj]) -> list[Obj]:
    """The file-SD target groups of one ServiceMonitor endpoint."""
    selector = (monitor["spec"].get("selector") or {}).get("matchLabels") or {}
    groups = []
    for service in services:
        if not matches(selector, service["metadata"].get("labels") or {}):
            continue
        port = next(
            (p for p in service["spec"].get("ports") or [] if p.get("name") == endpoint["port"]),
            None,
        )
        if port is None:
            continue
        target = port.get("targetPort", port["port"])
        chosen = service["spec"].get("selector") or {}
        for pod, number in ready_endpoints(chosen, target, pods):
            groups.append(
                {
                    "targets": [f"{pod['status']['podIP']}:{number}"],
                    "labels": {
                        "namespace": service["metadata"]["namespace"],
                        "service": service["metadata"]["name"],
                        "pod": pod["metadata"]["name"],
                        "endpoint": str(endpoint["port"]),
                    },
                }
            )
    return groups


class Prometheus:
    """``Prometheus(folder, monitors, lister).start()``; ``query``/``query_range``; ``stop``."""

    def __init__(
        self,
        folder: Path,
        monitors: list[Obj],
        lister: Lister,
        *,
        port: int,
        refresh_s: float = 1.0,
        binary: str = "prometheus",
        rules: list[Obj] | None = None,
    ) -> None:
        """``rules``: rule groups (a PrometheusRule's ``spec.groups``) it evaluates."""
        self.rules = list(rules or [])
        self.folder, self.monitors, self.lister = folder, monitors, lister
        self.port, self.refresh_s, self.binary = port, refresh_s, binary
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name="twin-prom-sd", daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def _jobs(self) -> list[tuple[str, Obj, Obj, Path]]:
        out = []
        for m in self.monitors:
            meta = m["metadata"]
            for i, endpoint in enumerate(m["spec"].get("endpoints") or []):
                name = f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}"
                path = self.folder / "sd" / f"{meta['name']}-{i}.json"
                out.append((name, m, endpoint, path))
        return out

    def config(self) -> Obj:
        scrape = []
        for name, _, endpoint, path in self._jobs():
            job: Obj = {
                "job_name": name,
                "file_sd_configs": [{"files": [str(path)], "refresh_interval": "1s"}],
                "relabel_configs": [
                    {"source_labels": ["service"], "target_label": "job"},
                ],
                "metrics_path": endpoint.get("path", "/metrics"),
                "scheme": endpoint.get("scheme", "http"),
            }
            if endpoint.get("interval"):
                job["scrape_interval"] = endpoint["interval"]
            scrape.append(job)
        config: Obj = {"global": {"evaluation_interval": "1s"}, "scrape_configs": scrape}
        if self.rules:
            path = self.folder / "rules.yaml"
            path.write_text(yaml.safe_dump({"groups": self.rules}))
            config["rule_files"] = [str(path)]
        return config

    def write_targets(self) -> int:
        """Write every job's targets; how many there are."""
        count = 0
        for _, monitor, endpoint, path in self._jobs():
            ns = monitor["metadata"]["namespace"]
            groups = targets(
                monitor, endpoint, self.lister(ns, "services"), self.lister(ns, "pods")
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(groups))
            tmp.replace(path)  # Prometheus must never read half a file
            count += len(groups)
        return count

    def _refresh(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.write_targets()
            except (httpx.HTTPError, OSError, KeyError) as exc:
                (self.folder / "sd-errors.log").open("a").write(f"{time.time()}: {exc}\n")

    def start(self) -> Prometheus:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.write_targets()
        config = self.folder / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config()))
        log = (self.folder / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("prometheus did not become ready: " + self.log_tail())
        self._thread.start()
        self._wait_scraped(self.write_targets())
        return self

    def _wait_scraped(self, expected: int, timeout_s: float = 60.0) -> None:
        """Until every target has been scraped once: as on a cluster whose Prometheus ran
        before the jobs came, the series start before what they count does (an increase
        before a series' first scrape is never in a ``rate``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            health = self.targets_up()
            if len(health) >= expected and set(health.values()) == {"up"}:
                return
            time.sleep(0.5)
        raise RuntimeError(f"prometheus: targets not all up in {timeout_s:g} s: {health}")

    def log_tail(self) -> str:
        try:
            return (self.folder / "prometheus.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def targets_up(self) -> dict[str, str]:
        """``instance (job)`` -> health, as the targets page shows them."""
        body = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()
        return {
            f"{t['labels'].get('instance')} ({t['labels'].get('job')})": t["health"]
            for t in body["data"]["activeTargets"]
        }

    def alerts(self) -> list[Obj]:
        """The alerts pending or firing now (``/api/v1/alerts``)."""
        body = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()
        alerts: list[Obj] = body["data"]["alerts"]
        return alerts

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Obj]:
        answer = httpx.get(
            f"{self.url}/api/v1/query_range",
            params={"query": expr, "start": start, "end": end, "step": step},
            timeout=30,
        ).json()
        if answer.get("status") != "success":
            raise ValueError(f"{expr}: {answer.get('error')}")
        result: list[Obj] = answer["data"]["result"]
        return result

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
