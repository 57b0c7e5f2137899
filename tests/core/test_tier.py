"""The local tier's layout and PIECE files (ckptflow.core.tier, issue 35): damaged, hostile and
oversized PIECE files, missing or wrong-hash objects, bounds. Roots are built by hand in
tmp_path (torch-free, as the module)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from ckptflow.core import codec, layout, rootreader, tier
from ckptflow.core.storage import Storage

SAVE_ID = "0123456789abcdef"
MANIFEST = layout.manifest_name(SAVE_ID)


def _root(tmp_path, rank: int = 0, run: str = "s3://bucket/run") -> Storage:
    return Storage(tier.piece_root(str(tmp_path / "local"), tier.run_key(run), rank))


def _save(storage: Storage, step: int, blobs: list[bytes], world: int = 2) -> dict[str, int]:
    """A committed step whose manifest lists `blobs` as objects (written under their keys)."""
    root_id = rootreader.ensure_root(storage)
    objects = {}
    for b in blobs:
        key = codec.digest(b)
        storage.write(layout.object_path(key), b)
        objects[key] = len(b)
    m = {
        "format": layout.MANIFEST_FORMAT,
        "format_version": layout.FORMAT_VERSION,
        "step": step,
        "world_size": world,
        "root_id": root_id,
        "kind": "full",
        "metadata": {},
        "objects": {k: {"size": n} for k, n in objects.items()},
        "tensors": {},
        "values": [],
        "items": {},
        "stats": {"raw_bytes": 0, "stored_bytes": 0, "new_bytes": 0},
        "created_at": time.time(),
    }
    blob = json.dumps(m).encode()
    d = layout.step_dir(step)
    storage.write(f"{d}/{MANIFEST}", blob)
    commit = {"save_id": SAVE_ID, "manifest_xxh3": codec.digest(blob), "committed_at": time.time()}
    storage.write(layout.commit_path(step), json.dumps(commit).encode())
    return objects


def _piece(storage, step=5, rank=0, world=2, blobs=(b"a" * 100, b"b" * 7)) -> tier.Piece:
    objects = _save(storage, step, list(blobs), world)
    piece = tier.new_piece(rank, world, step, MANIFEST, objects)
    tier.write_piece(storage, piece)
    return piece


def _doc(**over) -> dict:
    key = "0" * 32
    doc = {
        "format": "ckptflow-piece",
        "version": 1,
        "rank": 1,
        "world_size": 2,
        "step": 5,
        "manifest": MANIFEST,
        "objects": {key: 10},
        "bytes": 10,
        "at": 1.0,
    }
    doc.update(over)
    return doc


def test_run_key_is_16_hex_of_the_durable_uri_and_a_trailing_slash_is_the_same_run():
    k = tier.run_key("s3://bucket/run")
    assert len(k) == 16 and int(k, 16) >= 0
    assert tier.run_key("s3://bucket/run/") == k
    assert tier.run_key("s3://bucket/other") != k
    with pytest.raises(ValueError):
        tier.run_key("")


def test_piece_root_refuses_keys_and_ranks_that_would_leave_local_dir(tmp_path):
    key = tier.run_key("s3://b/r")
    assert tier.piece_root("/ckpt-local/", key, 3) == f"/ckpt-local/{key}/rank-3"
    for bad in ("../../etc", "a/b", "", "0123456789ABCDEF", key + "0"):
        with pytest.raises(ValueError):
            tier.piece_root(str(tmp_path), bad, 0)
    for rank in (-1, True, 1.0, "0", 1 << 20):
        with pytest.raises(ValueError):
            tier.piece_root(str(tmp_path), key, rank)
    with pytest.raises(ValueError):
        tier.piece_root("/", key, 0)


def test_a_written_piece_reads_back_verifies_and_lists(tmp_path):
    st = _root(tmp_path, rank=1)
    piece = _piece(st, step=5, rank=1)
    assert piece.bytes == 107
    got = tier.read_piece(st, 5, 1)
    assert (got.rank, got.world_size, got.step, got.manifest) == (1, 2, 5, MANIFEST)
    assert got.objects == piece.objects and got.root == st.uri
    assert tier.verify_piece(st, got) is None
    listed = tier.list_pieces(str(tmp_path / "local"), tier.run_key("s3://bucket/run"))
    assert [(p.rank, p.step, p.bytes, p.root) for p in listed] == [(1, 5, 107, st.uri)]
    # another run's folder is not this run's
    assert tier.list_pieces(str(tmp_path / "local"), tier.run_key("s3://bucket/x")) == []


def test_piece_files_lists_marker_manifest_commit_objects_and_the_piece_last(tmp_path):
    st = _root(tmp_path)
    piece = _piece(st)
    files = tier.piece_files(piece)
    assert files[:3] == [layout.ROOT_MARKER, f"step-00000005/{MANIFEST}", "step-00000005/COMMIT"]
    assert files[-1] == "step-00000005/PIECE-0.json"
    assert files[3:-1] == [layout.object_path(k) for k in sorted(piece.objects)]
    assert all(st.exists(f) for f in files)


def test_an_absent_piece_is_none(tmp_path):
    st = _root(tmp_path)
    _save(st, 5, [b"x"])
    assert tier.read_piece(st, 5, 0) is None


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"{",
        b"[]",
        b"\xff\xfe",
        json.dumps(_doc(format="ckptflow-manifest")).encode(),
        json.dumps(_doc(version=2)).encode(),
        json.dumps(_doc(rank=2)).encode(),  # rank outside world size
        json.dumps(_doc(rank=-1)).encode(),
        json.dumps(_doc(rank=True)).encode(),
        json.dumps(_doc(world_size=0)).encode(),
        json.dumps(_doc(world_size=1 << 40)).encode(),
        json.dumps(_doc(step="5")).encode(),
        json.dumps(_doc(step=1 << 63)).encode(),
        json.dumps(_doc(manifest="../../etc/passwd")).encode(),
        json.dumps(_doc(manifest=["x"])).encode(),
        json.dumps(_doc(objects={"../x": 10}, bytes=10)).encode(),
        json.dumps(_doc(objects={"0" * 32: -1}, bytes=-1)).encode(),
        json.dumps(_doc(objects={"0" * 32: 1 << 50}, bytes=1 << 50)).encode(),
        json.dumps(_doc(objects=[["0" * 32, 10]])).encode(),
        json.dumps(_doc(bytes=11)).encode(),  # not the sum of the sizes
        json.dumps(_doc(at=float("inf"))).encode(),
        json.dumps(_doc(at="now")).encode(),
        b'{"rank": ' + b"9" * 5000 + b"}",
        b"[" * 100 + b"]" * 100,
    ],
)
def test_a_damaged_or_hostile_piece_is_an_error_naming_the_file(tmp_path, blob):
    st = _root(tmp_path, rank=1)
    st.write(tier.piece_path(5, 1), blob)
    with pytest.raises(tier.PieceError) as err:
        tier.read_piece(st, 5, 1)
    assert st.url(tier.piece_path(5, 1)) in str(err.value)
    # and the listing skips it (with a warning) rather than failing
    assert tier.list_pieces(str(tmp_path / "local"), tier.run_key("s3://bucket/run")) == []


def test_an_oversized_piece_is_refused_reading_only_its_bound(tmp_path, monkeypatch):
    st = _root(tmp_path, rank=1)
    st.write(tier.piece_path(5, 1), b" " * (tier.MAX_PIECE_BYTES + 10) + b"{}")
    limits = []
    real = Storage.read
    monkeypatch.setattr(
        Storage, "read", lambda s, rel, limit=None: limits.append(limit) or real(s, rel, limit)
    )
    with pytest.raises(tier.PieceError, match="larger than"):
        tier.read_piece(st, 5, 1)
    assert limits == [tier.MAX_PIECE_BYTES + 1]


def test_too_many_objects_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tier, "MAX_OBJECTS", 3)
    objects = {f"{i:032x}": 1 for i in range(4)}
    blob = json.dumps(_doc(objects=objects, bytes=4)).encode()
    with pytest.raises(tier.PieceError, match="4 entries"):
        tier.parse_piece(blob, "p.json")


def test_a_piece_of_another_rank_or_step_in_its_place_is_an_error(tmp_path):
    st = _root(tmp_path, rank=1)
    _save(st, 5, [b"x"])
    doc = _doc(rank=0, objects={codec.digest(b"x"): 1}, bytes=1)
    st.write(tier.piece_path(5, 1), json.dumps(doc).encode())
    with pytest.raises(tier.PieceError, match="not rank 1 step 5"):
        tier.read_piece(st, 5, 1)
    st.write(tier.piece_path(6, 1), json.dumps(_doc(rank=1)).encode())
    with pytest.raises(tier.PieceError, match="not rank 1 step 6"):
        tier.read_piece(st, 6, 1)


def test_a_missing_object_is_a_problem_naming_it(tmp_path):
    st = _root(tmp_path)
    piece = _piece(st)
    key = sorted(piece.objects)[0]
    st.delete([layout.object_path(key)])
    problem = tier.verify_piece(st, piece)
    assert problem and st.url(layout.object_path(key)) in problem and "missing" in problem


def test_an_object_with_the_wrong_hash_or_size_is_a_problem(tmp_path):
    st = _root(tmp_path)
    piece = _piece(st, blobs=(b"a" * 100,))
    (key,) = piece.objects
    st.write(layout.object_path(key), b"b" * 100)  # same size, other bytes
    problem = tier.verify_piece(st, piece)
    assert problem and key in problem and "checksum" in problem
    # without hashing (a quick look) only sizes are compared
    assert tier.verify_piece(st, piece, check_hash=False) is None
    st.write(layout.object_path(key), b"a" * 99)
    assert "99 bytes" in tier.verify_piece(st, piece, check_hash=False)


def test_a_piece_whose_object_is_not_in_the_manifest_is_a_problem(tmp_path):
    st = _root(tmp_path)
    _save(st, 5, [b"a"])
    stray = b"not of this save"
    st.write(layout.object_path(codec.digest(stray)), stray)
    piece = tier.new_piece(0, 2, 5, MANIFEST, {codec.digest(stray): len(stray)})
    assert "not in the step's manifest" in tier.verify_piece(st, piece)


def test_missing_commit_manifest_or_marker_or_another_manifest_is_a_problem(tmp_path):
    st = _root(tmp_path)
    piece = _piece(st)
    other = tier.Piece(**{**piece.__dict__, "manifest": "manifest-fedcba9876543210.json"})
    assert "another manifest" in tier.verify_piece(st, other)
    st.write(f"step-00000005/{MANIFEST}", b"{}")  # damaged manifest: checksum
    assert "checksum" in tier.verify_piece(st, piece)
    st.delete([layout.commit_path(5)])
    assert "no committed checkpoint" in tier.verify_piece(st, piece)
    st2 = _root(tmp_path, rank=1)
    p2 = _piece(st2, rank=1)
    st2.delete([layout.ROOT_MARKER])
    assert "root marker" in tier.verify_piece(st2, p2)


def test_a_piece_of_another_world_size_than_its_manifest_is_a_problem(tmp_path):
    st = _root(tmp_path)
    _save(st, 5, [b"a"], world=2)
    piece = tier.new_piece(0, 4, 5, MANIFEST, {codec.digest(b"a"): 1})
    assert "world size 4" in tier.verify_piece(st, piece)


def test_list_pieces_skips_junk_and_sorts_by_step_then_rank(tmp_path):
    base = tmp_path / "local"
    key = tier.run_key("s3://bucket/run")
    for rank in (1, 0):
        st = _root(tmp_path, rank=rank)
        for step in (8, 4):
            _piece(st, step=step, rank=rank, blobs=(f"{rank}{step}".encode(),))
    (base / key / "rank-x").mkdir()
    (base / key / "junk.txt").write_text("x")
    (base / key / f"rank-{uuid.uuid4().int}").mkdir()  # a rank beyond any gang
    (base / key / "rank-0" / "step-00000009").mkdir()  # a save in progress: no PIECE
    got = [(p.step, p.rank) for p in tier.list_pieces(str(base), key)]
    assert got == [(4, 0), (4, 1), (8, 0), (8, 1)]
    assert tier.list_pieces(str(tmp_path / "none"), key) == []
