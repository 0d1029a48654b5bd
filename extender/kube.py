"""The few Kubernetes API calls the extender makes, over one async httpx client.

Async end to end, so a bind or a watch never blocks the event loop that
answers the scheduler. The kubeconfig (or in-cluster service account) is read
with the ``kubernetes`` client's loaders, which know every auth flavour; the
requests themselves go through httpx.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import yaml

from powerflow import __version__
from powerflow.core.contract import GROUP, PLURAL, VERSION
from powerflow.core.errors import PowerFlowError
from powerflow.kubeapi import backoff

log = logging.getLogger(__name__)

RETRY_AFTER_TRIES = 10
"""A read answered 429, or 5xx, with a ``Retry-After`` is asked again after the seconds
it names, up to this many times, as client-go's REST client does (``maxRetries``,
``checkWait``): the API server's priority and fairness says when to come back, and the
mirror's own back-off (up to 30 s, for failures that do not say) is not spent on it."""

LIST_PAGE = 500
"""Objects per page of a LIST (kubectl's and the operator's ``limit``)."""

NODES_PATH = "/api/v1/nodes"
PODS_PATH = "/api/v1/pods"
DLJOBS_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"


class ApiError(PowerFlowError):
    """The API server refused a request (``status`` is its HTTP code; ``retry_after_s``
    the wait its ``Retry-After`` asked for, if any)."""

    def __init__(self, message: str, status: int = 0, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class ApiUnreachable(ApiError):
    """No answer from the API server at all (connection refused, timeout, TLS)."""


class WatchExpired(ApiError):
    """The watch's resourceVersion is too old (410 Gone): relist."""


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate to it."""

    host: str
    ssl_context: ssl.SSLContext | None = None
    token: Callable[[], str | None] | None = None


def load_connection(kubeconfig: str | None = None, in_cluster: bool = False) -> Connection:
    """Read a kubeconfig file (default: ``$KUBECONFIG``/``~/.kube/config``) or the pod's account.

    Raises ``ApiUnreachable`` when there is no usable configuration, so that
    the extender can start anyway and say why it is not ready.
    """
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    where = "in-cluster service account" if in_cluster else (kubeconfig or "default kubeconfig")
    if kubeconfig and not in_cluster and not os.path.isfile(kubeconfig):
        what = "is not a file" if os.path.exists(kubeconfig) else "does not exist"
        raise ApiUnreachable(f"no Kubernetes configuration: the kubeconfig {kubeconfig} {what}")
    cfg = k8s_client.Configuration()
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)
        else:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        context: ssl.SSLContext | None = None
        if cfg.host.startswith("https"):
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if not cfg.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)
    except yaml.YAMLError as exc:
        problem = str(exc).replace("\n", " ")
        raise ApiUnreachable(
            f"no Kubernetes configuration ({where}): not valid YAML: {problem}"
        ) from exc
    except k8s_config.ConfigException as exc:
        raise ApiUnreachable(f"no Kubernetes configuration ({where}): {exc}") from exc
    except Exception as exc:  # the loaders fail on odd files in many ways; say which
        raise ApiUnreachable(
            f"no Kubernetes configuration ({where}): {type(exc).__name__}: {exc}"
        ) from exc

    def token() -> str | None:
        """The ``Authorization`` header as the client would send it, read at each request:
        ``auth_settings`` knows where each client version keeps the token (``BearerToken``
        since v12, ``authorization`` before) and calls the refresh hook of exec plugins."""
        settings: Any = cfg.auth_settings()  # a TypedDict per client version
        for setting in settings.values():
            if setting.get("in") == "header" and str(setting.get("key")).lower() == "authorization":
                value = setting.get("value")
                return str(value) if value else None
        return None

    return Connection(host=cfg.host.rstrip("/"), ssl_context=context, token=token)


def retry_after_s(response: httpx.Response) -> int | None:
    """The whole seconds a 429 or 5xx answer's ``Retry-After`` asks to wait
    (``powerflow.kubeapi.backoff.retry_after_s``: bounded, seconds only), or None."""
    return backoff.retry_after_s(response.status_code, response.headers.get("Retry-After"))


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return response.reason_phrase


class KubeApi:
    """List, watch, get, bind and patch: everything the extender asks of the API server."""

    def __init__(self, connection: Connection, timeout_s: float = 10.0) -> None:
        self.connection = connection
        self._client = httpx.AsyncClient(
            base_url=connection.host,
            verify=connection.ssl_context or True,
            timeout=httpx.Timeout(timeout_s),
            # Named as the operator and the node agent name themselves, so that the API
            # server's audit log and its priority-and-fairness rules can tell it apart.
            headers={"User-Agent": f"powerflow-extender/{__version__}"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _headers(self) -> dict[str, str]:
        token = self.connection.token() if self.connection.token else None
        return {"Authorization": token} if token else {}

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self._headers(), **kwargs.pop("headers", {})}
        try:
            return await self._client.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiUnreachable(
                f"Kubernetes API {self.connection.host} unreachable: {type(exc).__name__}: {exc}"
            ) from exc

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self._request(method, path, **kwargs)
        tries = 1
        # Reads only: a write answered 5xx may have been committed (the bind reads the
        # pod back to tell), and is not sent twice here.
        while method == "GET" and tries < RETRY_AFTER_TRIES:
            wait_s = retry_after_s(response)
            if wait_s is None:
                break
            await asyncio.sleep(wait_s)
            response = await self._request(method, path, **kwargs)
            tries += 1
        if response.status_code >= 400:
            raise ApiError(
                f"{method} {path}: {response.status_code} {_message(response)}",
                response.status_code,
                retry_after_s(response),
            )
        body = response.json()
        return body if isinstance(body, dict) else {}

    async def list(self, path: str) -> tuple[list[dict[str, Any]], str]:
        """All objects at ``path`` and the list's resourceVersion to watch from, page by
        page (``LIST_PAGE``): one answer with every pod of a large cluster may not start
        within the client's 10 s; a continue token the server has forgotten is a 410
        (``ApiError``: the mirror lists again after its back-off)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            params = {"limit": str(LIST_PAGE), **({"continue": token} if token else {})}
            body = await self._json("GET", path, params=params)
            items.extend(i for i in body.get("items") or [] if isinstance(i, dict))
            meta = body.get("metadata") or {}
            token = meta.get("continue") if isinstance(meta, dict) else None
            if not token:
                version = meta.get("resourceVersion") if isinstance(meta, dict) else None
                return items, str(version or "")

    async def watch(
        self, path: str, resource_version: str, timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Events after ``resource_version`` until the server ends the watch."""
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        if resource_version:
            params["resourceVersion"] = resource_version
        try:
            async with self._client.stream(
                "GET",
                path,
                params=params,
                headers=self._headers(),
                timeout=httpx.Timeout(10.0, read=timeout_s + 30.0),
            ) as response:
                if response.status_code == 410:
                    raise WatchExpired(f"watch {path}: resourceVersion too old", 410)
                if response.status_code >= 400:
                    await response.aread()
                    raise ApiError(
                        f"watch {path}: {response.status_code} {_message(response)}",
                        response.status_code,
                        retry_after_s(response),
                    )
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except (ValueError, RecursionError) as exc:
                        log.warning("skipping an unreadable event of watch %s: %s", path, exc)
                        continue
                    if not isinstance(event, dict):
                        continue
                    kind, obj = event.get("type"), event.get("object")
                    if kind == "ERROR":
                        code = int((obj or {}).get("code") or 0)
                        if code == 410:
                            raise WatchExpired(f"watch {path}: {_status_message(obj)}", 410)
                        raise ApiError(f"watch {path}: {_status_message(obj)}", code)
                    if isinstance(kind, str) and isinstance(obj, dict):
                        yield kind, obj
        except httpx.HTTPError as exc:
            raise ApiUnreachable(
                f"watch {path} on {self.connection.host} broke: {type(exc).__name__}: {exc}"
            ) from exc

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._json("GET", _pod_path(namespace, name))

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> int:
        """POST the pod's ``binding``; returns the status code (201, or 409 when already bound)."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        if annotations:
            metadata["annotations"] = annotations
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        response = await self._request("POST", _pod_path(namespace, name) + "/binding", json=body)
        if response.status_code in (200, 201, 409):
            return response.status_code
        raise ApiError(
            f"binding {namespace}/{name} to {node}: {response.status_code} {_message(response)}",
            response.status_code,
        )


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def _status_message(obj: Any) -> str:
    if isinstance(obj, dict) and isinstance(obj.get("message"), str):
        return str(obj["message"])
    return "error event"
