"""The shipped KubeSchedulerConfiguration is one kube-scheduler v1 accepts, wired to our extender.

kubernetes-validate knows API kinds, not component configs, so the v1 field
names (k8s.io/kube-scheduler/config/v1, types.go) are written out below as a
strict JSON schema, plus the checks kube-scheduler's own validation makes on
extenders (positive weight, at most one binder, duration syntax).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml
from powerflow.extender import create_app

from powerflow.commands.extender import DEFAULT_PORT
from powerflow.core.contract import GPU_RESOURCE, SCHEDULER_NAME

CONFIG = Path(__file__).resolve().parent.parent / "helm/powerflow/files/kube-scheduler-config.yaml"


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "required": list(required),
    }


STRING, BOOL, INT = {"type": "string"}, {"type": "boolean"}, {"type": "integer"}
DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
ANY_OBJECT = {"type": "object"}

# k8s.io/kube-scheduler/config/v1: KubeSchedulerConfiguration and what it nests.
V1_SCHEMA = _obj(
    {
        "apiVersion": {"const": "kubescheduler.config.k8s.io/v1"},
        "kind": {"const": "KubeSchedulerConfiguration"},
        "parallelism": INT,
        "leaderElection": _obj(
            {
                "leaderElect": BOOL,
                "leaseDuration": DURATION,
                "renewDeadline": DURATION,
                "retryPeriod": DURATION,
                "resourceLock": STRING,
                "resourceName": STRING,
                "resourceNamespace": STRING,
            }
        ),
        "clientConnection": _obj(
            {
                "kubeconfig": STRING,
                "acceptContentTypes": STRING,
                "contentType": STRING,
                "qps": {"type": "number"},
                "burst": INT,
            }
        ),
        "enableProfiling": BOOL,
        "enableContentionProfiling": BOOL,
        "percentageOfNodesToScore": INT,
        "podInitialBackoffSeconds": INT,
        "podMaxBackoffSeconds": INT,
        "delayCacheUntilActive": BOOL,
        "profiles": {
            "type": "array",
            "items": _obj(
                {
                    "schedulerName": STRING,
                    "percentageOfNodesToScore": INT,
                    "plugins": ANY_OBJECT,
                    "pluginConfig": {"type": "array"},
                }
            ),
        },
        "extenders": {
            "type": "array",
            "items": _obj(
                {
                    "urlPrefix": STRING,
                    "filterVerb": STRING,
                    "preemptVerb": STRING,
                    "prioritizeVerb": STRING,
                    "weight": INT,
                    "bindVerb": STRING,
                    "enableHTTPS": BOOL,
                    "tlsConfig": _obj(
                        {
                            "insecure": BOOL,
                            "serverName": STRING,
                            "certFile": STRING,
                            "keyFile": STRING,
                            "caFile": STRING,
                            "certData": STRING,
                            "keyData": STRING,
                            "caData": STRING,
                        }
                    ),
                    "httpTimeout": DURATION,
                    "nodeCacheCapable": BOOL,
                    "managedResources": {
                        "type": "array",
                        "items": _obj({"name": STRING, "ignoredByScheduler": BOOL}, ("name",)),
                    },
                    "ignorable": BOOL,
                },
                ("urlPrefix",),
            ),
        },
    },
    ("apiVersion", "kind"),
)


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    return loaded


def test_matches_the_v1_field_names(config: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(V1_SCHEMA).validate(config)


def test_schema_rejects_misspelt_fields(config: dict[str, Any]) -> None:
    wrong = {**config, "extenders": [{**config["extenders"][0], "nodeCacheCapible": True}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(V1_SCHEMA).validate(wrong)
    lower = {**config, "extenders": [{**config["extenders"][0], "enableHttps": False}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(V1_SCHEMA).validate(lower)


def test_kubernetes_validate_has_no_schema_for_component_configs(config: dict[str, Any]) -> None:
    # Should a future kubernetes-validate know the kind, validate strictly with it.
    with contextlib.suppress(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(config, kubernetes_validate.latest_version(), strict=True)


def test_passes_kube_schedulers_extender_validation(config: dict[str, Any]) -> None:
    extenders = config["extenders"]
    assert sum(1 for e in extenders if e.get("bindVerb")) <= 1  # at most one binder
    for ext in extenders:
        if ext.get("prioritizeVerb"):
            assert ext["weight"] > 0
        for resource in ext.get("managedResources", []):
            assert re.fullmatch(r"[a-z0-9.-]+\.[a-z]+/[a-z0-9.-]+", resource["name"])


def test_wires_powerflow_scheduler_to_the_extender(config: dict[str, Any]) -> None:
    assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]
    (ext,) = config["extenders"]
    url = urlparse(ext["urlPrefix"])
    assert url.scheme == "http" and url.hostname == "127.0.0.1" and url.port == DEFAULT_PORT
    assert ext["nodeCacheCapable"] is True
    assert ext["ignorable"] is False
    assert ext["managedResources"] == [{"name": GPU_RESOURCE, "ignoredByScheduler": False}]
    # Every verb names a route the app serves, on the path kube-scheduler builds.
    paths = create_app(connect=False).openapi()["paths"]
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert "post" in paths[f"{url.path.rstrip('/')}/{ext[verb]}"]


def test_every_feasible_node_reaches_the_extender(config: dict[str, Any]) -> None:
    """kube-scheduler samples feasible nodes on clusters of 100+ unless told 100%; the
    extender would then not see the nodes of a gang's block. No profile may lower it."""
    assert config["percentageOfNodesToScore"] == 100
    assert all(p.get("percentageOfNodesToScore", 100) == 100 for p in config["profiles"])
