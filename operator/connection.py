"""Where the operator's Kubernetes configuration comes from: one loader for both clients.

The operator talks to the API server through two clients: kopf (its watches,
with its own aiohttp session) and the official ``kubernetes`` client (the
allocation loop's reads and writes, the Lease). Both must use the same
cluster and credentials, so ``load_configuration`` is the only place that
reads them; kopf's login handler (``connection_info``) and the ``ApiClient``
both start from its result.

Order, as kopf's own ``login_via_client`` does it, except that an explicit
file wins: ``--kubeconfig FILE`` when given; else the pod's service account
when running in a pod (``KUBERNETES_SERVICE_HOST`` set); else ``$KUBECONFIG``
(a ``:``-separated list is merged, as kubectl does), else ``~/.kube/config``.
The path is resolved here, not by the ``kubernetes`` package, which reads
``$KUBECONFIG`` once at import.

No usable configuration is a ``ConnectionConfigError`` whose message is one
line naming the source and what is wrong: the command prints it and exits 2
instead of letting kopf retry logins with tracebacks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import kopf
import kubernetes

from powerflow.errors import PowerFlowError

DEFAULT_KUBECONFIG = "~/.kube/config"


class ConnectionConfigError(PowerFlowError):
    """No usable Kubernetes configuration (in-cluster or kubeconfig)."""


@dataclass(frozen=True)
class Source:
    """Where to read the configuration: a kubeconfig path (list) or the pod's account."""

    kubeconfig: str | None
    """``None``: the in-cluster service account."""

    def describe(self) -> str:
        return "in-cluster service account" if self.kubeconfig is None else self.kubeconfig


def resolve_source(kubeconfig: str | None, environ: dict[str, str] | None = None) -> Source:
    """The source for ``--kubeconfig`` (``None`` when not given) in this environment."""
    env = dict(os.environ) if environ is None else environ
    if kubeconfig:
        return Source(kubeconfig)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return Source(None)
    return Source(env.get("KUBECONFIG") or os.path.expanduser(DEFAULT_KUBECONFIG))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def load_configuration(source: Source) -> kubernetes.client.Configuration:
    """A fresh client configuration (fresh token) from ``source``, or one clear error."""
    cfg = kubernetes.client.Configuration()
    try:
        if source.kubeconfig is None:
            kubernetes.config.load_incluster_config(client_configuration=cfg)
        else:
            paths = [p for p in source.kubeconfig.split(os.pathsep) if p]
            missing = [p for p in paths if not Path(p).is_file()]
            if missing and len(missing) == len(paths):
                raise ConnectionConfigError(f"kubeconfig {source.kubeconfig}: no such file")
            kubernetes.config.load_kube_config(
                config_file=source.kubeconfig, client_configuration=cfg, persist_config=False
            )
    except ConnectionConfigError:
        raise
    except kubernetes.config.ConfigException as exc:
        raise ConnectionConfigError(f"{source.describe()}: {_one_line(exc)}") from None
    except Exception as exc:  # the loaders raise YAML, type and OS errors on garbage
        raise ConnectionConfigError(
            f"{source.describe()}: not a usable kubeconfig ({type(exc).__name__}: {_one_line(exc)})"
        ) from None
    if not cfg.host or cfg.host == "http://localhost":
        # The client's default host: the file named no server.
        raise ConnectionConfigError(f"{source.describe()}: no cluster server in the configuration")
    return cfg


def api_client(
    cfg: kubernetes.client.Configuration, user_agent: str
) -> kubernetes.client.ApiClient:
    """The ``kubernetes`` client of the allocation loop; ``user_agent`` names the replica
    (API audit logs and the emulator's request log tell replicas apart by it)."""
    api = kubernetes.client.ApiClient(cfg)
    api.user_agent = user_agent
    return api


def connection_info(cfg: kubernetes.client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials for the same configuration (as kopf's ``login_via_client``)."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else parts
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )
