"""The chart twin: the Helm chart's own objects and pods, from the built image, on the twin.

``ChartTwin(folder, image="localhost/powerflow:dev").start()`` renders the
chart with ``helm template`` (the values a test gives, over the chart's
defaults), and boots what it describes on this machine:

- the emulated API server (``apiserver``, a process) with RBAC enforced for
  every ServiceAccount token (a request the chart's roles do not grant is
  403), TokenRequest for the kubelet's projected tokens, and the roles a real
  cluster bootstraps that the chart binds (``BOOTSTRAP``);
- a network (``netns``): one namespace per node, two ``ctl-N`` nodes for the
  operator's and the scheduler's pods and ``node-N`` GPU nodes (labelled as GPU Feature
  Discovery labels them, tainted ``nvidia.com/gpu:NoSchedule`` as GPU pools
  usually are), the Services' cluster IPs served by ``servicemesh``, the
  ``kubernetes`` Service over TLS;
- every rendered object applied as the admin would (``helm template | kubectl
  apply``, in Helm's install order), the Namespace created first as ``helm
  install --create-namespace`` does;
- ``chartpods``: the Deployments and the DaemonSet become pods, run from the
  image with their commands, users, volumes and probes; kube-scheduler's
  container runs the twin's stand-in (``kubescheduler``) with the chart's
  ``KubeSchedulerConfiguration``, on the image's Python with the twin's own code
  mounted (the image leaves the lab out; ``kubescheduler_standin``);
- the node agents' GPUs: each GPU node's simulated GPUs (``TwinGpus``) behind
  ``GpuServer``, reached through the stand-in for the NVIDIA driver's library
  (``nvml_shim``, mounted over the image's ``pynvml``) that the runtime gives a
  container asking for GPUs, as the NVIDIA container toolkit does;
- the workers' kubelet (``kubelet``): DLJob workers train on those GPUs and
  report to their node's agent at the node's address.

``pods_table()`` is ``kubectl get pods -A``; ``wait_ready`` fails with it and
the failing containers' logs.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from powerflow.core import contract
from powerflow.lab.twin.agentproc import GpuServer
from powerflow.lab.twin.apiserver import write_kubeconfig
from powerflow.lab.twin.chartpods import (
    Images,
    Node,
    PodKubelet,
    pod_ready,
    pod_status_text,
    ready_endpoints,
)
from powerflow.lab.twin.components import Process, apiserver_process
from powerflow.lab.twin.gpus import TwinGpus
from powerflow.lab.twin.harness import node_body
from powerflow.lab.twin.kubelet import Kubelet
from powerflow.lab.twin.monitoring import Prometheus
from powerflow.lab.twin.netns import Network
from powerflow.lab.twin.ports import free_port
from powerflow.lab.twin.runtime import Image, Mount
from powerflow.lab.twin.servicemesh import Listener, ServiceMesh

log = logging.getLogger(__name__)
Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "powerflow"
RELEASE, NAMESPACE = "powerflow", "powerflow"
WORKLOAD_NAMESPACE = "ml"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
INSTALL_ORDER = (
    "Namespace",
    "PriorityClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Deployment",
    "ServiceMonitor",
    "PrometheusRule",
)
"""Helm's ``InstallOrder`` (``pkg/release/util/kind_sorter.go``) for the kinds the chart has."""
PATHS = {
    "Namespace": ("/api/v1", "namespaces"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Secret": ("/api/v1", "secrets"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions"),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles"),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "DaemonSet": ("/apis/apps/v1", "daemonsets"),
}
CONTROL_NODES = ("ctl-0", "ctl-1")
"""Nodes without GPUs, for the operator's and the scheduler's pods. Two: pods share
their node's network namespace (``netns``), so a rolling update's new pod, which
must start beside the old one, would find the old one's ports taken on its node;
the default scheduler's stand-in puts it on the other node (the one with fewer pods)."""
GPU_TICK_S = 0.1
"""At most a fiftieth of the chart's default agent window (5 s): every window sees
many steps of the GPUs' energy counters."""
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}


def _rule(
    groups: Sequence[str], resources: Sequence[str], verbs: Sequence[str], names: Sequence[str] = ()
) -> Obj:
    rule: Obj = {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}
    if names:
        rule["resourceNames"] = list(names)
    return rule


READ = ("get", "list", "watch")
BOOTSTRAP: tuple[Obj, ...] = (
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:kube-scheduler"},
        "rules": [
            _rule(["", "events.k8s.io"], ["events"], ["create", "patch", "update"]),
            _rule(["coordination.k8s.io"], ["leases"], ["create"]),
            _rule(["coordination.k8s.io"], ["leases"], ["get", "update"], ["kube-scheduler"]),
            _rule([""], ["endpoints"], ["create"]),
            _rule([""], ["endpoints"], ["get", "update"], ["kube-scheduler"]),
            _rule([""], ["nodes"], READ),
            _rule([""], ["pods"], ["delete", *READ]),
            _rule([""], ["bindings", "pods/binding"], ["create"]),
            _rule([""], ["pods/status"], ["patch", "update"]),
            _rule(
                ["", "apps"],
                ["replicationcontrollers", "services", "replicasets", "statefulsets"],
                READ,
            ),
            _rule(["policy"], ["poddisruptionbudgets"], READ),
            _rule([""], ["persistentvolumeclaims", "persistentvolumes", "namespaces"], READ),
            _rule(["authentication.k8s.io"], ["tokenreviews"], ["create"]),
            _rule(["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
            _rule(["storage.k8s.io"], ["csinodes", "csidrivers", "csistoragecapacities"], READ),
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "system:volume-scheduler"},
        "rules": [
            _rule([""], ["persistentvolumes"], [*READ, "patch", "update"]),
            _rule(["storage.k8s.io"], ["storageclasses"], READ),
            _rule([""], ["persistentvolumeclaims"], [*READ, "patch", "update"]),
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": "extension-apiserver-authentication-reader",
            "namespace": "kube-system",
        },
        "rules": [_rule([""], ["configmaps"], READ, ["extension-apiserver-authentication"])],
    },
)
"""The roles a real cluster bootstraps that the chart binds (kube-scheduler's, from
``plugin/pkg/auth/authorizer/rbac/bootstrappolicy``), so the scheduler pod gets what
its ServiceAccount gets on a real cluster."""


def render(
    values: Mapping[str, Any], helm: Path, out: Path, kubeconfig: Path | None = None
) -> list[Obj]:
    """``helm template`` of the chart with ``values`` over its defaults; with
    ``kubeconfig``, its ``lookup``s read that cluster (``--dry-run=server``), as
    ``helm upgrade`` renders."""
    out.write_text(yaml.safe_dump(dict(values)))
    args = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(out)]
    if kubeconfig is not None:
        args += ["--dry-run=server", "--kubeconfig", str(kubeconfig)]
    text = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    kind = str(obj.get("kind", ""))
    namespace = "" if kind in CLUSTER_SCOPED else str(meta.get("namespace") or NAMESPACE)
    return kind, namespace, str(meta.get("name", ""))


def three_way(original: Any, modified: Any, current: Any) -> Any:
    """Helm's three-way JSON merge patch (``jsonmergepatch.CreateThreeWayJSONMergePatch``,
    what it sends for objects it has no strategic-merge schema for): what the chart
    dropped since the last release is deleted (``null``), what differs between the live
    object and the new rendering is set to the new rendering's, and what neither
    rendering has (fields the cluster or an admin added) is left alone. Lists are
    replaced whole (a strategic merge would merge lists of named items such as
    containers; the chart twin's objects carry no list an admin or controller edits)."""
    if not isinstance(modified, dict) or not isinstance(current, dict):
        return modified
    patch: Obj = {}
    original = original if isinstance(original, dict) else {}
    for k in original:
        if k not in modified and k in current:
            patch[k] = None
    for k, v in modified.items():
        if k not in current:
            patch[k] = v
        elif isinstance(v, dict) and isinstance(current[k], dict):
            sub = three_way(original.get(k), v, current[k])
            if sub:
                patch[k] = sub
        elif current[k] != v:
            patch[k] = v
    return patch


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _self_signed(name: str, key: Path, cert: Path) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert))  # fmt: skip


def make_certificates(folder: Path, api_ip: str) -> None:
    """The cluster CA, the API server's certificate (the ``kubernetes`` Service's names
    and IP), and a self-signed serving certificate for kube-scheduler's stand-in."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, key = folder / "ca.crt", folder / "ca.key"
    _self_signed("twin-ca", key, ca)
    names = ",".join(
        [f"DNS:{n}" for n in ("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                              "kubernetes.default.svc.cluster.local")] + [f"IP:{api_ip}"]
    )  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=kube-apiserver",
             "-keyout", str(folder / "api.key"), "-out", str(folder / "api.csr"))  # fmt: skip
    ext = folder / "api.ext"
    ext.write_text(f"subjectAltName={names}\n")
    _openssl("x509", "-req", "-in", str(folder / "api.csr"), "-CA", str(ca), "-CAkey", str(key),
             "-CAcreateserial", "-days", "2", "-extfile", str(ext),
             "-out", str(folder / "api.crt"))  # fmt: skip
    serving = folder / "serving"
    serving.mkdir(exist_ok=True)
    _self_signed("kube-scheduler", serving / "tls.key", serving / "tls.crt")
    for f in (serving / "tls.key", serving / "tls.crt"):
        f.chmod(0o644)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> Obj:
    """Values as Helm merges ``--reuse-values`` with new ones: maps key by key."""
    out: Obj = dict(base)
    for k, v in over.items():
        out[k] = (
            _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


def _gpu_clock() -> float:
    """The simulated GPUs' clock: real time in steps of ``GPU_TICK_S`` (one noisy draw
    per step however often it is read, as ``harness.Twin.gpu_clock``)."""
    return math.floor(time.monotonic() / GPU_TICK_S) * GPU_TICK_S


STANDIN_CODE = "/run/powerflow-twin/standin"
"""Where kube-scheduler's stand-in finds the twin's own ``powerflow`` package (with the
lab, which the image leaves out): mounted there, first on its ``PYTHONPATH``."""


def kubescheduler_standin(argv: list[str]) -> list[str]:
    """kube-scheduler's command line, run as the stand-in: the flags stay, the binary
    becomes ``python -m powerflow.lab.twin.kubescheduler`` on the image's Python. The
    stand-in is the twin's, not a PowerFlow component, so it brings its code
    (``STANDIN_CODE``); the chart's own pods run the image as it is."""
    return [
        "/usr/bin/env",
        f"PYTHONPATH={STANDIN_CODE}",
        "/opt/powerflow/bin/python",
        "-m",
        "powerflow.lab.twin.kubescheduler",
        *argv[1:],
    ]


class ChartTwin:
    """The chart's system on the twin (module docstring)."""

    def __init__(
        self,
        folder: Path,
        *,
        image: str = "localhost/powerflow:dev",
        values: Mapping[str, Any] | None = None,
        gpu_nodes: int = 2,
        gpus_per_node: int = 8,
        helm: Path = REPO / ".tools" / "helm",
        seed: int = 0,
    ) -> None:
        self.folder, self.image_ref, self.helm = folder, image, helm
        repo, _, tag = image.rpartition(":")
        self.values: Obj = {"image": {"repository": repo, "tag": tag}, **(values or {})}
        self.gpu_nodes = tuple(f"node-{i}" for i in range(gpu_nodes))
        self.gpus_per_node, self.seed = gpus_per_node, seed
        self.net: Network | None = None
        self.mesh: ServiceMesh | None = None
        self.api: Process | None = None
        self.client: httpx.Client | None = None
        self.image: Image | None = None
        self.pods: PodKubelet | None = None
        self.workers: Kubelet | None = None
        self.gpu_server: GpuServer | None = None
        self.gpus: dict[str, TwinGpus] = {}
        self.objects: list[Obj] = []
        self.rendered: list[Obj] = []
        self.api_port = 0
        self.prometheus: Prometheus | None = None

    # -- start ---------------------------------------------------------------------
    def start(self) -> ChartTwin:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rendered = render(self.values, self.helm, self.folder / "values.yaml")
        self.objects = json.loads(json.dumps(self.rendered))
        """What ``apply`` applied (it fills in namespaces and cluster IPs); ``rendered``
        stays as Helm rendered it: the last release's manifest, for ``upgrade``."""
        self.api_port = free_port()
        self.api = apiserver_process(
            self.folder, self.api_port, [], enforce_rbac=True, extended_resource_toleration=True
        ).start()
        client = self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.api_port}",
            timeout=30.0,
            headers={"User-Agent": "twin-admin"},
        )
        net = self.net = Network().__enter__()
        self.mesh = ServiceMesh()
        api_ip = net.add_service_ip()
        make_certificates(self.folder / "pki", api_ip)
        self._kubernetes_service(api_ip)
        nodes: dict[str, Node] = {}
        for name in (*CONTROL_NODES, *self.gpu_nodes):
            ns = net.add_node(name)
            folder = self.folder / "nodes" / name
            (folder / "var/lib/kubelet/pod-resources").mkdir(parents=True, exist_ok=True)
            nodes[name] = Node(name, net.nodes[name], ns, folder)
            body = node_body(name, 0 if name in CONTROL_NODES else self.gpus_per_node)
            body["status"]["addresses"] = [{"type": "InternalIP", "address": net.nodes[name]}]
            if name in CONTROL_NODES:
                del body["metadata"]["labels"][contract.GPU_PRODUCT_LABEL]
            else:
                body["metadata"]["labels"]["nvidia.com/gpu.present"] = "true"
                body["spec"] = {"taints": [GPU_TAINT]}
            client.post("/api/v1/nodes", json=body).raise_for_status()
        for ns in ("default", "kube-system", "kube-node-lease", NAMESPACE, WORKLOAD_NAMESPACE):
            self._namespace(ns)
        for obj in BOOTSTRAP:
            self.apply(obj)
        self._gpus(nodes)
        for obj in sorted(self.objects, key=self._order):
            self.apply(obj)
        self.image = self.image or Image.mount(self.image_ref)  # _gpus may have mounted it
        self.pods = PodKubelet(
            client,
            self.image,
            nodes,
            self.folder / "pods",
            hosts=self._hosts,
            kubernetes_service=(api_ip, 443),
            images=Images(
                own=frozenset({self.image_ref}),
                standins={"registry.k8s.io/kube-scheduler:": kubescheduler_standin},
                standin_mounts=(Mount(REPO / "powerflow", f"{STANDIN_CODE}/powerflow", True),),
                serving=self.folder / "pki" / "serving",
            ),
        ).start()
        self.workers = Kubelet(
            f"http://127.0.0.1:{self.api_port}",
            self.gpus,
            dict.fromkeys(self.gpu_nodes, self._agent_port()),
            node_addresses=net.nodes,
            startup_s=1.0,
        ).start()

    def _order(self, obj: Obj) -> int:
        kind = obj.get("kind", "")
        return INSTALL_ORDER.index(kind) if kind in INSTALL_ORDER else len(INSTALL_ORDER)

    def _agent_port(self) -> int:
        for obj in self.objects:
            if obj.get("kind") == "DaemonSet":
                for c in obj["spec"]["template"]["spec"]["containers"]:
                    for p in c.get("ports") or []:
                        if p.get("hostPort"):
                            return int(p["hostPort"])
        raise ValueError("the chart's DaemonSet has no hostPort for the workers")

    def _gpus(self, nodes: dict[str, Node]) -> None:
        assert self.net is not None
        for i, name in enumerate(self.gpu_nodes):
            self.gpus[name] = TwinGpus(
                self.gpus_per_node, node=name, seed=self.seed + i, clock=_gpu_clock
            )
        self.gpu_server = GpuServer(
            self.gpus, self.folder / "gpu-server.key", host=self.net.gateway
        ).start()
        shim = Path(__file__).with_name("nvml_shim.py")
        for name in self.gpu_nodes:
            endpoint = self.folder / "nodes" / name / "gpus.json"
            self.gpu_server.endpoint_file(name, endpoint)
            endpoint.chmod(0o644)
            nodes[name].device_mounts = (
                Mount(endpoint, "/run/powerflow-twin/gpus.json", True),
                Mount(shim, self._pynvml_path(), True),
            )

    def _pynvml_path(self) -> str:
        """Where the image's ``pynvml`` module is (the path the shim is mounted over)."""
        image = Image.mount(self.image_ref) if self.image is None else self.image
        self.image = image
        found = glob.glob(str(image.rootfs / "opt/powerflow/lib/python3*/site-packages/pynvml.py"))
        if not found:
            raise FileNotFoundError("the image has no pynvml module to stand in for")
        return "/" + str(Path(found[0]).relative_to(image.rootfs))

    def _namespace(self, name: str) -> None:
        assert self.client is not None
        self.client.post(
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        ca = (self.folder / "pki" / "ca.crt").read_text()
        self.client.post(
            f"/api/v1/namespaces/{name}/configmaps",
            json={
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kube-root-ca.crt", "namespace": name},
                "data": {"ca.crt": ca},
            },
        )

    def _kubernetes_service(self, api_ip: str) -> None:
        """The ``kubernetes`` Service: TLS at its cluster IP, to the emulator's port."""
        assert self.mesh is not None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        pki = self.folder / "pki"
        context.load_cert_chain(pki / "api.crt", pki / "api.key")
        port = self.api_port
        self.mesh.add(Listener(api_ip, 443, lambda: [("127.0.0.1", port)], context))
        self.services = {("default", "kubernetes"): api_ip}

    def apply(self, obj: Obj) -> None:
        """Create ``obj`` as the admin does (``kubectl apply`` of a new object). The
        Prometheus Operator's kinds are not applied (the twin has no such operator):
        ``start_prometheus`` does what it would do with them."""
        assert self.client is not None and self.net is not None and self.mesh is not None
        kind = obj.get("kind", "")
        if kind in ("ServiceMonitor", "PrometheusRule"):
            obj.setdefault("metadata", {}).setdefault("namespace", NAMESPACE)
            return
        if kind not in PATHS:
            raise ValueError(f"the chart twin cannot apply a {kind}")
        prefix, plural = PATHS[kind]
        meta = obj.setdefault("metadata", {})
        if kind not in CLUSTER_SCOPED:
            meta.setdefault("namespace", NAMESPACE)
            path = f"{prefix}/namespaces/{meta['namespace']}/{plural}"
        else:
            path = f"{prefix}/{plural}"
        if kind == "Service" and obj["spec"].get("clusterIP") != "None":  # not headless
            ip = self.net.add_service_ip()
            obj["spec"]["clusterIP"] = ip
            self.services[(meta["namespace"], meta["name"])] = ip
            for port in obj["spec"].get("ports") or []:
                self.mesh.add(Listener(ip, int(port["port"]), self._endpoints(obj, port)))
        answer = self.client.post(path, json=obj)
        if answer.status_code >= 300:
            raise RuntimeError(f"{kind} {meta.get('name')}: {answer.status_code} {answer.text}")
        if kind == "Namespace":
            self._namespace(meta["name"])

    def _endpoints(self, service: Obj, port: Obj) -> Any:
        selector = service["spec"].get("selector") or {}
        namespace = service["metadata"]["namespace"]
        target: int | str = port.get("targetPort") or port["port"]
        label = ",".join(f"{k}={v}" for k, v in selector.items())

        def endpoints() -> list[tuple[str, int]]:
            if not selector:
                return []
            with httpx.Client(base_url=self._url, timeout=5) as c:
                pods = c.get(
                    f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": label}
                ).json()["items"]
            return [(p["status"]["podIP"], n) for p, n in ready_endpoints(selector, target, pods)]

        return endpoints

    def _hosts(self) -> str:
        lines = ["127.0.0.1\tlocalhost"]
        for (namespace, name), ip in self.services.items():
            fq = f"{name}.{namespace}.svc"
            lines.append(f"{ip}\t{fq}.cluster.local {fq} {name}.{namespace}")
        return "\n".join(lines) + "\n"

    def start_prometheus(self, port: int | None = None) -> Prometheus:
        """A real Prometheus scraping the chart's pods through its ServiceMonitors and
        evaluating its PrometheusRule (``monitoring``); stopped with the twin."""
        monitors = [o for o in self.objects if o.get("kind") == "ServiceMonitor"]
        if not monitors:
            raise ValueError("the chart rendered no ServiceMonitor (serviceMonitor.enabled)")
        rules = [o for o in self.objects if o.get("kind") == "PrometheusRule"]

        def lister(namespace: str, plural: str) -> list[Obj]:
            assert self.client is not None
            items: list[Obj] = self.client.get(f"/api/v1/namespaces/{namespace}/{plural}").json()[
                "items"
            ]
            return items

        self.prometheus = Prometheus(
            self.folder / "prometheus",
            monitors,
            lister,
            port=port or free_port(),
            rules=[g for r in rules for g in r["spec"]["groups"]],
        ).start()
        return self.prometheus

    def upgrade(self, values: Mapping[str, Any], image: str | None = None) -> None:
        """``helm upgrade`` with ``values`` over the release's (and ``image``, another
        tag of the built image): the chart rendered with its lookups against the live
        cluster; an object the new rendering lacks deleted unless it carries
        ``helm.sh/resource-policy: keep``; a new one created; every other one patched
        with Helm's three-way merge of the last release's rendering, the new one and
        the live object (``three_way``)."""
        assert self.client is not None and self.pods is not None
        if image is not None:
            repo, _, tag = image.rpartition(":")
            values = {**values, "image": {"repository": repo, "tag": tag}}
            own = self.pods.images.own | {image}
            self.pods.images = dataclasses.replace(self.pods.images, own=own)
        merged = _deep_merge(self.values, values)
        kubeconfig = write_kubeconfig(self.folder / "admin.kubeconfig", self._url)
        new = render(merged, self.helm, self.folder / "values-upgrade.yaml", kubeconfig)
        old = {_key(o): o for o in self.rendered}
        fresh = {_key(o): o for o in new}
        for key, obj in old.items():
            if key in fresh or key[0] not in PATHS:
                continue
            keep = (obj["metadata"].get("annotations") or {}).get("helm.sh/resource-policy")
            if keep != "keep":
                self.client.delete(self._path(obj))
        for key, obj in fresh.items():
            if key[0] not in PATHS:
                continue
            if key not in old:
                self.apply(json.loads(json.dumps(obj)))
                continue
            live = self.client.get(self._path(obj))
            live.raise_for_status()
            patch = three_way(old[key], obj, live.json())
            if patch:
                answer = self.client.patch(
                    self._path(obj),
                    content=json.dumps(patch),
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                if answer.status_code >= 300:
                    raise RuntimeError(f"upgrade: {key}: {answer.status_code} {answer.text}")
        self.values, self.rendered = merged, new
        self.objects = json.loads(json.dumps(new))

    def _path(self, obj: Obj) -> str:
        kind, namespace, name = _key(obj)
        prefix, plural = PATHS[kind]
        if kind in CLUSTER_SCOPED:
            return f"{prefix}/{plural}/{name}"
        return f"{prefix}/namespaces/{namespace}/{plural}/{name}"

    @property
    def _url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    # -- looking -------------------------------------------------------------------
    def chart_pods(self) -> list[Obj]:
        assert self.client is not None
        pods: list[Obj] = self.client.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
        return pods

    def pods_table(self) -> str:
        """``kubectl get pods -n powerflow -o wide``: name, ready, status, restarts, node."""
        rows = []
        for pod in self.chart_pods():
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            ready = sum(1 for s in statuses if s.get("ready"))
            restarts = sum(int(s.get("restartCount", 0)) for s in statuses) + sum(
                int(s.get("restartCount", 0))
                for s in (pod.get("status") or {}).get("initContainerStatuses") or []
            )
            rows.append(
                f"{pod['metadata']['name']:<40} {ready}/{len(pod['spec']['containers'])}  "
                f"{pod_status_text(pod):<28} {restarts:<3} {pod['spec'].get('nodeName', '')}"
            )
        return "NAME READY STATUS RESTARTS NODE\n" + "\n".join(rows)

    def logs(self, lines: int = 15) -> str:
        """Every container's log, its last ``lines`` (the pods' folders)."""
        out = []
        for path in sorted((self.folder / "pods").glob("*/containers/*/log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(
                f"--- {path.parent.parent.parent.name}/{path.parent.name}\n" + "\n".join(text)
            )
        return "\n".join(out)

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        """Until every chart pod (one per Deployment replica, one agent per GPU node) is
        Ready; else a RuntimeError with ``kubectl get pods`` and the logs."""
        expected = sum(
            int(o["spec"].get("replicas", 1)) for o in self.objects if o.get("kind") == "Deployment"
        ) + len(self.gpu_nodes) * sum(1 for o in self.objects if o.get("kind") == "DaemonSet")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pods = self.chart_pods()
            ready = [p for p in pods if pod_ready(p)]
            if len(ready) >= expected:
                return
            time.sleep(1.0)
        raise RuntimeError(
            f"chart pods not ready in {timeout_s:g} s:\n{self.pods_table()}\n{self.logs()}"
        )

    def dljob(self, body: Obj) -> None:
        assert self.client is not None
        ns = body["metadata"].setdefault("namespace", WORKLOAD_NAMESPACE)
        path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{ns}/{contract.PLURAL}"
        self.client.post(path, json=body).raise_for_status()

    def dljobs(self, namespace: str = WORKLOAD_NAMESPACE) -> list[Obj]:
        assert self.client is not None
        path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/{contract.PLURAL}"
        items: list[Obj] = self.client.get(path).json()["items"]
        return items

    # -- stop ----------------------------------------------------------------------
    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        for part in (self.workers, self.pods):
            if part is not None:
                part.stop()
        if self.gpu_server is not None:
            self.gpu_server.stop()
        if self.mesh is not None:
            self.mesh.stop()
        if self.api is not None:
            self.api.stop()
        if self.client is not None:
            self.client.close()
        if self.image is not None:
            self.image.unmount()
            self.image = None
        if self.net is not None:
            self.net.__exit__(None, None, None)
            self.net = None

    def __enter__(self) -> ChartTwin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
