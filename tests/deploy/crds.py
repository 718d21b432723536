"""Custom resources checked against their real CRD schemas, offline.

tests/deploy/crds/*.json hold the `v1` openAPIV3Schema of each CRD the deploy files use,
taken from the upstream CRDs (prometheus-operator v0.93.0, KubeRay v1.7.0; the `source`
field names the file) with the descriptions removed. An API server with strict field
validation (kubectl's default) refuses unknown fields, so every object schema that lists
its properties is closed here too (unless it says x-kubernetes-preserve-unknown-fields).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

CRDS = Path(__file__).with_name("crds")


@functools.cache
def _schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(path.read_text())
        out[crd["kind"]] = crd
    return out


def kinds() -> set[str]:
    return set(_schemas())


def _closed(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def _validator(kind: str) -> jsonschema.protocols.Validator:
    schema = _closed(_schemas()[kind]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError (naming the path) if `doc` breaks its CRD."""
    crd = _schemas()[doc["kind"]]
    expected = f"{crd['group']}/{crd['version']}"
    if doc["apiVersion"] != expected:
        raise jsonschema.ValidationError(f"apiVersion {doc['apiVersion']} != {expected}")
    _validator(doc["kind"]).validate(doc)
