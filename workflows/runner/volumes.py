"""Volumes on one machine: each `volumeMount` becomes a local directory.

`emptyDir` is private to the node (`<workdir>/pods/<node id>/volumes/<name>`), except at
`/dev/shm`, where the host's shared memory already is what the pod would get; a
`persistentVolumeClaim` or a `volumeClaimTemplates` entry is shared by the whole run
(`<workdir>/volumes/<claim>`); a `hostPath` is that path. The mount path is then rewritten to the
local directory wherever it appears in the container's command, args, env, workingDir, script
source and output paths. Other volume kinds (configMap, secret, nfs...) are refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["volume_problems", "declared", "mounts", "apply_mounts"]

KINDS = ("emptyDir", "persistentVolumeClaim", "hostPath")
_MOUNT_OK = {"name", "mountPath", "subPath", "readOnly", "mountPropagation"}


def declared(spec: dict, tmpl: dict) -> dict[str, dict]:
    """The volumes a template can mount, by name: the workflow's, its own, claim templates."""
    vols = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    vols.update({v.get("name"): v for v in tmpl.get("volumes") or [] if isinstance(v, dict)})
    for claim in spec.get("volumeClaimTemplates") or []:
        name = (claim.get("metadata") or {}).get("name")
        vols.setdefault(name, {"name": name, "persistentVolumeClaim": {"claimName": name}})
    return vols


def volume_problems(spec: dict, tmpl: dict | None) -> list[tuple[str, str]]:
    """(field, why) for every volume or mount the runner cannot provide."""
    problems = []
    vols = (spec.get("volumes") if tmpl is None else tmpl.get("volumes")) or []
    for v in vols:
        kinds = [k for k in v if k != "name"]
        if len(kinds) != 1 or kinds[0] not in KINDS:
            problems.append(
                (f"volumes.{v.get('name')}", f"only {', '.join(KINDS)} volumes work locally")
            )
    if tmpl is None:
        for claim in spec.get("volumeClaimTemplates") or []:
            if not (claim.get("metadata") or {}).get("name"):
                problems.append(("volumeClaimTemplates", "each claim template needs metadata.name"))
        return problems
    known = declared(spec, tmpl)
    for key in ("container", "script"):
        for m in (tmpl.get(key) or {}).get("volumeMounts") or []:
            extra = set(m) - _MOUNT_OK
            if extra:
                problems.append(
                    (f"volumeMounts.{m.get('name')}.{sorted(extra)[0]}", "not supported")
                )
            if m.get("name") not in known:
                problems.append((f"volumeMounts.{m.get('name')}", "no volume of that name"))
            if not str(m.get("mountPath", "")).startswith("/"):
                problems.append((f"volumeMounts.{m.get('name')}.mountPath", "must be absolute"))
    return problems


def mounts(spec: dict, tmpl: dict, workdir: str, pod_dir: Path) -> list[tuple[str, str]]:
    """(mountPath, local directory) for each mount of a template; the directories exist."""
    known = declared(spec, tmpl)
    container = tmpl.get("container") or tmpl.get("script") or {}
    out = []
    for m in container.get("volumeMounts") or []:
        vol, mount = known[m["name"]], str(m["mountPath"]).rstrip("/") or "/"
        if "hostPath" in vol:
            local = Path(vol["hostPath"]["path"])
        elif "persistentVolumeClaim" in vol:
            local = Path(workdir) / "volumes" / vol["persistentVolumeClaim"]["claimName"]
        elif mount == "/dev/shm":
            local = Path("/dev/shm")
        else:
            local = pod_dir / "volumes" / m["name"]
        if m.get("subPath"):
            local = local / m["subPath"]
        local.mkdir(parents=True, exist_ok=True)
        if str(local) != mount:
            out.append((mount, str(local)))
    return out


def apply_mounts(body: dict, mapping: list[tuple[str, str]]) -> dict:
    """A copy of a substituted template with mount paths replaced by their local directories."""
    if not mapping:
        return body
    return rewrite_paths(body, dict(mapping), keep=("readinessProbe", "volumeMounts", "ports"))


def rewrite_paths(body: dict, table: dict[str, str], *, keep: tuple[str, ...]) -> dict:
    """A copy of a template whose container/script fields (but those named in `keep`) and
    outputs have each path of `table` replaced by its value: a whole path only, never the
    prefix or middle of a longer one (`/data` leaves `/database` and `/x/data` alone)."""
    longest_first = sorted(table, key=len, reverse=True)
    pattern = re.compile("|".join(rf"(?<![\w./-]){re.escape(p)}(?![\w.-])" for p in longest_first))

    def fix(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(lambda m: table[m.group(0)], value)
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    out = dict(body)
    for key in ("container", "script"):
        if key in out:
            out[key] = {k: (v if k in keep else fix(v)) for k, v in out[key].items()}
    if "outputs" in out:
        out["outputs"] = fix(out["outputs"])
    return out
