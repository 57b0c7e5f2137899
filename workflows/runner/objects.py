"""The cluster model's API server: a small in-memory object store (ConfigMaps, Secrets, Pods,
Workflows, PodGroups, any kind) with get/create/apply/replace/patch/delete and label selection.

One store per run (`Run.objects`); `resource` templates (resource.py), `--objects FILE`,
`configMapKeyRef`/`secretKeyRef` and gang PodGroups read and write it. It follows the Kubernetes
API conventions where a workflow can see them: the API server fills in `metadata` (uid,
creationTimestamp, resourceVersion, a name from generateName), names are unique per kind and
namespace, a patch is `merge` (RFC 7386), `json` (RFC 6902) or `strategic` (here: merge, see
`patch`), and deleting an owner deletes its dependents, as the garbage collector does. Every
object may be hostile: its size, nesting depth and the number of objects are bounded.

The rules for one object (errors, kind names, bounds) are in object_rules.py, label selectors in
selectors.py.
"""

from __future__ import annotations

import copy
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from ckptflow.workflows.runner.object_rules import (
    NAME_PATTERN,
    SUFFIX_ALPHABET,
    AlreadyExists,
    Invalid,
    NotFound,
    ObjectError,
    canonical_kind,
    check_bounds,
)
from ckptflow.workflows.runner.selectors import Requirement, as_text, selector_requirements

__all__ = [
    "AlreadyExists",
    "Invalid",
    "NotFound",
    "ObjectError",
    "ObjectStore",
    "load_objects",
]

# how many objects one run's store holds, so a hostile file or manifest cannot exhaust memory
MAX_OBJECTS = 10_000
MAX_FILE_BYTES = 16 << 20
DEFAULT_NAMESPACE = "default"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: mappings merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ObjectStore:
    """Objects by (Kind, namespace, name); thread-safe; `wait_change` lets a waiter sleep until
    something changes. `on_create` callbacks see each new object (controllers.py starts a child
    workflow), `on_delete` callbacks each deleted one (a child workflow stops)."""

    def __init__(self, namespace: str = DEFAULT_NAMESPACE) -> None:
        self.namespace = namespace
        self._objects: dict[tuple[str, str, str], dict] = {}
        self._cond = threading.Condition()
        self._version = 0
        self.on_delete: list[Callable[[dict], None]] = []
        self.on_create: list[Callable[[dict], None]] = []  # controllers watching new objects

    # -- reading -------------------------------------------------------------------------
    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        """A copy of the object, or None."""
        with self._cond:
            obj = self._objects.get(self._key(kind, name, namespace))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: str, selector: Any = None, namespace: str | None = None) -> list[dict]:
        """Copies of the objects of a kind (in one namespace, or all with namespace="*")
        whose labels match `selector` (a string like `app=x,tier in (a,b)` or a LabelSelector
        mapping), in creation order."""
        reqs = selector_requirements(selector)
        want = canonical_kind(kind)
        with self._cond:
            objs = [
                o for (k, ns, _), o in self._objects.items()
                if k == want and (namespace == "*" or ns == (namespace or self.namespace))
            ]  # fmt: skip
            return [copy.deepcopy(o) for o in objs if self._labels_match(o, reqs)]

    @staticmethod
    def _labels_match(obj: dict, reqs: list[Requirement]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}

        def lookup(key: str) -> tuple[bool, str]:
            return key in labels, as_text(labels.get(key))

        return all(r.matches(lookup) for r in reqs)

    @property
    def version(self) -> int:
        """Increases with every change (the store's resourceVersion)."""
        with self._cond:
            return self._version

    def wait_change(self, version: int, timeout: float) -> None:
        """Sleep until the store changes after `version`, or `timeout` seconds pass."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != version, timeout)

    # -- writing -------------------------------------------------------------------------
    def create(self, obj: Mapping) -> dict:
        """Store a new object, metadata filled as the API server fills it; AlreadyExists when
        one of that kind and name exists; Invalid for a malformed one. Returns a copy."""
        new = self._validated(obj)
        meta = new["metadata"]
        with self._cond:
            if not meta.get("name"):
                meta["name"] = self._generated_name(new["kind"], meta)
            key = self._key(new["kind"], meta["name"], meta["namespace"])
            if key in self._objects:
                raise AlreadyExists(f'{new["kind"]} "{meta["name"]}" already exists')
            if len(self._objects) >= MAX_OBJECTS:
                raise Invalid(f"the store holds {MAX_OBJECTS} objects, its limit")
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta.setdefault("generation", 1)
            self._store(key, new)
        for callback in list(self.on_create):
            callback(copy.deepcopy(new))
        return copy.deepcopy(new)

    def apply(self, obj: Mapping) -> dict:
        """`kubectl apply`: create the object, or merge the manifest over the stored one
        (the last-applied three-way diff is not kept: a field removed from the manifest stays)."""
        new = self._validated(obj)
        meta = new["metadata"]
        if not meta.get("name"):
            raise Invalid("apply needs metadata.name (generateName is for create)")
        current = self.get(new["kind"], meta["name"], meta["namespace"])
        if current is None:
            return self.create(new)
        return self._update(current, merge_patch(current, new))

    def replace(self, obj: Mapping) -> dict:
        """`kubectl replace`: the stored object becomes this manifest (same uid); NotFound."""
        new = self._validated(obj)
        meta = new["metadata"]
        current = self.get(new["kind"], str(meta.get("name")), meta["namespace"])
        if current is None:
            raise NotFound(f'{new["kind"]} "{meta.get("name")}" not found')
        return self._update(current, new)

    def patch(
        self,
        kind: str,
        name: str,
        patch: Any,
        patch_type: str = "merge",
        namespace: str | None = None,
    ) -> dict:
        """Patch a stored object: `merge` (RFC 7386), `json` (RFC 6902, via jsonpatch), or
        `strategic`, applied here as a merge patch: lists are replaced whole, not merged by
        their patchMergeKey (e.g. containers by name) as the API server merges built-in kinds."""
        current = self.get(kind, name, namespace)
        if current is None:
            raise NotFound(f'{canonical_kind(kind)} "{name}" not found')
        check_bounds(patch, "patch")
        if patch_type in ("merge", "strategic"):
            if not isinstance(patch, dict):
                raise Invalid(f"a {patch_type} patch must be a mapping")
            patched = merge_patch(current, patch)
        elif patch_type == "json":
            if not isinstance(patch, list):
                raise Invalid("a json patch must be a list of operations")
            try:
                patched = jsonpatch.apply_patch(current, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise Invalid(f"json patch: {exc}") from None
        else:
            raise Invalid(f"patch type {patch_type!r} is not one of json, merge, strategic")
        return self._update(current, patched)

    def update_status(
        self, kind: str, name: str, status: dict, namespace: str | None = None
    ) -> dict:
        """A controller's write of `status` (the status subresource)."""
        current = self.get(kind, name, namespace)
        if current is None:
            raise NotFound(f'{canonical_kind(kind)} "{name}" not found')
        return self._update(current, {**current, "status": copy.deepcopy(status)})

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict:
        """Delete an object and, as the garbage collector does, every object whose owners
        (ownerReferences) are then all gone; NotFound when absent. Returns the deleted one."""
        with self._cond:
            obj = self._objects.pop(self._key(kind, name, namespace), None)
            if obj is None:
                raise NotFound(f'{canonical_kind(kind)} "{name}" not found')
            deleted = [obj, *self._collect_garbage()]
            self._changed()
        for gone in deleted:
            for callback in list(self.on_delete):
                callback(copy.deepcopy(gone))
        return copy.deepcopy(obj)

    def delete_owned_by(self, uid: str) -> list[dict]:
        """Delete the objects owned by `uid` (an owner outside the store, e.g. the run's own
        Workflow at its end) and theirs, as Kubernetes GC does when the owner is deleted."""
        with self._cond:
            owned = [
                k for k, o in self._objects.items()
                if uid in {r.get("uid") for r in _owner_refs(o)}
            ]  # fmt: skip
        deleted = []
        for kind, ns, name in owned:
            try:
                deleted.append(self.delete(kind, name, ns))
            except NotFound:
                continue  # collected with another owner
        return deleted

    # -- internals -----------------------------------------------------------------------
    def _key(self, kind: str, name: str, namespace: str | None) -> tuple[str, str, str]:
        return canonical_kind(kind), namespace or self.namespace, str(name)

    def _validated(self, obj: Mapping) -> dict:
        if not isinstance(obj, Mapping):
            raise Invalid(f"an object must be a mapping, not {type(obj).__name__}")
        check_bounds(obj, "object")
        new = copy.deepcopy(dict(obj))
        kind = new.get("kind")
        if not isinstance(kind, str) or not kind:
            raise Invalid("the object has no kind")
        new["kind"] = canonical_kind(kind)
        meta = new.get("metadata")
        if meta is None:
            meta = new["metadata"] = {}
        if not isinstance(meta, dict):
            raise Invalid(f"{kind}: metadata must be a mapping")
        name = meta.get("name")
        if name is not None and (
            not isinstance(name, str) or len(name) > 253 or not NAME_PATTERN.fullmatch(name)
        ):
            raise Invalid(
                f"{kind} name {name!r} is not a DNS-1123 name (lower-case, digits, '-', '.')"
            )
        gen = meta.get("generateName")
        if not name and (not isinstance(gen, str) or not gen or len(gen) > 240):
            raise Invalid(f"{kind}: metadata.name or metadata.generateName is required")
        meta["namespace"] = str(meta.get("namespace") or self.namespace)
        for key in ("labels", "annotations"):
            if meta.get(key) is not None and not isinstance(meta[key], dict):
                raise Invalid(f"{kind}: metadata.{key} must be a mapping")
        return new

    def _generated_name(self, kind: str, meta: dict) -> str:
        for _ in range(100):
            suffix = "".join(random.choices(SUFFIX_ALPHABET, k=5))
            name = f"{meta['generateName']}{suffix}"
            if not NAME_PATTERN.fullmatch(name):
                raise Invalid(f"{kind}: generateName {meta['generateName']!r} makes no valid name")
            if self._key(kind, name, meta["namespace"]) not in self._objects:
                return name
        raise AlreadyExists(f"{kind}: no free name for generateName {meta['generateName']!r}")

    def _update(self, current: dict, new: dict) -> dict:
        """Store `new` in place of `current`: identity and creation metadata kept, version up."""
        check_bounds(new, "object")
        new = copy.deepcopy(new)
        meta = new.setdefault("metadata", {})
        old = current["metadata"]
        for key in ("name", "namespace", "uid", "creationTimestamp"):
            meta[key] = old[key]
        new["kind"] = current["kind"]
        if new.get("spec") != current.get("spec"):
            meta["generation"] = int(old.get("generation") or 1) + 1
        with self._cond:
            key = self._key(current["kind"], old["name"], old["namespace"])
            if key not in self._objects:
                raise NotFound(f'{current["kind"]} "{old["name"]}" not found')
            self._store(key, new)
            return copy.deepcopy(new)

    def _store(self, key: tuple[str, str, str], obj: dict) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self._objects[key] = obj
        self._cond.notify_all()

    def _changed(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _collect_garbage(self) -> list[dict]:
        """Remove (lock held) objects all of whose owners are gone, until none is left
        (pkg/controller/garbagecollector in kubernetes/kubernetes: background deletion)."""
        collected = []
        while True:
            uids = {o["metadata"]["uid"] for o in self._objects.values()}
            orphans = [
                k for k, o in self._objects.items()
                if _owner_refs(o) and not any(r.get("uid") in uids for r in _owner_refs(o))
            ]  # fmt: skip
            if not orphans:
                return collected
            collected.extend(self._objects.pop(k) for k in orphans)


def _owner_refs(obj: dict) -> list[dict]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [r for r in refs if isinstance(r, dict)]


def _documents(path: str) -> Iterable[Any]:
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise Invalid(f"{path}: {size} bytes is over the {MAX_FILE_BYTES}-byte limit")
        text = p.read_text()
    except OSError as exc:
        raise Invalid(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise Invalid(f"{path}: not UTF-8 text") from None
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise Invalid(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None


def load_objects(paths: Iterable[str], namespace: str = DEFAULT_NAMESPACE) -> ObjectStore:
    """A store holding every object of these YAML files (many documents each; a `kind: List`
    is unpacked); Invalid (one line naming the file) for a damaged file or object."""
    store = ObjectStore(namespace)
    for path in paths:
        for doc in _documents(path):
            items = (
                doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
            )
            for obj in items or []:
                try:
                    store.create(obj)
                except ObjectError as exc:
                    raise type(exc)(f"{path}: {exc}") from None
    return store
