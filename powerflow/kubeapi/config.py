"""Where a component's Kubernetes configuration comes from, and one-line errors.

Order, as kopf's own ``login_via_client`` does it, except that an explicit
file wins: ``--kubeconfig FILE`` when given; else the pod's service account
when running in a pod (``KUBERNETES_SERVICE_HOST`` set: a Deployment or a
DaemonSet); else ``$KUBECONFIG`` (a ``:``-separated list is merged, as
kubectl does), else ``~/.kube/config``. The path is resolved here, not by
the ``kubernetes`` package, which reads ``$KUBECONFIG`` once at import.

No usable configuration is a ``KubeConfigError`` whose message is one line
naming the source and what is wrong: the commands print it and exit 2
rather than retrying logins with tracebacks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import kubernetes

from powerflow.core.errors import PowerFlowError

DEFAULT_KUBECONFIG = "~/.kube/config"
IN_CLUSTER = "in-cluster service account"


class KubeConfigError(PowerFlowError):
    """No usable Kubernetes configuration (in-cluster or kubeconfig)."""


@dataclass(frozen=True)
class Source:
    """Where to read the configuration: a kubeconfig path (list) or the pod's account."""

    kubeconfig: str | None
    """``None``: the in-cluster service account."""

    def describe(self) -> str:
        return IN_CLUSTER if self.kubeconfig is None else self.kubeconfig


def resolve_source(kubeconfig: str | None, environ: dict[str, str] | None = None) -> Source:
    """The source for ``--kubeconfig`` (``None`` when not given) in this environment."""
    env = dict(os.environ) if environ is None else environ
    if kubeconfig:
        return Source(kubeconfig)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return Source(None)
    return Source(env.get("KUBECONFIG") or os.path.expanduser(DEFAULT_KUBECONFIG))


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (YAML errors span several), else its type."""
    return " ".join(str(exc).split()) or type(exc).__name__


def load_configuration(source: Source) -> kubernetes.client.Configuration:
    """A fresh client configuration (a fresh token: call again to re-read one the kubelet
    rotated) from ``source``, or one clear ``KubeConfigError``."""
    cfg = kubernetes.client.Configuration()
    try:
        if source.kubeconfig is None:
            kubernetes.config.load_incluster_config(client_configuration=cfg)
        else:
            paths = [p for p in source.kubeconfig.split(os.pathsep) if p]
            if not any(Path(p).is_file() for p in paths):
                raise KubeConfigError(f"kubeconfig {source.kubeconfig}: no such file")
            kubernetes.config.load_kube_config(
                config_file=source.kubeconfig, client_configuration=cfg, persist_config=False
            )
    except KubeConfigError:
        raise
    except kubernetes.config.ConfigException as exc:
        raise KubeConfigError(f"{source.describe()}: {one_line(exc)}") from None
    except Exception as exc:  # the loaders raise YAML, type and OS errors on garbage
        what = "configuration" if source.kubeconfig is None else "kubeconfig"
        raise KubeConfigError(
            f"{source.describe()}: not a usable {what} ({type(exc).__name__}: {one_line(exc)})"
        ) from None
    if not cfg.host or cfg.host == "http://localhost":
        # The client's default host: the file named no server.
        raise KubeConfigError(f"{source.describe()}: no cluster server in the configuration")
    return cfg
