"""Validate custom resources against a CRD's openAPIV3Schema, as the API server would.

``kubernetes-validate`` knows built-in kinds and the CRD kind itself, not the
custom resources a CRD defines. The API server's structural schema is close to
JSON Schema Draft 4; the differences that matter here: ``nullable``, the
``x-kubernetes-*`` extensions, and strict field validation rejecting unknown
fields wherever ``x-kubernetes-preserve-unknown-fields`` is not set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml


def to_draft4(schema: dict[str, Any]) -> dict[str, Any]:
    """Translate one structural schema node (recursively) into Draft 4."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: to_draft4(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_draft4(value)
        else:
            out[key] = value
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in schema and "additionalProperties" not in schema and not preserve:
        out["additionalProperties"] = False
    return out


def crd_validator(crd_path: Path, version: str) -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(crd_path.read_text())
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            schema = to_draft4(served["schema"]["openAPIV3Schema"])
            jsonschema.Draft4Validator.check_schema(schema)
            return jsonschema.Draft4Validator(schema)
    raise KeyError(version)
