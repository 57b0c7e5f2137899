"""Hostile JSON files and fields: damage stays in the step it belongs to.

Three committed steps (1, 2, 3); one file of the newest step (3) is made hostile: too deeply
nested, a 5,000-digit integer, or a field of the wrong type, missing or huge. A crafted manifest
is self-consistent (COMMIT carries its checksum), so only parsing and validation stand between
it and the reader. For every case:

* `load` (newest) falls back to step 2 without a crash (unless the file cannot make the data
  wrong: eval.json, PIN);
* `ckpt ls` lists every step, the damaged one as corrupt, and exits 0;
* `ckpt verify` reports the damaged step corrupt (exit 1) and still checks the others;
* `ckpt gc` goes on with the others and never deletes the newest valid step (2 when step 3 is
  damaged; a stored value that matches its checksum but does not decode is found only by
  `load`, so there the listing and gc see step 3 as valid).
"""

from __future__ import annotations

import json

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.safe_value import MAGIC

from ckptflow.ckpt_cli import main
from ckptflow.core import codec, layout, rootreader, runroot
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

DEEP = b"[" * 100_000 + b"]" * 100_000
LONG_INT = b"1" * 5000


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(16, 16, generator=g), "cfg": {"lr": 0.5 * seed}}


@pytest.fixture
def root(tmp_path) -> str:
    root = str(tmp_path / "ckpt")
    ck = Checkpointer(root, full_every=1)
    for s in (1, 2, 3):
        ck.save(s, _state(s))
    ck.close()
    return root


def _commit(st: Storage, step: int) -> dict:
    return json.loads(st.read(layout.commit_path(step)))


def _manifest_rel(st: Storage, step: int) -> str:
    return f"{layout.step_dir(step)}/{_commit(st, step)['manifest']}"


def _recommit(st: Storage, step: int, blob: bytes) -> None:
    """Store `blob` as the step's manifest, with a commit marker that matches it."""
    commit = _commit(st, step)
    st.write(_manifest_rel(st, step), blob)
    commit["manifest_xxh3"] = codec.digest(blob)
    st.write(layout.commit_path(step), json.dumps(commit).encode())


def _edit_manifest(mutate):
    def apply(st: Storage) -> None:
        m = json.loads(st.read(_manifest_rel(st, 3)))
        mutate(m)
        _recommit(st, 3, json.dumps(m).encode())

    return apply


def _raw_manifest(replace: tuple[bytes, bytes]):
    def apply(st: Storage) -> None:
        blob = st.read(_manifest_rel(st, 3))
        assert replace[0] in blob
        _recommit(st, 3, blob.replace(*replace, 1))

    return apply


def _edit_commit(mutate):
    def apply(st: Storage) -> None:
        c = _commit(st, 3)
        c = mutate(c) or c
        st.write(layout.commit_path(3), json.dumps(c).encode())

    return apply


def _raw_commit(blob: bytes):
    return lambda st: st.write(layout.commit_path(3), blob)


def _value(blob: bytes):
    """Replace step 3's stored `cfg.lr` value with `blob` (self-consistent)."""

    def apply(st: Storage) -> None:
        key = codec.digest(blob)
        st.write(layout.object_path(key), blob)
        m = json.loads(st.read(_manifest_rel(st, 3)))
        m["items"]["cfg.lr"]["parts"][0].pop("span", None)  # its own object, not a pack's span
        m["items"]["cfg.lr"]["parts"][0].update(
            object=key,
            stored_size=len(blob),
            raw_size=len(blob),
            planes=[["raw", len(blob)]],
            width=1,
            base=None,
        )
        m["objects"][key] = {"size": len(blob)}
        _recommit(st, 3, json.dumps(m).encode())

    return apply


def _pop(key):
    return lambda d: d.pop(key)


def _set(**kw):
    return lambda d: d.update(kw)


# name -> (damage, what `load`, `ls` and `verify` see: "corrupt" or "sound")
CASES = {
    # COMMIT
    "commit: deeply nested": (_raw_commit(b'{"save_id": ' + DEEP + b"}"), "corrupt"),
    "commit: 5,000-digit committed_at": (
        lambda st: st.write(
            layout.commit_path(3),
            st.read(layout.commit_path(3)).replace(
                b'"committed_at": ', b'"committed_at": 1' + LONG_INT + b', "x": ', 1
            ),
        ),
        "corrupt",
    ),
    "commit: committed_at a string": (_edit_commit(_set(committed_at="yesterday")), "corrupt"),
    "commit: committed_at a list": (_edit_commit(_set(committed_at=[1])), "corrupt"),
    "commit: committed_at a boolean": (_edit_commit(_set(committed_at=True)), "corrupt"),
    "commit: committed_at huge": (_edit_commit(_set(committed_at=1e300)), "corrupt"),
    "commit: committed_at negative": (_edit_commit(_set(committed_at=-5.0)), "corrupt"),
    "commit: a JSON list": (_raw_commit(b"[1, 2]"), "corrupt"),
    "commit: save_id a number": (_edit_commit(_set(save_id=12345678)), "corrupt"),
    # manifest
    "manifest: deeply nested metadata": (
        _raw_manifest((b'"metadata":{', b'"metadata":{"deep":' + DEEP + b",")),
        "corrupt",
    ),
    "manifest: 5,000-digit world_size": (
        _raw_manifest((b'"world_size":1', b'"world_size":' + LONG_INT)),
        "corrupt",
    ),
    "manifest: stats missing": (_edit_manifest(_pop("stats")), "corrupt"),
    "manifest: stats a list": (_edit_manifest(_set(stats=[1, 2, 3])), "corrupt"),
    "manifest: stats.raw_bytes a string": (
        _edit_manifest(lambda m: m["stats"].update(raw_bytes="many")),
        "corrupt",
    ),
    "manifest: stats.new_bytes missing": (
        _edit_manifest(lambda m: m["stats"].pop("new_bytes")),
        "corrupt",
    ),
    "manifest: stats.stored_bytes huge": (
        _edit_manifest(lambda m: m["stats"].update(stored_bytes=1 << 70)),
        "corrupt",
    ),
    "manifest: created_at missing": (_edit_manifest(_pop("created_at")), "corrupt"),
    "manifest: created_at a string": (_edit_manifest(_set(created_at="now")), "corrupt"),
    "manifest: created_at huge": (_edit_manifest(_set(created_at=1e300)), "corrupt"),
    "manifest: a JSON list": (lambda st: _recommit(st, 3, b"[1, 2, 3]"), "corrupt"),
    # a stored value (found by load only: its bytes match their checksum)
    "value: deeply nested": (
        _value(b'{"$": "' + MAGIC.encode() + b'", "v": ' + DEEP + b"}"),
        "load-corrupt",
    ),
    "value: 5,000-digit integer": (
        _value(b'{"$": "' + MAGIC.encode() + b'", "v": ' + LONG_INT + b"}"),
        "load-corrupt",
    ),
    # eval.json and PIN: the checkpoint is sound, the record is left out
    "eval.json: deeply nested": (lambda st: st.write(runroot.eval_path(3), DEEP), "sound"),
    "eval.json: 5,000-digit metric": (
        lambda st: st.write(
            runroot.eval_path(3), b'{"step": 3, "metrics": {"val_loss": ' + LONG_INT + b"}}"
        ),
        "sound",
    ),
    "eval.json: a JSON list": (lambda st: st.write(runroot.eval_path(3), b"[3]"), "sound"),
    "eval.json: step a string": (
        lambda st: st.write(runroot.eval_path(3), b'{"step": "3", "metrics": {}}'),
        "sound",
    ),
    "PIN: deeply nested": (lambda st: st.write(runroot.pin_path(3), DEEP), "sound"),
    "PIN: 5,000-digit reason": (
        lambda st: st.write(runroot.pin_path(3), b'{"reason": ' + LONG_INT + b"}"),
        "sound",
    ),
    "PIN: a JSON list": (lambda st: st.write(runroot.pin_path(3), b'["x"]'), "sound"),
    # ARCHIVED
    "ARCHIVED: deeply nested": (
        lambda st: st.write(f"{layout.step_dir(3)}/{layout.ARCHIVED}", DEEP),
        "corrupt",
    ),
    "ARCHIVED: 5,000-digit uri": (
        lambda st: st.write(
            f"{layout.step_dir(3)}/{layout.ARCHIVED}", b'{"uri": ' + LONG_INT + b"}"
        ),
        "corrupt",
    ),
}


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, out.out, out.err


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_file_is_a_corrupt_step_not_a_crash(root, name, capsys, fault):
    damage, effect = CASES[name]
    st = Storage(root)
    damage(st)
    target = {"w": torch.zeros(16, 16), "cfg": {"lr": None}}
    loaded = Checkpointer(root).load(target)
    assert loaded == (3 if effect == "sound" else 2), name
    assert torch.equal(target["w"], _state(loaded)["w"])
    capsys.readouterr()  # the load's fallback warnings

    rc, out, err = _cli(capsys, "ls", root, "--json")
    assert rc == 0 and err == "", err
    rows = {r["step"]: r for r in json.loads(out)}
    assert sorted(rows) == [1, 2, 3]
    assert rows[1]["state"] == rows[2]["state"] == "committed"
    want = "corrupt" if effect == "corrupt" else "committed"
    assert rows[3]["state"] == want, rows[3]
    if want == "corrupt":
        assert rows[3]["problems"] and root in " ".join(rows[3]["problems"])
    rc, out, _ = _cli(capsys, "ls", root)
    assert rc == 0 and len(out.splitlines()) >= 4

    rc, out, err = _cli(capsys, "verify", root)
    assert rc == (1 if effect == "corrupt" else 0), out + err
    assert "step 1: ok" in out and "step 2: ok" in out
    if effect == "corrupt":
        assert "step 3: CORRUPT" in out

    rc, out, err = _cli(capsys, "gc", root, "--policy", "last=1", "--grace", "0", "--yes", "--json")
    assert rc == 0, err
    # never deleted on the strength of a damaged newer step: the newest valid one stays
    newest_valid = 2 if effect == "corrupt" else 3
    assert json.loads(out)["keep"][str(newest_valid)], out
    assert newest_valid in rootreader.committed_steps(Storage(root))
    fault("hostile", f"hostile JSON: {name}", detail="confined to its step")


def test_uncommitted_manifest_that_is_a_list_does_not_block_gc(root, capsys, fault):
    """A leftover (uncommitted) folder whose manifest is a JSON list, deeply nested, or has a
    5,000-digit integer: gc goes on with the root and collects what is collectable."""
    st = Storage(root)
    for step, blob in ((4, b"[1, 2]"), (5, DEEP), (6, b'{"objects": ' + LONG_INT + b"}")):
        st.write(f"{layout.step_dir(step)}/{layout.manifest_name('ab' * 8)}", blob)
    rc, out, err = _cli(capsys, "gc", root, "--policy", "last=1", "--grace", "0", "--json")
    assert rc == 0 and sorted(json.loads(out)["leftovers"]) == [4, 5, 6], err
    rc, out, err = _cli(capsys, "gc", root, "--policy", "last=1", "--grace", "0", "--yes", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["delete_steps"] == [1, 2] and sorted(report["leftovers"]) == [4, 5, 6]
    assert rootreader.committed_steps(st) == [3]
    fault("hostile", "uncommitted manifests: a list, deep nesting, a huge integer", cases=3)


def _nested(depth: int) -> dict:
    doc: dict = {}
    for _ in range(depth):
        doc = {"d": doc}
    return doc


@pytest.mark.parametrize(
    ("metadata", "expect"),
    [
        (_nested(200), "nested deeper"),
        ({"n": int("9" * 200)}, "integer of 200 digits"),
        ({"f": object()}, "not plain JSON"),
    ],
    ids=["200 levels deep", "a 200-digit integer", "not JSON"],
)
def test_metadata_the_reader_would_refuse_is_refused_by_save(root, metadata, expect):
    """Never commit a checkpoint whose manifest cannot be read back."""
    from ckptflow.steps.checkpoint import CheckpointError

    ck = Checkpointer(root)
    with pytest.raises(CheckpointError, match=expect):
        ck.save(4, _state(4), metadata=metadata)
    assert rootreader.committed_steps(Storage(root)) == [1, 2, 3]
    ck.save(4, _state(4), metadata=_nested(100))  # deep but within the reader's bounds
    assert Checkpointer(root).manifest(4)["metadata"] == _nested(100)


@pytest.mark.parametrize(
    "blob",
    [DEEP, b'{"format": "ckptflow-checkpoint-root", "root_id": ' + LONG_INT + b"}", b"[1]"],
    ids=["deeply nested", "a 5,000-digit root_id", "a JSON list"],
)
def test_a_hostile_root_marker_is_one_line_naming_it(root, blob, capsys):
    """A hostile root marker is never parsed unbounded: reads go on by the root id the
    committed steps agree on, with one warning line naming the marker and the repair; every
    command that would change the root refuses in one line naming it (exit 2); load never
    raises a RecursionError."""
    st = Storage(root)
    st.write(layout.ROOT_MARKER, blob)
    marker = st.url(layout.ROOT_MARKER)
    for argv in (["ls", root], ["verify", root]):
        rc, out, err = _cli(capsys, *argv)
        assert rc == 0 and len(err.strip().splitlines()) == 1 and marker in err, err
        assert "ckpt repair" in err, err
    rc, out, err = _cli(capsys, "gc", root, "--policy", "last=1", "--yes")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and marker in err, err
    assert rootreader.committed_steps(st) == [1, 2, 3]
    target = {"w": torch.zeros(16, 16), "cfg": {"lr": None}}
    assert Checkpointer(root).load(target) == 3
