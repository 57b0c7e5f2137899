"""ConfigMap and Secret references, read from the run's object store (objects.py), where
`ckptflow run --objects FILE` put them: `configMapKeyRef` parameters, `secretKeyRef` /
`configMapKeyRef` env, and `secret` / `configMap` volumes.

Argo resolves a parameter's `valueFrom.configMapKeyRef` when it starts the workflow (global
arguments) or the template (inputs) (workflow/controller/operator.go, util GetConfigMapValue);
the kubelet fills env from a key and projects a volume's keys as files
(pkg/kubelet/kubelet_pods.go makeEnvironmentVariables; pkg/volume/secret, pkg/volume/configmap).
"""

from __future__ import annotations

import base64
import binascii
import copy
import os
from pathlib import Path

from ckptflow.workflows.runner.document import SpecError
from ckptflow.workflows.runner.objects import ObjectStore

__all__ = [
    "env_value",
    "key_value",
    "missing_volume_objects",
    "project_volume",
    "resolve_parameter_refs",
]

_KINDS = {"configMapKeyRef": "ConfigMap", "secretKeyRef": "Secret"}
_VOLUMES = {"configMap": ("ConfigMap", "name"), "secret": ("Secret", "secretName")}
# a key names a file in a projected volume (validation: IsConfigMapKey)
_KEY_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _data(obj: dict) -> dict[str, bytes]:
    """An object's keys as bytes: a Secret's `data` is base64, `stringData` plain; a
    ConfigMap's `data` plain, `binaryData` base64. ValueError for a damaged value."""
    out: dict[str, bytes] = {}
    b64 = ("data", "binaryData") if obj.get("kind") == "Secret" else ("binaryData",)
    plain = ("stringData",) if obj.get("kind") == "Secret" else ("data",)
    for field in (*b64, *plain):
        values = obj.get(field) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{field} must be a mapping")
        for key, value in values.items():
            text = "" if value is None else str(value)
            if field in b64:
                try:
                    out[str(key)] = base64.b64decode(text, validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError(f"{field}.{key} is not base64") from None
            else:
                out[str(key)] = text.encode()
    return out


def key_value(
    objects: ObjectStore, ref_kind: str, ref: dict, namespace: str | None = None
) -> str | None:
    """The value of `configMapKeyRef`/`secretKeyRef` {name, key} (None when the object or key
    is absent); ValueError for a damaged object."""
    kind = _KINDS[ref_kind]
    obj = objects.get(kind, str((ref or {}).get("name")), namespace)
    if obj is None:
        return None
    value = _data(obj).get(str((ref or {}).get("key")))
    return None if value is None else value.decode(errors="replace")


def env_value(objects: ObjectStore, value_from: dict) -> str | None:
    """An env var's value from a `secretKeyRef`/`configMapKeyRef` in the store, else None."""
    for ref_kind in _KINDS:
        if isinstance(value_from.get(ref_kind), dict):
            try:
                return key_value(objects, ref_kind, value_from[ref_kind])
            except ValueError:
                return None  # a damaged object: refused before the run (spec.py)
    return None


def _resolve_one(objects: ObjectStore, p: dict, where: str) -> dict:
    vf = p.get("valueFrom") or {}
    ref = vf.get("configMapKeyRef")
    if not isinstance(ref, dict):
        return p
    try:
        value = key_value(objects, "configMapKeyRef", ref)
    except ValueError as exc:
        raise SpecError(f"{where}: ConfigMap {ref.get('name')!r}: {exc}") from None
    if value is None:
        if vf.get("default") is not None:
            value = str(vf["default"])
        elif ref.get("optional"):
            value = ""
        else:
            raise SpecError(
                f"{where}: parameters.{p.get('name')}.valueFrom.configMapKeyRef: ConfigMap "
                f"{ref.get('name')!r} key {ref.get('key')!r} is not in the cluster model; give "
                "the ConfigMap with --objects FILE"
            )
    out = {k: v for k, v in p.items() if k != "valueFrom"}
    out["value"] = value
    return out


def resolve_parameter_refs(spec: dict, objects: ObjectStore) -> dict:
    """A copy of the spec with every `valueFrom.configMapKeyRef` parameter (workflow arguments,
    template inputs) replaced by its value from the store; SpecError naming a missing one."""
    out = copy.deepcopy(spec)
    args = out.get("arguments")
    if isinstance(args, dict) and isinstance(args.get("parameters"), list):
        args["parameters"] = [
            _resolve_one(objects, p, "spec.arguments") if isinstance(p, dict) else p
            for p in args["parameters"]
        ]
    for t in out.get("templates") or []:
        inputs = t.get("inputs") if isinstance(t, dict) else None
        if isinstance(inputs, dict) and isinstance(inputs.get("parameters"), list):
            where = f"template {t.get('name')!r} inputs"
            inputs["parameters"] = [
                _resolve_one(objects, p, where) if isinstance(p, dict) else p
                for p in inputs["parameters"]
            ]
    return out


def missing_volume_objects(vol: dict, objects: ObjectStore) -> str | None:
    """Why a `secret`/`configMap` volume cannot be projected (None when it can)."""
    for field, (kind, name_key) in _VOLUMES.items():
        if field in vol:
            src = vol[field] or {}
            name = src.get(name_key)
            obj = objects.get(kind, str(name))
            if obj is None and not src.get("optional"):
                return f"{kind} {name!r} is not in the cluster model; give it with --objects FILE"
            try:
                _data(obj or {})
            except ValueError as exc:
                return f"{kind} {name!r}: {exc}"
    return None


def project_volume(vol: dict, objects: ObjectStore, dest: Path) -> None:
    """Write a secret/configMap volume's keys (or its `items`) as files under `dest`, read-only
    as the kubelet makes them (defaultMode 0644); ValueError (one line) for what it cannot."""
    field = next(f for f in _VOLUMES if f in vol)
    kind, name_key = _VOLUMES[field]
    src = vol[field] or {}
    obj = objects.get(kind, str(src.get(name_key)))
    if obj is None:
        if src.get("optional"):
            dest.mkdir(parents=True, exist_ok=True)
            return
        raise ValueError(f"{kind} {src.get(name_key)!r} is not in the cluster model")
    data = _data(obj)
    items = src.get("items")
    pairs = (
        [(str(i.get("key")), str(i.get("path"))) for i in items]
        if items
        else [(k, k) for k in data]
    )
    mode = int(src.get("defaultMode") or 0o644)
    dest.mkdir(parents=True, exist_ok=True)
    for key, rel in pairs:
        if key not in data:
            raise ValueError(f"{kind} {src.get(name_key)!r} has no key {key!r}")
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or not all(set(p) <= _KEY_OK and p for p in parts):
            raise ValueError(
                f"{kind} {src.get(name_key)!r}: path {rel!r} is not a relative file name"
            )
        target = dest.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            os.chmod(target, 0o600)
        target.write_bytes(data[key])
        os.chmod(target, mode & 0o777)
