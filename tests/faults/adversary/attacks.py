"""The adversary's damage rules: data files, every JSON file, manifests forged consistently,
ARCHIVED markers pointing anywhere, hostile pending manifests, step folders; and the user's
repair of a root marker. The damage itself is damage.py."""

from __future__ import annotations

import json
import time
import uuid

from hypothesis import strategies as st
from hypothesis.stateful import rule

from ckptflow.core import layout, runroot
from ckptflow.core.storage import Storage
from tests.faults.adversary import damage
from tests.faults.adversary.machine import PICK, choose, has, note, refusable

JSON_TARGETS = ("root marker", "archive root marker", "COMMIT", "manifest", "intent")
JSON_TARGETS += ("PIN", "eval.json", "ARCHIVED")
ARCHIVED_TARGETS = ("dangling", "http", "foreign run", "hot alias", "hot root", "archive root")


class AttackRules:
    """Mixin of the state machine (machine.Machine)."""

    # -- damage: data files ----------------------------------------------------------------------
    def _objects(self) -> list[tuple[str, str]]:
        out = []
        for root, store in self.stores.items():
            out += [(root, e.path) for e in store.walk(layout.OBJECTS)]
        return sorted(out)

    def _own_objects(self) -> list[tuple[str, str]]:
        """Objects the newest saved step needs and no other saved step does."""
        saved = self.truth.saved
        if not saved:
            return []
        newest = max(saved)
        others = {k for s, r in saved.items() if s != newest for k in r.sizes}
        return sorted(k for k in saved[newest].sizes if k not in others)

    @has("objects")
    @rule(
        pick=PICK,
        pick2=PICK,
        n=st.integers(0, 1 << 16),
        how=st.sampled_from(
            [
                "delete",
                "truncate",
                "empty",
                "flip",
                "swap",
                "replace",
                "replace-foreign",
                "duplicate",
                "shadow",
                "shard in the way",
            ]
        ),
        which=st.sampled_from(["the newest step's own", "any"]),
    )
    @refusable
    def damage_object(self, pick: int, pick2: int, n: int, how: str, which: str) -> None:
        """Damage one object: one only the newest step needs, or any (both roots)."""
        self._op("damage_object")
        objs = (which == "any" and self._objects()) or self._own_objects() or self._objects()
        if not objs:
            return
        root, rel = choose(objs, pick)
        store = self.stores[root]
        if how == "delete":
            what = damage.delete(store, rel)
        elif how == "truncate":
            what = damage.truncate(store, rel)
        elif how == "empty":
            what = damage.empty(store, rel)
        elif how == "flip":
            what = damage.flip(store, rel, n)
        elif how == "duplicate":
            what = damage.duplicate_object(store, rel, n)
        elif how == "shadow":
            what = damage.shadow(store, rel)
        elif how == "shard in the way":
            what = damage.shard_in_the_way(store, rel)
        elif how == "replace-foreign":
            fst = Storage(self.roots.foreign)
            others = sorted(e.path for e in fst.walk(layout.OBJECTS))
            other = others[n % len(others)]
            what = damage.replace(store, rel, fst.read(other), f"the foreign run's {other}")
        else:
            root2, rel2 = choose(objs, pick2)
            if how == "swap":
                what = damage.swap(store, rel, rel2, self.stores[root2])
            else:
                what = damage.replace(store, rel, self.stores[root2].read(rel2), f"{root2}:{rel2}")
        self._damaged(f"object: {how}", f"{root}: {what}")

    # -- damage: JSON files ----------------------------------------------------------------------
    def _json_files(self, target: str) -> list[tuple[str, str]]:
        if target == "root marker":
            return [("hot", layout.ROOT_MARKER)]
        if target == "archive root marker":
            return [("arch", layout.ROOT_MARKER)]
        names = {
            "COMMIT": layout.COMMIT,
            "PIN": runroot.PIN,
            "eval.json": runroot.EVAL,
            "ARCHIVED": layout.ARCHIVED,
        }
        name = names.get(target)
        out = []
        for root in ("hot", "arch"):
            for s in reversed(self._hot_steps(root)):  # newest first
                sd = layout.step_dir(s)
                if name is not None:
                    out.append((root, f"{sd}/{name}"))
                else:  # intents (and manifests, for forge_manifest)
                    prefix = "saving-" if target == "intent" else "manifest-"
                    names = [n for n in self.stores[root].listdir(sd) if n.startswith(prefix)]
                    out += [(root, f"{sd}/{n}") for n in self._stable(root, s, names)]
        return out

    def _stable(self, root: str, step: int, names: list[str]) -> list[str]:
        """Names of a step's manifests or intents in an order that does not depend on their
        random save ids (so a replayed sequence picks the same file): the one COMMIT names
        first."""
        commit = damage.parse(self.probe.blob(root, layout.commit_path(step)))
        sid = str(commit.get("save_id")) if isinstance(commit, dict) else ""
        return sorted(names, key=lambda n: (sid not in n, n.startswith("manifest-0123"), n))

    @has("json")
    @rule(
        pick=PICK,
        pick2=PICK,
        kind=st.sampled_from(JSON_TARGETS),
        n=st.integers(0, 1 << 16),
        how=st.sampled_from(["delete", "tear", "flip", "forge", "replace"]),
        field=st.integers(0, 15),
        hostile=st.sampled_from(damage.HOSTILE_KINDS),
    )
    @refusable
    def damage_json(
        self, pick: int, pick2: int, kind: str, how: str, n: int, field: int, hostile: str
    ) -> None:
        """Delete, tear, flip, forge a field (nest, inflate, wrong type) or replace with another
        valid file of the kind; forging an absent PIN/eval.json/COMMIT plants it."""
        self._op("damage_json")
        files = self._json_files(kind)
        if not files:
            return
        root, rel = choose(files, pick)
        store = self.stores[root]
        if how == "forge":
            fld = choose(("", *damage.FIELDS[kind.removeprefix("archive ")]), field)
            what, how = damage.forge(store, rel, fld, hostile), f"forge {hostile}"
        elif how == "replace":
            what = self._replace_json(pick2, kind, store, rel)
        elif damage.read_or_none(store, rel) is None:
            return
        elif how == "delete":
            what = damage.delete(store, rel)
        elif how == "tear":
            what = damage.truncate(store, rel)
        else:
            what = damage.flip(store, rel, n)
        self._damaged(f"{kind}: {how}", f"{root}: {what}")

    def _replace_json(self, pick: int, target: str, store: Storage, rel: str) -> str:
        fst = Storage(self.roots.foreign)
        if target.endswith("root marker"):
            sources = [("the foreign run's root marker", fst, layout.ROOT_MARKER)]
            sources += [
                (f"the {r} root marker", self.stores[r], layout.ROOT_MARKER)
                for r in ("hot", "arch")
            ]
        else:
            name = rel.rsplit("/", 1)[-1]
            sources = [
                (f"{r}:{p}", self.stores[r], p) for r, p in self._json_files(target) if p != rel
            ]
            step = layout.parse_step_dir(rel.split("/", 1)[0])
            if target == "COMMIT":
                sources.append(("the foreign run's COMMIT", fst, f"{layout.step_dir(step)}/{name}"))
        if not sources:
            return f"replace of {rel}: no other {target} to copy, nothing done"
        label, src, src_rel = choose(sources, pick)
        blob = damage.read_or_none(src, src_rel)
        if blob is None:
            return f"replace of {rel}: {label} is absent, nothing done"
        return damage.replace(store, rel, blob, label)

    @has("json")
    @rule(
        pick=PICK,
        pick2=PICK,
        consistent=st.booleans(),
        how=st.sampled_from(
            ["field", "list-shaped", "duplicate chunk", "other step's", "foreign run's"]
        ),
        field=st.integers(0, 15),
        hostile=st.sampled_from(damage.HOSTILE_KINDS),
    )
    @refusable
    def forge_manifest(
        self, pick: int, pick2: int, how: str, consistent: bool, field: int, hostile: str
    ) -> None:
        """Forge the manifest a COMMIT names; `consistent` re-hashes the COMMIT to match, so the
        forgery reaches the validator (a list-shaped or duplicate-chunk one always is)."""
        self._op("forge_manifest")
        files = [(r, p) for r, p in self._json_files("manifest")]
        if not files:
            return
        root, rel = choose(files, pick)
        store, step = self.stores[root], layout.parse_step_dir(rel.split("/", 1)[0])
        if how == "field":
            fld = choose(("", *damage.FIELDS["manifest"]), field)
            if consistent:
                what = damage.forge_manifest(store, step, rel, fld, hostile)
            else:
                what = damage.forge(store, rel, fld, hostile)
        elif how == "list-shaped":
            what = damage.forge_list_manifest(store, step, rel)
        elif how == "duplicate chunk":
            what = damage.forge_duplicate_chunk(store, step, rel)
        else:
            if how == "foreign run's":
                fst = Storage(self.roots.foreign)
                sd = layout.step_dir(step)
                src = [(fst, f"{sd}/{n}") for n in fst.listdir(sd) if n.startswith("manifest-")]
            else:
                src = [(self.stores[r], p) for r, p in files if p != rel]
            if not src:
                return
            sst, srel = choose(src, pick2)
            blob = sst.read(srel)
            what = damage.replace(store, rel, blob, srel)
            if consistent:
                damage.rehash_commit(store, step, blob)
        self._damaged(f"manifest: {how}", f"{root}: {what}")

    @has("archive")
    @rule(
        pick=PICK,
        to=st.sampled_from(ARCHIVED_TARGETS),
        hostile=st.sampled_from(("",) * 4 + damage.HOSTILE_KINDS),  # mostly a well-formed marker
    )
    @refusable
    def forge_archived(self, pick: int, to: str, hostile: str) -> None:
        """Plant or overwrite an ARCHIVED marker: a URI that is dangling, http://, another run's
        root, the hot root (or an alias of it), the archive root; or a hostile field."""
        self._op("forge_archived")
        steps = self._hot_steps()
        if not steps:
            return
        step = choose(steps[::-1], pick)
        uri = {
            "dangling": self.roots.nowhere,
            "http": "http://127.0.0.1:9/ckpt",
            "foreign run": self.roots.foreign,
            "hot alias": next(iter(self.roots.aliases.values()), self.roots.hot),
            "hot root": self.roots.hot,
            "archive root": self.roots.arch,
        }[to]
        rel = f"{layout.step_dir(step)}/{layout.ARCHIVED}"
        doc = {"uri": uri, "archived_at": time.time(), "id": uuid.uuid4().hex}
        blob = damage.hostile_doc(doc, "uri", hostile) if hostile else json.dumps(doc).encode()
        self.stores["hot"].write(rel, blob)
        self._damaged(
            f"ARCHIVED: {to}" + (f" {hostile}" if hostile else ""),
            f"ARCHIVED of step {step} -> {to} {hostile}",
        )

    @has("json")
    @rule(how=st.sampled_from(["list", "nest", "inflate", "dict"]), ahead=st.integers(1, 3))
    @refusable
    def plant_pending(self, how: str, ahead: int) -> None:
        """An uncommitted step folder holding a hostile manifest (GC reads pending manifests)."""
        self._op("plant_pending")
        what = damage.plant_pending(self.stores["hot"], self.next_step + ahead, how)
        self._damaged(f"pending manifest: {how}", what)

    def _marker_backup(self) -> bytes | None:
        """The root marker the newest data-intact step was saved under, when the hot root's
        differs from it."""
        self.probe.clear()
        newest = self.truth.newest(self.truth.data_intact)
        if newest is None:
            return None
        want = self.truth.saved[newest].markers["hot"]
        if self.probe.digest("hot", layout.ROOT_MARKER) == want:
            return None
        return self.truth.marker_blobs.get(want)

    @has("json")  # (not "a backup differs": what is on disk varies between replays, see has)
    @rule()
    def restore_root_marker(self) -> None:
        """The user follows the fix an error named: the root marker is restored from a backup."""
        backup = self._marker_backup()
        if backup is None:
            return
        self._op("restore_root_marker")
        self.stores["hot"].write(layout.ROOT_MARKER, backup)
        note("restored the hot root marker")
        self.dirty = True

    # -- damage: step folders --------------------------------------------------------------------
    @has("folders")
    @rule(
        pick=PICK,
        pick2=PICK,
        how=st.sampled_from(["swap", "duplicate", "delete", "file in the way"]),
        ahead=st.integers(0, 3),
    )
    @refusable
    def damage_folder(self, pick: int, pick2: int, how: str, ahead: int) -> None:
        """Swap two step folders, copy one to a step number still to come, delete one, or put
        a file where a coming step's folder will be."""
        self._op("damage_folder")
        if how == "file in the way":
            what = damage.file_in_the_way(self.stores["hot"], self.next_step + ahead)
            self._damaged(f"step folder: {how}", what)
            return
        steps = self._hot_steps()
        if not steps:
            return
        a = choose(steps[::-1], pick)
        store = self.stores["hot"]
        if how == "swap":
            what = damage.swap_folders(store, a, choose(steps, pick2))
        elif how == "duplicate":
            what = damage.duplicate_folder(store, a, self.next_step + ahead)
        else:
            what = damage.delete_folder(store, a)
        self._damaged(f"step folder: {how}", what)
