"""Volumes on one machine: each `volumeMount` becomes a local directory.

`emptyDir` is private to the node (`<workdir>/pods/<node id>/volumes/<name>`), except at
`/dev/shm`, where the host's shared memory already is what the pod would get; a
`persistentVolumeClaim` or a `volumeClaimTemplates` entry is shared by the whole run
(`<workdir>/volumes/<claim>`); a `hostPath` is that path of this machine (the cluster's one
node) here, and under `--isolate` a directory of the pod's simulated node (`node_host_path`). The mount path is then rewritten to the
local directory wherever it appears in the container's command, args, env, workingDir, script
source and output paths. A `secret` or `configMap` volume is its object's keys as files, from
the run's object store (refs.py, `--objects FILE`). Other volume kinds (nfs...) are refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ckptflow.workflows.runner.refs import project_volume
from ckptflow.workflows.runner.substitution import map_strings

__all__ = [
    "volume_problems", "declared", "mounts", "apply_mounts", "subpath", "node_host_path",
]  # fmt: skip

KINDS = ("emptyDir", "persistentVolumeClaim", "hostPath", "secret", "configMap")
PROJECTED = ("secret", "configMap")  # filled from the object store (refs.project_volume)
# A claim's name is a Kubernetes object name (IsDNS1123Subdomain): it names a directory here.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_OBJECT_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_MOUNT_OK = {"name", "mountPath", "subPath", "readOnly", "mountPropagation"}


def declared(spec: dict, tmpl: dict) -> dict[str, dict]:
    """The volumes a template can mount, by name: the workflow's, its own, claim templates."""
    vols = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    vols.update({v.get("name"): v for v in tmpl.get("volumes") or [] if isinstance(v, dict)})
    for claim in spec.get("volumeClaimTemplates") or []:
        name = (claim.get("metadata") or {}).get("name")
        vols.setdefault(name, {"name": name, "persistentVolumeClaim": {"claimName": name}})
    return vols


def subpath_problem(sub: str) -> str | None:
    """Kubernetes' rule for a volumeMount's subPath (validateLocalDescendingPath in
    pkg/apis/core/validation/validation.go): relative, and no `..` element, so the mount stays
    in its volume (here: a directory of the workdir, which `../..` left)."""
    if sub.startswith("/"):
        return f"subPath {sub!r} must be a relative path"
    if ".." in sub.replace("\\", "/").split("/"):
        return f"subPath {sub!r} must not contain '..'"
    return None


def subpath(local: Path, sub: str) -> Path:
    """The directory of a mount's (substituted) subPath in its volume's `local` directory;
    ValueError (one line) for one Kubernetes refuses."""
    why = subpath_problem(sub)
    if why:
        raise ValueError(why)
    return local / sub


# hostPath types a simulated node can give: a directory (the node is taken to have it, as a
# prepared GPU node has its local-disk directory); files, sockets and devices it has none of.
HOST_PATH_TYPES = ("", "Directory", "DirectoryOrCreate")
_NODE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def host_path_problem(source: object) -> str | None:
    """Kubernetes' rules for a hostPath volume (validateHostPathVolumeSource in
    pkg/apis/core/validation/validation.go: a path is required, without `..` elements,
    validatePathNoBacksteps), and the types a simulated node can give."""
    if not isinstance(source, dict):
        return "hostPath must be a mapping with a path"
    path, kind = source.get("path"), source.get("type") or ""
    if not isinstance(path, str) or not path.startswith("/"):
        return f"hostPath path {path!r} must be an absolute path"
    if ".." in path.split("/"):
        return f"hostPath path {path!r} must not contain '..'"
    if kind not in HOST_PATH_TYPES:
        kinds = ", ".join(HOST_PATH_TYPES[1:])
        return f"hostPath type {kind!r}: only a directory ({kinds}) works locally"
    return None


def node_host_path(workdir: str, node: str, source: dict) -> Path:
    """The directory a hostPath volume is on simulated node `node` (`--isolate`, with or
    without `--cluster`): `<workdir>/nodes/<node>/host/<path>`.

    A hostPath is the node's own filesystem (kubernetes.io/docs/concepts/storage/volumes/
    #hostpath; the kubelet bind-mounts the node's path: pkg/volume/hostpath/host_path.go), so
    each simulated node has its own: two nodes never share one, a pod retried on the same node
    finds what the earlier pod left there, a pod on another node does not, and nothing reaches
    this machine's real path. ValueError (one line) for a path Kubernetes refuses."""
    why = host_path_problem(source)
    if why:
        raise ValueError(why)
    if not isinstance(node, str) or not _NODE.fullmatch(node):
        raise ValueError(f"node name {node!r} cannot hold a hostPath")
    return Path(workdir) / "nodes" / node / "host" / source["path"].lstrip("/")


def _claim_problem(name: object) -> str | None:
    if isinstance(name, str) and ("{{" in name or _OBJECT_NAME.fullmatch(name)):
        return None
    return f"claimName {name!r} is not a Kubernetes name (lower-case letters, digits, '-', '.')"


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
    for v in vols:
        source = v.get("hostPath")
        templated = isinstance(source, dict) and "{{" in str(source.get("path"))
        why = host_path_problem(source) if "hostPath" in v and not templated else None
        if why:
            problems.append((f"volumes.{v.get('name')}.hostPath", why))
    for v in vols:
        claim = v.get("persistentVolumeClaim")
        why = _claim_problem((claim or {}).get("claimName")) if isinstance(claim, dict) else None
        if why:
            problems.append((f"volumes.{v.get('name')}.persistentVolumeClaim", why))
    if tmpl is None:
        for claim in spec.get("volumeClaimTemplates") or []:
            name = (claim.get("metadata") or {}).get("name")
            if not name:
                problems.append(("volumeClaimTemplates", "each claim template needs metadata.name"))
            elif _claim_problem(name):
                problems.append(("volumeClaimTemplates", _claim_problem(name)))
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
            sub = str(m.get("subPath") or "")
            if sub and "{{" not in sub and subpath_problem(sub):
                problems.append((f"volumeMounts.{m.get('name')}.subPath", subpath_problem(sub)))
    return problems


def mounts(
    spec: dict, tmpl: dict, workdir: str, pod_dir: Path, objects=None
) -> list[tuple[str, str]]:
    """(mountPath, local directory) for each mount of a template; the directories exist
    (`objects`: the run's object store, for secret/configMap volumes)."""
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
        elif any(k in vol for k in PROJECTED):
            local = pod_dir / "volumes" / m["name"]
            project_volume(vol, objects, local)  # ValueError: the object or a key is missing
        else:
            local = pod_dir / "volumes" / m["name"]
        if m.get("subPath"):
            local = subpath(local, str(m["subPath"]))  # ValueError: leaves the volume
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
        return map_strings(value, lambda s: pattern.sub(lambda m: table[m[0]], s))

    out = dict(body)
    for key in ("container", "script"):
        if key in out:
            out[key] = {k: (v if k in keep else fix(v)) for k, v in out[key].items()}
    if "outputs" in out:
        out["outputs"] = fix(out["outputs"])
    return out
