"""The vendored CRD schemas (``crds/``) as JSON Schemas that ``jsonschema`` checks a manifest against, as the
API server would: every object with properties rejects fields it does not know (the API server prunes them,
silently: a misspelled field would be lost) unless it says ``x-kubernetes-preserve-unknown-fields``;
``x-kubernetes-int-or-string`` is an integer or a string; other ``x-kubernetes-*`` keys are ignored."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).with_name("crds")
SCHEMAS = {"PyTorchJob": "pytorchjob-v1.9.0.yaml", "JobSet": "jobset-v0.12.0.yaml"}


def strict(node: Any) -> Any:
    if isinstance(node, list):
        return [strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@functools.cache
def schema(kind: str) -> dict[str, Any]:
    return strict(yaml.safe_load((CRDS / SCHEMAS[kind]).read_text()))


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema's ValidationError unless ``doc`` (a PyTorchJob or a JobSet) fits its CRD."""
    import jsonschema

    jsonschema.validate(doc, schema(doc["kind"]))
