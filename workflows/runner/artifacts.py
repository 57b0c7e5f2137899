"""Input and output artifacts of a local run, kept in the workflow's artifact repository.

What Argo's executor does around a pod, done around a local process:

- before it starts, each input artifact is loaded to its `path` (from an argument's `from:
  "{{steps.X.outputs.artifacts.Y}}"` / `{{tasks...}}` / `{{inputs.artifacts.Z}}` /
  `{{workflow.outputs.artifacts.G}}`, `raw.data`, or `s3.key` in the run's repository), optionally
  narrowed to a `subPath` and given a `mode`; `optional` ones that are absent are skipped;
- after it succeeded, each output artifact's `path` is saved (a gzipped tar by default, as is with
  `archive: none`) under `s3.key` or `<workflow>/<pod>/<name>[.tgz]`; a missing `optional` one is
  skipped, any other makes the node Error;
- DAG/steps templates pass artifacts of their children on (`outputs.artifacts[].from`), and
  `globalName` exports one as `{{workflow.outputs.artifacts.NAME}}`.

Artifact paths are private to the node, like a pod's filesystem (artifact_paths.py: mapped
after substitution, cleaned by Argo's rule, refused with one line when they would leave it).
A reference is passed through `{{...}}` substitution as a small JSON object (`{"name":..., "key":...}`), so the runner's variables carry it unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ckptflow.workflows.runner.artifact_paths import (
    clean_path,
    inside,
    map_paths,
    resolve_paths,
    template_artifacts,
)
from ckptflow.workflows.runner.artifact_repo import ArtifactError, Repository, pack, unpack
from ckptflow.workflows.runner.expr import ExprError, evaluate, expand
from ckptflow.workflows.runner.substitution import to_str, unresolved

__all__ = [
    "artifact_problems",
    "bind",
    "clean_path",
    "input_values",
    "map_paths",
    "output_values",
    "ref_json",
    "resolve_paths",
    "save_outputs",
    "stage_inputs",
    "template_artifacts",
]

_ELSEWHERE = ("http", "git", "gcs", "azure", "oss", "hdfs", "artifactory", "huggingFace", "plugin")
_FIELDS = {
    "inputs": {"name", "path", "raw", "s3", "optional", "mode", "from"},
    "outputs": {"name", "path", "archive", "optional", "s3", "globalName", "from"}
    | {"fromExpression"},  # a DAG/steps template's output, evaluated by expr.py
    "arguments": {"name", "from", "raw", "s3", "subPath", "optional", "path", "mode"},
}
_IGNORED = {"artifactGC", "deleted", "archiveLogs", "recurseMode"}


def ref_json(name: str, key: str) -> str:
    """The `{{...outputs.artifacts.X}}` value: a JSON reference to a stored artifact."""
    return json.dumps({"name": name, "key": key}, separators=(",", ":"), sort_keys=True)


def _parse_ref(text: str) -> dict | None:
    try:
        ref = json.loads(text)
    except ValueError:
        return None
    return ref if isinstance(ref, dict) and isinstance(ref.get("key"), str) else None


def _path_problem(a: dict, kind: str) -> str | None:
    """Why an artifact's written path is refused before the run (a path holding a parameter is
    checked again once substituted, `resolve_paths`)."""
    raw = a.get("path")
    if kind == "arguments" or raw is None:
        return None
    path = to_str(raw)
    if path.startswith("{{"):  # a whole parameter: only its value can tell
        return None
    try:
        clean_path(a["name"], path)
    except ValueError as exc:
        return str(exc)
    return None


def artifact_problems(block: Any, kind: str) -> list[tuple[str, str]]:
    """(field, why) for each artifact of an inputs/outputs/arguments block the runner refuses."""
    problems: list[tuple[str, str]] = []
    for a in block or []:
        if not isinstance(a, dict) or not a.get("name"):
            problems.append(("artifacts", "each artifact needs a name"))
            continue
        at = f"artifacts.{a['name']}"
        for key in a:
            if key in _FIELDS[kind] or key in _IGNORED:
                continue
            if key in _ELSEWHERE:
                why = f"{key} artifacts are fetched from outside; only the workflow's artifact "
                why += "repository (s3.key), raw.data and artifacts of other steps work locally"
            else:
                why = "not supported by the local runner"
            problems.append((f"{at}.{key}", why))
        s3 = a.get("s3")
        if s3 is not None and (not isinstance(s3, dict) or set(s3) - {"key"}):
            problems.append(
                (
                    f"{at}.s3",
                    "only s3.key works locally: the run's own artifact repository "
                    "stands in for other buckets and endpoints",
                )  # fmt: skip
            )
        archive = a.get("archive")
        if archive is not None and (
            not isinstance(archive, dict)
            or len(archive) != 1
            or next(iter(archive)) not in ("none", "tar")
        ):
            problems.append((f"{at}.archive", "only archive none or tar work locally"))
        if kind == "outputs" and not {"path", "from", "fromExpression"} & set(a):
            problems.append((f"{at}.path", "an output artifact needs a path (or from)"))
        why = _path_problem(a, kind)
        if why:
            problems.append((f"{at}.path", why))
    return problems


def bind(tmpl: dict, given: list[dict]) -> list[dict]:
    """The template's input artifacts with the caller's arguments applied (unsubstituted paths).

    Each entry: name, path, mode, optional, and its source: `ref` (a JSON reference), `raw` or
    `key`, plus `subPath`. Raises ValueError for a required artifact nobody supplied."""
    args = {a["name"]: a for a in given}
    bound = []
    for spec in template_artifacts(tmpl, "inputs"):
        arg = args.get(spec["name"], {})
        entry = {"name": spec["name"], "path": spec.get("path"), "mode": spec.get("mode")}
        entry["optional"] = bool(arg.get("optional", spec.get("optional")))
        entry["subPath"] = arg.get("subPath")
        src = arg if any(k in arg for k in ("from", "raw", "s3")) else spec
        if "from" in src:
            ref = _parse_ref(to_str(src["from"]))
            if ref is None:
                raise ValueError(
                    f"inputs.artifacts.{spec['name']}: from {src['from']!r} is not an artifact"
                )
            entry["key"] = ref["key"]
        elif "raw" in src:
            entry["raw"] = to_str((src["raw"] or {}).get("data", ""))
        elif (src.get("s3") or {}).get("key"):
            entry["key"] = to_str(src["s3"]["key"]).strip("/")
        elif not entry["optional"]:
            raise ValueError(
                f"inputs.artifacts.{spec['name']} was not supplied to template {tmpl['name']!r}"
            )
        bound.append(entry)
    return bound


def input_values(bound: list[dict] | None) -> dict[str, str]:
    """`{{inputs.artifacts.X}}` (to pass an input on) for each bound input with a stored source."""
    return {
        f"inputs.artifacts.{b['name']}": ref_json(b["name"], b["key"])
        for b in bound or []
        if b.get("key")
    }


def output_values(prefix: str, outputs: dict | None) -> dict[str, str]:
    """`{{<prefix>.outputs.artifacts.X}}` for each saved output artifact of a node."""
    values = {}
    for a in (outputs or {}).get("artifacts") or []:
        key = (a.get("s3") or {}).get("key")
        if key:
            values[f"{prefix}.outputs.artifacts.{a['name']}"] = ref_json(a["name"], key)
    return values


def _load(repo: Repository, key: str, dest: str, work: str) -> None:
    """Load the artifact stored at `key` (an archive/file, or a directory of keys) to `dest`."""
    blob = os.path.join(work, "blob")
    try:
        repo.get(key, blob)
    except ArtifactError:
        files = repo.keys(key)
        if not files:
            raise
        for f in files:
            target = os.path.join(dest, f[len(key) :].lstrip("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            repo.get(f, target)
        return
    unpack(blob, dest)


def _chmod(path: str, mode: Any) -> None:
    bits = int(to_str(mode), 8) if isinstance(mode, str) else int(mode)
    targets = [path]
    if os.path.isdir(path):
        targets = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for t in targets:
        if not os.path.islink(t):  # chmod follows a link: a file outside the artifact
            os.chmod(t, bits)


def stage_inputs(
    repo: Repository, bound: list[dict] | None, body: dict, root: Path | None = None
) -> str | None:
    """Load each bound input artifact to its (mapped) path; return a problem or None. With
    `root` (the node's directory) a path that is not inside it is refused, never touched."""
    paths = {a["name"]: to_str(a.get("path") or "") for a in template_artifacts(body, "inputs")}
    for b in bound or []:
        dest = paths.get(b["name"]) or ""
        if not dest or unresolved(dest):
            return f"inputs.artifacts.{b['name']}: no path to load it to"
        if not os.path.isabs(dest) or (root is not None and not inside(root, dest)):
            return f"inputs.artifacts.{b['name']}: path {dest!r} is not in the pod's filesystem"
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        elif os.path.lexists(dest):
            os.remove(dest)  # a file, or a link itself (never what it points at)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            _stage_one(repo, b, dest)
        except (ArtifactError, OSError, ValueError) as exc:
            if b["optional"]:
                continue
            return f"failed to load artifact {b['name']!r}: {exc}"
        if b.get("mode") is not None and os.path.lexists(dest):
            _chmod(dest, b["mode"])
    return None


def _stage_one(repo: Repository, b: dict, dest: str) -> None:
    if "raw" in b:
        Path(dest).write_text(b["raw"])
        return
    if not b.get("key"):
        return  # optional and not supplied
    with tempfile.TemporaryDirectory(dir=os.path.dirname(dest)) as work:
        if not b.get("subPath"):
            _load(repo, b["key"], dest, work)
            return
        whole = os.path.join(work, "whole")
        _load(repo, b["key"], whole, work)
        inner = os.path.normpath(os.path.join(whole, to_str(b["subPath"])))
        if not inner.startswith(whole + os.sep) or not os.path.lexists(inner):
            raise ArtifactError(f"subPath {b['subPath']!r} is not in the artifact")
        shutil.move(inner, dest)


def _save_one(repo: Repository, a: dict, key: str, work: str) -> None:
    path = to_str(a["path"])
    archive = a.get("archive") or {}
    if "none" in archive:
        if os.path.isdir(path):
            for d, _, files in os.walk(path):
                for f in files:
                    full = os.path.join(d, f)
                    if os.path.isfile(full):  # sockets, fifos and dangling links are left out
                        repo.put(f"{key}/{os.path.relpath(full, path)}", full)
        else:
            repo.put(key, path)
        return
    level = (archive.get("tar") or {}).get("compressionLevel")
    blob = os.path.join(work, "blob.tgz")
    pack(path, blob, 6 if level is None else int(level))
    repo.put(key, blob)


def save_outputs(
    repo: Repository, workflow: str, pod: str, body: dict, work: str
) -> tuple[list[dict], str | None]:
    """Save each output artifact of a finished pod; return (status entries, problem or None)."""
    saved = []
    for a in template_artifacts(body, "outputs"):
        path = to_str(a.get("path") or "")
        if not os.path.lexists(path):
            if a.get("optional"):
                continue
            return saved, f"failed to save outputs: artifact {a['name']!r}: {path} does not exist"
        suffix = "" if "none" in (a.get("archive") or {}) else ".tgz"
        key = to_str((a.get("s3") or {}).get("key") or f"{workflow}/{pod}/{a['name']}{suffix}")
        key = key.strip("/")  # `parts/`: a directory of keys, as in Argo
        try:
            os.makedirs(work, exist_ok=True)
            _save_one(repo, a, key, work)
        except (ArtifactError, OSError, ValueError) as exc:
            return saved, f"failed to save artifact {a['name']!r}: {exc}"
        saved.append({"name": a["name"], "path": path, "s3": {"key": key}})
    return saved, None


def export(global_artifacts: dict[str, str], body: dict, saved: list[dict]) -> None:
    """`globalName` of saved output artifacts: `{{workflow.outputs.artifacts.NAME}}`."""
    names = {a["name"]: a.get("globalName") for a in template_artifacts(body, "outputs")}
    for a in saved:
        if names.get(a["name"]):
            global_artifacts[names[a["name"]]] = ref_json(a["name"], a["s3"]["key"])


def _from_expression(a: dict, local: dict[str, str]) -> str:
    """The reference `fromExpression` picks (workflow/controller/scope.go resolveArtifact: the
    expression must give an artifact; here, the JSON reference `{{...outputs.artifacts.X}}` is)."""
    try:
        value = evaluate(to_str(a["fromExpression"]), expand(local))
    except ExprError as exc:
        raise ValueError(f"output artifact {a['name']!r}: fromExpression: {exc}") from None
    if not isinstance(value, str) or _parse_ref(value) is None:
        raise ValueError(f"output artifact {a['name']!r}: fromExpression gave no artifact")
    return value


def group_outputs(body: dict, local: dict[str, str]) -> list[dict]:
    """Output artifacts of a DAG/steps template from `from` references to its children."""
    out = []
    for a in template_artifacts(body, "outputs"):
        raw = to_str(a.get("from") or "")
        for name, value in local.items():
            raw = raw.replace("{{" + name + "}}", value)
        if a.get("fromExpression") is not None:
            raw = _from_expression(a, local)
        ref = _parse_ref(raw)
        if ref is None:
            if a.get("optional"):
                continue
            raise ValueError(f"output artifact {a['name']!r}: cannot resolve {a.get('from')!r}")
        out.append({"name": a["name"], "s3": {"key": ref["key"]}})
    return out
