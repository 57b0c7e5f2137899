"""Argo Workflows v4.1.2's JSON schema, made strict, for validating rendered manifests.

The schema is vendored in `tests/fixtures/argo/` (Apache-2.0, see its README and LICENSE),
so these checks run wherever the tests do, the hosted CI included. Two adjustments:

- `IntOrString` is declared as a string but Kubernetes accepts an integer too;
- every object definition listing `properties` gets `additionalProperties: false`, so a
  misspelled or invented field fails validation instead of passing silently.

Argo Events' EventSource and Sensor are in the same file; their definitions list no
apiVersion/kind (checked separately here), and a trigger's embedded `resource` is declared as
bytes though it is any object: it is validated as what it is (a Workflow) by the caller.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "tests" / "fixtures" / "argo" / "workflow-schema-v4.1.2.json"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# Argo Events' embedded Kubernetes object (a Sensor trigger's resource), declared as bytes.
K8S_RESOURCE = "github.com.argoproj.argo_events.pkg.apis.events.v1alpha1.K8SResource"
EVENTS = "github.com.argoproj.argo_events.pkg.apis.events.v1alpha1."
WORKFLOWS = "io.argoproj.workflow.v1alpha1."


def strict(schema: dict) -> dict:
    """A copy of `schema` with IntOrString widened and unknown fields rejected."""
    schema = copy.deepcopy(schema)
    defs = schema["definitions"]
    defs[INT_OR_STRING] = {"type": ["string", "integer"]}
    defs[K8S_RESOURCE] = {"type": "object"}
    for definition in defs.values():
        if "properties" in definition and "additionalProperties" not in definition:
            definition["additionalProperties"] = False
    return schema


@functools.cache
def _strict_schema() -> dict:
    return strict(json.loads(SCHEMA_PATH.read_text()))


@functools.cache
def validator(kind: str):
    """A validator of one kind (Workflow, CronWorkflow, ..., EventSource, Sensor).

    Validating against the kind's own definition gives precise errors: the schema's top-level
    oneOf would only say that nothing matched.
    """
    import jsonschema

    schema = _strict_schema()
    ref = (EVENTS if kind in ("EventSource", "Sensor") else WORKFLOWS) + kind
    if ref not in schema["definitions"]:
        raise AssertionError(f"kind {kind!r} is not an Argo kind")
    one = {"$schema": schema.get("$schema"), "definitions": schema["definitions"]}
    one["$ref"] = f"#/definitions/{ref}"
    return jsonschema.validators.validator_for(schema)(one)


def errors(manifest: dict) -> list[str]:
    """Every schema violation of `manifest`, as `path: message` lines (empty when valid)."""
    kind = str(manifest.get("kind"))
    out = []
    if kind in ("EventSource", "Sensor"):
        if manifest.get("apiVersion") != "argoproj.io/v1alpha1":
            out.append(f"apiVersion: {manifest.get('apiVersion')!r} is not argoproj.io/v1alpha1")
        manifest = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
    v = validator(kind)
    for err in sorted(v.iter_errors(manifest), key=lambda e: [str(p) for p in e.path]):
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        out.append(f"{where}: {err.message}")
    return out
