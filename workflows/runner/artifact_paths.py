"""Where the artifact paths of a container/script template lie: in the node's own filesystem.

Artifact paths are private to the node, like a pod's filesystem: `/tmp/message` becomes
`WORKDIR/pods/<node id>/tmp/message` (where a private /tmp is, leaf.map_tmp) in the template's
command, args, env, workingDir and source (`map_paths`); only an output path that already exists
on this machine outside /tmp (an image's `/etc`) is read where it is, never written. A path is
mapped after substitution (`resolve_paths`, then `map_paths` on the substituted body:
`/tmp/{{inputs.parameters.x}}` too) and cleaned by Argo's rule (`clean_path`), so no path a
manifest or a parameter names reaches the host: a relative path, or a `..` that leaves the
directory written before it, is refused with one line (the manifest by
`artifacts.artifact_problems`, the node when only a parameter's value makes it so).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ckptflow.workflows.runner.substitution import map_strings, substitute, to_str, unresolved

__all__ = ["clean_path", "inside", "map_paths", "resolve_paths", "template_artifacts"]


def template_artifacts(tmpl: dict, side: str) -> list[dict]:
    """The `inputs`/`outputs` (`side`) artifacts of a template."""
    return list((tmpl.get(side) or {}).get("artifacts") or [])


def clean_path(name: str, path: str) -> str:
    """The artifact path `path` cleaned, as Argo's `Artifact.CleanPath`
    (pkg/apis/workflow/v1alpha1/workflow_types.go): a `..` may not leave the directory written
    before it (`/tmp/safe/{{inputs.parameters.x}}` stays in /tmp/safe), then filepath.Clean.
    Locally the path must also be absolute: it lies in the task's own filesystem, and a relative
    one would be read from the runner's working directory (the user's folder of that name was
    deleted). ValueError, one line, otherwise."""
    if not path.startswith("/"):
        raise ValueError(
            f"artifact {name!r}: path {path!r} is not absolute: give a path inside the "
            "container, e.g. /tmp/data"
        )
    safe = ""
    if "/../" in path:
        safe = path.split("/../", 1)[0]
    elif path.endswith("/.."):
        safe = path[:-3]
    cleaned = "/" + os.path.normpath(path).lstrip("/")  # Go's Clean makes `//x` `/x`
    if safe and (not cleaned.startswith(safe + "/") or len(cleaned) <= len(safe) + 1):
        raise ValueError(
            f"artifact {name!r} attempted to use a path containing '..' ({path!r}). "
            "Directory traversal is not permitted"
        )
    return cleaned


def inside(root: Path, dest: str) -> bool:
    """Whether `dest` lies in the node's directory `root` once symlinks are followed (a link
    left under root, e.g. by an earlier artifact, must not carry a write or delete out)."""
    real_root, parent = os.path.realpath(root), os.path.realpath(os.path.dirname(dest))
    return parent == real_root or parent.startswith(real_root + os.sep)


def _mapped(path: str, output: bool, root: Path) -> bool:
    if not path.startswith("/") or "{{" in path or path.startswith(f"{root}/"):
        return False  # under root: already the node's own (leaf.map_tmp's)
    # an output at an image's own files (`/etc`) is read where it is (never written)
    return not (output and not path.startswith("/tmp") and os.path.lexists(path))


def _private(tmpl: dict, root: Path) -> list[str]:
    """The paths to make the node's own: each artifact path (cleaned, `clean_path`: ValueError
    for one that is relative or leaves its directory), and the directory of an output artifact
    unless that is `/`, `/tmp` or a directory of this machine (the program creates `/mnt/out`
    before writing `/mnt/out/part.json`: that must not touch the host's)."""
    paths = []
    for side in ("inputs", "outputs"):
        for a in template_artifacts(tmpl, side):
            if not a.get("path"):
                continue
            path = to_str(a["path"])
            if unresolved(path):
                continue  # the leaf refuses it ("failed to resolve")
            norm = clean_path(a["name"], path)
            if not _mapped(norm, side == "outputs", root):
                continue
            paths.append(norm)
            parent = os.path.dirname(norm)
            own_dir = parent.startswith("/tmp/") or not os.path.isdir(parent)
            if side == "outputs" and parent not in ("/", "/tmp") and own_dir:
                paths.append(parent)
    return paths


def _make_ancestors(root: Path, paths: list[str]) -> None:
    """Create under `root` the ancestors of `paths` that this machine has (an image's `/mnt`,
    `/tmp`), as a pod's filesystem has them; the rest is the program's to create."""
    (root / "tmp").mkdir(parents=True, exist_ok=True)  # a pod's /tmp always exists
    for p in paths:
        for parent in Path(p).parents:
            if str(parent) != "/" and (os.path.isdir(parent) or str(parent).startswith("/tmp")):
                (root / str(parent).lstrip("/")).mkdir(parents=True, exist_ok=True)


def resolve_paths(tmpl: dict, root: Path, values: dict[str, str]) -> dict[str, str]:
    """The `{{inputs/outputs.artifacts.X.path}}` values of a container/script template: each
    artifact path substituted with `values`, cleaned (`clean_path`; ValueError, one line, for a
    relative path or a `..` that leaves its directory, `-p x=../home`) and, where `map_paths`
    maps it, in the node's own directory `root`."""
    values_out: dict[str, str] = {}
    for side in ("inputs", "outputs"):
        for a in template_artifacts(tmpl, side):
            if not a.get("path"):
                continue
            path = substitute(to_str(a["path"]), values)
            if not unresolved(path):
                path = clean_path(a["name"], path)
                path = str(root) + path if _mapped(path, side == "outputs", root) else path
            values_out[f"{side}.artifacts.{a['name']}.path"] = path
    for p in (tmpl.get("outputs") or {}).get("parameters") or []:
        path = (p.get("valueFrom") or {}).get("path")
        if path is not None:  # already the node's own when under /tmp (leaf.map_tmp)
            values_out[f"outputs.parameters.{p['name']}.path"] = to_str(path)
    return values_out


def map_paths(body: dict, root: Path) -> dict:
    """A copy of a substituted container/script template whose artifact paths are under `root`
    (the node's filesystem), in its artifacts and wherever its command, args, env, workingDir
    and source name them. Mapping after substitution is what keeps a parameter's path
    (`/tmp/{{inputs.parameters.x}}`) in the node; ValueError (one line) for a path that would
    leave it (`clean_path`)."""
    paths = {p: str(root) + p for p in _private(body, root)}
    if not paths:
        return body
    longest = sorted(paths, key=len, reverse=True)
    # a path already under root (leaf.map_tmp's, `{{inputs.artifacts.X.path}}`) is left alone
    done = rf"{re.escape(str(root))}[^\s'\";:]*"
    pattern = re.compile(
        "|".join([done, *(rf"(?<![\w./-]){re.escape(p)}(?![\w.-])" for p in longest)])
    )

    def fix(value):
        return map_strings(value, lambda s: pattern.sub(lambda m: paths.get(m[0], m[0]), s))

    out = dict(body)
    for key in ("container", "script"):
        if key in out:
            out[key] = {k: (v if k == "readinessProbe" else fix(v)) for k, v in out[key].items()}
    for side in ("inputs", "outputs"):  # the artifact paths themselves, cleaned
        if side in out and template_artifacts(out, side):
            arts = [_mapped_artifact(a, paths, root) for a in template_artifacts(out, side)]
            out[side] = {**fix(out[side]), "artifacts": arts}
    _make_ancestors(root, list(paths))
    return out


def _mapped_artifact(a: dict, paths: dict[str, str], root: Path) -> dict:
    path = to_str(a.get("path") or "")
    if not path or unresolved(path):
        return a
    norm = clean_path(a["name"], path)
    if norm.startswith(str(root) + "/"):  # `{{inputs.artifacts.X.path}}`: already the node's
        return {**a, "path": norm}
    return {**a, "path": paths.get(norm, norm)}
