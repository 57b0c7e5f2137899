"""What a save checks before it commits: that every object its manifest needs is in place."""

from __future__ import annotations

import os
import threading
import time

from ckptflow.core import layout, listing, locator
from ckptflow.core.storage import Storage


def _key(i: int) -> str:
    return f"{i:02x}" + f"{i:030x}"  # a distinct prefix folder per object


def _put(root: str, key: str, size: int = 10, rel: str | None = None) -> None:
    path = os.path.join(root, rel or layout.object_path(key))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x" * size)


class Walks(Storage):
    """A real root that records the folders listed, and holds each listing `delay` seconds
    (an object store pages its listings) counting how many run at once."""

    def __init__(self, uri: str, delay: float = 0.0):
        super().__init__(uri)
        self.delay, self.folders, self.now, self.peak = delay, [], 0, 0
        self._lock = threading.Lock()

    def walk(self, rel=""):
        with self._lock:
            self.folders.append(rel)
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(self.delay)
            return super().walk(rel)
        finally:
            with self._lock:
                self.now -= 1


def test_the_commit_check_lists_only_the_folders_of_the_objects_it_needs(tmp_path):
    """A root keeping many checkpoints holds millions of objects: listing all of them before
    every commit cost O(root) requests per save on an object store. Only the key-prefix folders
    of the manifest's objects are listed."""
    root = str(tmp_path / "r")
    for i in range(40):  # other checkpoints' objects, under 40 other prefixes
        _put(root, _key(100 + i))
    need = {_key(1): 10, _key(2): 10}
    for k in need:
        _put(root, k)
    st = Walks(root)
    assert listing.missing_objects(st, need) == []
    assert sorted(st.folders) == [f"{layout.OBJECTS}/01", f"{layout.OBJECTS}/02"]


def test_the_folders_are_listed_concurrently(tmp_path):
    """Within one listing an object store pages 1,000 keys per request, one after another; the
    prefix folders are listed LIST_THREADS at a time."""
    root = str(tmp_path / "r")
    need = {_key(i): 10 for i in range(8)}
    for k in need:
        _put(root, k)
    st = Walks(root, delay=0.05)
    assert listing.missing_objects(st, need) == []
    assert st.peak > 1 and len(st.folders) == 8


def test_missing_wrong_size_and_misplaced_objects_are_reported(tmp_path):
    """An object under another key's folder is not where a reader looks for it: missing (the
    whole listing matched file names alone and called it present)."""
    root = str(tmp_path / "r")
    here, short, gone, astray = _key(1), _key(2), _key(3), _key(4)
    _put(root, here)
    _put(root, short, size=3)
    _put(root, astray, rel=f"{layout.OBJECTS}/01/{astray}")
    bad = listing.missing_objects(Storage(root), {k: 10 for k in (here, short, gone, astray)})
    assert len(bad) == 3
    assert f"{short} (size 3, expected 10)" in bad[0]
    assert bad[1].endswith(f"{gone} (missing)") and bad[2].endswith(f"{astray} (missing)")


def test_borrowed_objects_are_found_in_the_parent_root_by_listing(tmp_path, monkeypatch):
    """A fine-tune borrows its base's objects: they are looked up in the parent roots by the
    same prefix listings (a HEAD per object was one request per part), the first parent
    holding an object giving its size."""
    base, child = str(tmp_path / "base"), str(tmp_path / "child")
    mine, borrowed, nowhere = _key(1), _key(2), _key(3)
    _put(child, mine)
    _put(base, borrowed, size=7)
    parent = Walks(base)
    monkeypatch.setattr(locator, "parent_stores", lambda st: [parent])
    bad = listing.missing_objects(Storage(child), {mine: 10, borrowed: 7, nowhere: 10})
    assert len(bad) == 1 and bad[0].endswith(f"{nowhere} (missing)")
    assert sorted(parent.folders) == [f"{layout.OBJECTS}/02", f"{layout.OBJECTS}/03"]


class NoHeads(Walks):
    """A parent root that must be listed, not asked object by object (one HEAD per object)."""

    def size(self, rel):
        raise AssertionError(f"a HEAD of {rel}: borrowed objects are looked up by listing")


def test_ls_looks_borrowed_objects_up_by_listing_the_parent(tmp_path, monkeypatch):
    """`ckpt ls` of a fine-tune root checks the base's objects it borrows: one HEAD each, one
    after another, was tens of thousands of requests for a large base; now the parent's
    prefix folders of the keys not in the root are listed once per row (sizes cached)."""
    base, child = str(tmp_path / "base"), str(tmp_path / "child")
    mine, borrowed, short, nowhere = _key(1), _key(2), _key(3), _key(4)
    _put(child, mine)
    _put(base, borrowed)
    _put(base, short, size=4)
    parent = NoHeads(base)
    monkeypatch.setattr(locator, "parent_stores", lambda st: [parent])
    st = Storage(child)
    row = listing.StepRow(step=5, state="committed")
    row.objects = {mine: 10, borrowed: 10, short: 10, nowhere: 10}
    cache: dict = {}
    listing.check_objects(row, listing.list_objects(st), st, cache)
    assert row.state == "corrupt" and len(row.problems) == 2
    assert "(size 4, expected 10)" in row.problems[0] and row.problems[1].endswith("(missing)")
    assert sorted(parent.folders) == [f"{layout.OBJECTS}/0{i}" for i in (2, 3, 4)]
    again = listing.StepRow(step=6, state="committed", objects={borrowed: 10})
    listing.check_objects(again, listing.list_objects(st), st, cache)
    assert again.state == "committed" and len(parent.folders) == 3  # cached: not listed again


def test_a_file_under_another_keys_folder_is_not_listed_as_that_object(tmp_path):
    """GC, archive and `ls` take the whole listing: a file named like a key under another key's
    folder (an alias) is not that object, whatever its size and age."""
    root = str(tmp_path / "r")
    real, alias_only = _key(1), _key(2)
    _put(root, real)
    _put(root, real, size=99, rel=f"{layout.OBJECTS}/ff/{real}")
    _put(root, alias_only, rel=f"{layout.OBJECTS}/ff/{alias_only}")
    found = listing.list_objects(Storage(root))
    assert set(found) == {real} and found[real].size == 10
    assert found[real].path == layout.object_path(real)
