"""Per-rank manifests (format 5): the step index, rank manifests and their merge, torch-free:
a step is written here by hand as two ranks would write it, then read, damaged and forged."""

from __future__ import annotations

import json

import pytest

from ckptflow.core import codec, layout, rankmanifest, rankview, rootreader, tiling
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CorruptCheckpoint, FileMissing
from ckptflow.core.storage import Storage

SAVE, ROOT, STEP = "ab" * 8, "cd" * 8, 3


def _rank_manifest(rank: int, rows: tuple[int, int], save_id: str = SAVE) -> dict:
    """Rank `rank`'s manifest: rows [a, b) of a 4x2 float32 tensor `w`, and the replicated
    value `v` (every rank holds it, as every rank writes its replicated items)."""
    a, b = rows
    raw = bytes(range(8 * (b - a)))
    key = codec.digest(raw)
    part = {
        "object": key,
        "stored_size": len(raw),
        "raw_size": len(raw),
        "raw_offset": 0,
        "raw_hash": key,
        "width": 4,
        "planes": [["raw", len(raw)]],
        "base": None,
    }
    vkey = codec.digest(b"v")
    vpart = dict(part, object=vkey, stored_size=1, raw_size=1, raw_hash=vkey, width=1)
    vpart["planes"] = [["raw", 1]]
    return {
        "format": layout.MANIFEST_FORMAT,
        "format_version": layout.RANKS_VERSION,
        "rank": rank,
        "root_id": ROOT,
        "step": STEP,
        "save_id": save_id,
        "created_at": 1.0,
        "world_size": 2,
        "kind": "full",
        "base_step": None,
        "metadata": {},
        "library": {},
        "tensors": {
            "w": {
                "dtype": "float32",
                "size": [4, 2],
                "chunks": [{"offsets": [a, 0], "sizes": [b - a, 2]}],
            }
        },
        "values": ["v"],
        "items": {
            f"w@{a},0": {"fqn": "w", "offset": [a, 0], "sizes": [b - a, 2], "parts": [part]},
            "v": {"fqn": "v", "offset": None, "parts": [vpart]},
        },
        "objects": {key: {"size": len(raw)}, vkey: {"size": 1}},
        "planner_data": {},
        "stats": {"raw_bytes": len(raw) + 1, "stored_bytes": len(raw) + 1, "new_bytes": 0},
    }


def _write_step(st: Storage, rows=((0, 2), (2, 4)), tamper=None) -> dict:
    """Write a 2-rank format-5 step (rank manifests, index, COMMIT); `tamper(rank, blob)`
    may change a rank manifest's bytes after the index recorded its checksum."""
    sd = layout.step_dir(STEP)
    st.write(
        layout.ROOT_MARKER, json.dumps({"format": layout.ROOT_FORMAT, "root_id": ROOT}).encode()
    )
    records = []
    for rank, r in enumerate(rows):
        blob = mf.dumps(_rank_manifest(rank, r))
        name = layout.rank_manifest_name(SAVE, rank)
        records.append(rankmanifest.rank_record(rank, name, blob, json.loads(blob)))
        st.write(f"{sd}/{name}", tamper(rank, blob) if tamper else blob)
    save = {"step": STEP, "save_id": SAVE, "root_id": ROOT, "world_size": 2, "kind": "full"}
    index = rankmanifest.build_index({**save, "base_step": None, "metadata": {"k": 1}}, records)
    blob = mf.dumps(index)
    st.write(f"{sd}/{layout.manifest_name(SAVE)}", blob)
    commit = {"save_id": SAVE, "manifest_xxh3": codec.digest(blob), "root_id": ROOT}
    st.write(layout.commit_path(STEP), json.dumps({**commit, "format_version": 5}).encode())
    return index


@pytest.fixture
def st(tmp_path):
    return Storage(str(tmp_path / "root"))


def test_merged_manifest_has_the_usual_shape_and_passes_the_full_validator(st):
    _write_step(st)
    m = rootreader.read_manifest(st, STEP)
    assert m["format_version"] == 5 and m["world_size"] == 2 and m["metadata"] == {"k": 1}
    assert sorted(c["offsets"][0] for c in m["tensors"]["w"]["chunks"]) == [0, 2]
    assert set(m["items"]) == {"w@0,0", "w@2,0", "v"}  # the replicated value once
    mf.validate(json.loads(mf.dumps(m)))  # what slim or export would write is readable


def test_a_rank_view_reads_the_index_and_its_own_manifest_only(st):
    _write_step(st)
    reads = []
    real = st.read
    st.read = lambda rel, limit=None: reads.append(rel) or real(rel, limit)
    view, size = rankview.read_rank_view(st, STEP, 1, world_size=2)
    manifests = [r for r in reads if "manifest-" in r]
    assert manifests == [
        f"step-00000003/{layout.manifest_name(SAVE)}",
        f"step-00000003/{layout.rank_manifest_name(SAVE, 1)}",
    ]
    assert view["rank_view"] == 1 and set(view["items"]) == {"w@2,0", "v"} and size > 0
    assert rankview.read_rank_view(st, STEP, 1, world_size=4) is None  # resharding


def test_a_damaged_rank_manifest_is_refused_naming_it(st):
    _write_step(st, tamper=lambda r, b: b.replace(b'"rank":1', b'"rank":0') if r == 1 else b)
    name = layout.rank_manifest_name(SAVE, 1)
    with pytest.raises(CorruptCheckpoint, match=f"{name}: rank manifest checksum"):
        rootreader.read_manifest(st, STEP)


def test_a_rank_manifest_of_another_save_is_refused_even_with_a_matching_checksum(st):
    other = "ef" * 8
    forged = mf.dumps(_rank_manifest(1, (2, 4), save_id=other))
    _write_step(st)
    sd = layout.step_dir(STEP)
    st.write(f"{sd}/{layout.rank_manifest_name(SAVE, 1)}", forged)
    # rewrite index and COMMIT so the checksums agree: only the save id gives it away
    index = json.loads(st.read(f"{sd}/{layout.manifest_name(SAVE)}"))
    index["ranks"][1].update(xxh3=codec.digest(forged), bytes=len(forged))
    blob = mf.dumps(index)
    st.write(f"{sd}/{layout.manifest_name(SAVE)}", blob)
    commit = json.loads(st.read(layout.commit_path(STEP)))
    st.write(
        layout.commit_path(STEP),
        json.dumps(dict(commit, manifest_xxh3=codec.digest(blob))).encode(),
    )
    with pytest.raises(CorruptCheckpoint, match=r"r00001\.json: rank manifest's save_id"):
        rootreader.read_manifest(st, STEP)


def test_rank_manifests_that_overlap_or_leave_a_gap_fail_the_merge(st):
    _write_step(st, rows=((0, 3), (2, 4)))
    with pytest.raises(CorruptCheckpoint, match="do not fit together.*overlap"):
        rootreader.read_manifest(st, STEP)


def test_a_missing_rank_manifest_is_named(st):
    _write_step(st)
    st.delete([f"{layout.step_dir(STEP)}/{layout.rank_manifest_name(SAVE, 0)}"])
    with pytest.raises(FileMissing, match=r"r00000\.json: rank manifest named by the step index"):
        rootreader.read_manifest(st, STEP)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda i: i["ranks"].pop(), "ranks"),
        (lambda i: i["ranks"].reverse(), "ranks"),
        (lambda i: i["ranks"][0].update(manifest="../../etc/passwd"), "ranks\\[0\\].manifest"),
        (lambda i: i["ranks"][1].update(bytes=1 << 60), "ranks\\[1\\].bytes"),
        (lambda i: i.update(world_size=1 << 30), "world_size"),
        (lambda i: i.update(save_id="x"), "save_id"),
    ],
)
def test_a_crafted_index_is_refused_field_by_field(change, field):
    records = [
        rankmanifest.rank_record(r, layout.rank_manifest_name(SAVE, r), b"{}") for r in range(2)
    ]
    save = {"step": 1, "save_id": SAVE, "root_id": ROOT, "world_size": 2, "kind": "full"}
    index = rankmanifest.build_index({**save, "base_step": None, "metadata": {}}, records)
    change(index)
    with pytest.raises(CorruptCheckpoint, match=f"index.json: step index field {field}"):
        rankmanifest.parse_index(mf.dumps(index), "step-00000001/index.json")


def test_partial_tiling_refuses_overlaps_only():
    assert tiling.problem([4, 2], [([0, 0], [2, 2])], cover=False) is None
    assert tiling.problem([4, 2], [([0, 0], [2, 2]), ([1, 0], [2, 2])], cover=False)
    assert tiling.problem([4, 4], [([0, 0], [2, 2]), ([2, 2], [2, 2])], cover=False) is None
    assert tiling.problem([4, 4], [([0, 0], [2, 2]), ([1, 1], [2, 2])], cover=False)
    assert tiling.problem([4, 2], [([0, 0], [2, 2])]) is not None  # the full check still fails
