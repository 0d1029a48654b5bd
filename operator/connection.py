"""Where the operator's Kubernetes configuration comes from: one loader for both clients.

The operator talks to the API server through two clients: kopf (its watches,
with its own aiohttp session) and the official ``kubernetes`` client (the
allocation loop's reads and writes, the Lease). Both must use the same
cluster and credentials, so ``load_configuration`` is the only place that
reads them; kopf's login handler (``connection_info``) and the ``ApiClient``
both start from its result.

The rules (``--kubeconfig``, else in a pod its service account, else
``$KUBECONFIG``, else ``~/.kube/config``; one-line errors, which the command
prints before exiting 2 instead of letting kopf retry logins with
tracebacks) are ``powerflow.kubeapi.config``'s, shared with the node agent;
this module keeps the operator's names for them and adds the two clients.
"""

from __future__ import annotations

import kopf
import kubernetes

from powerflow.kubeapi.client import TimedApiClient
from powerflow.kubeapi.config import KubeConfigError as ConnectionConfigError
from powerflow.kubeapi.config import Source, load_configuration, resolve_source

__all__ = [
    "ConnectionConfigError",
    "Source",
    "api_client",
    "connection_info",
    "load_configuration",
    "resolve_source",
]


def api_client(
    cfg: kubernetes.client.Configuration, user_agent: str
) -> kubernetes.client.ApiClient:
    """The ``kubernetes`` client of the allocation loop; ``user_agent`` names the replica
    (API audit logs and the emulator's request log tell replicas apart by it)."""
    api = TimedApiClient(cfg)  # every call times out (powerflow.kubeapi.client)
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
