"""Corruption: flipped bits, truncated, deleted, swapped and foreign files in a checkpoint root.

Every case checks the same invariant on every step of the root: a load either returns exactly
the bytes that were saved or raises a CheckpointError; `verify` agrees with `load`; a step whose
data or manifest was hit is refused with an error naming the damaged file (checksums make this
mandatory for data files and manifests); `load(step=None)` lands on the newest step that is
still intact and says that it fell back; `ckptflow ckpt verify` exits 1 naming the file.
Corrupted checkpoints are never loaded as if they were good.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CheckpointError

from ckptflow import ckpt_cli
from ckptflow.core import layout
from ckptflow.core.storage import Storage
from tests.steps import ckpt_helpers as h


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {f"w{i}": torch.randn(40, 64, generator=g) * 0.02 for i in range(3)},
        "ids": torch.arange(50) * step,
        "step": step,
        "data": {"position": 100 * step, "epoch": 1},
    }


def _evolve(prev: dict, step: int) -> dict:
    """The next training step: small changes (so step 2 is a compact delta of step 1)."""
    nxt = {
        "model": {k: v + 1e-3 * step for k, v in prev["model"].items()},
        "ids": prev["ids"],
        "step": step,
        "data": {"position": 100 * step, "epoch": 1},
    }
    return nxt


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A root with step 1 (full), step 2 (delta of 1) and step 3 (full); and the states."""
    root = str(tmp_path_factory.mktemp("pristine") / "ckpt")
    ck = Checkpointer(root, full_every=2, threads=2)
    states = {1: _state(1)}
    states[2] = _evolve(states[1], 2)
    states[3] = _evolve(states[2], 3)
    for s in (1, 2, 3):
        ck.save(s, states[s])
    assert [ck.manifest(s)["kind"] for s in (1, 2, 3)] == ["full", "delta", "full"]
    # another run, for "a manifest from another run"
    other = str(tmp_path_factory.mktemp("other") / "ckpt")
    Checkpointer(other, threads=2).save(3, states[3])
    return root, other, states


@dataclass
class Target:
    """A stored file of the root: its relative path, its kind, and the steps it can affect."""

    rel: str
    kind: str
    steps: set


def targets(root: str) -> dict[str, Target]:
    """One file of every kind that a root stores."""
    st = Storage(root)
    ck = Checkpointer(root)
    m1, m2, m3 = (ck.manifest(s) for s in (1, 2, 3))
    needs = {s: set(ck.manifest(s)["objects"]) for s in (1, 2, 3)}

    def obj(key):
        return Target(layout.object_path(key), "", {s for s in needs if key in needs[s]})

    def commit(step):
        return json.loads(st.read(layout.commit_path(step)))

    sd3 = layout.step_dir(3)
    delta_part = next(p for p in m2["items"]["model.w0@0,0"]["parts"] if p["base"] is not None)
    out = {
        "tensor data file (zstd planes)": obj(m3["items"]["model.w1@0,0"]["parts"][0]["object"]),
        "integer tensor data file": obj(m3["items"]["ids@0"]["parts"][0]["object"]),
        "non-tensor value file": obj(m3["items"]["data.position"]["parts"][0]["object"]),
        "delta data file": obj(delta_part["object"]),
        "delta base data file": obj(delta_part["base"]["object"]),
        "manifest": Target(f"{sd3}/{commit(3)['manifest']}", "", {3}),
        "commit marker": Target(layout.commit_path(3), "", {3}),
        "root marker": Target(layout.ROOT_MARKER, "", {1, 2, 3}),
        "save intent": Target(f"{sd3}/{layout.saving_name(commit(3)['save_id'])}", "", set()),
    }
    assert all(st.exists(t.rel) for t in out.values())
    assert m1["kind"] == "full"
    for kind, t in out.items():
        t.kind = kind
    return out


# Kinds whose corruption must always be detected (checksummed bytes); the others may also be
# harmless (a flipped digit of a timestamp), but then the data must still load bitwise.
MUST_DETECT = {
    "tensor data file (zstd planes)",
    "integer tensor data file",
    "non-tensor value file",
    "delta data file",
    "delta base data file",
    "manifest",
}


def _copy(pristine, tmp_path) -> str:
    root = str(tmp_path / "ckpt")
    shutil.copytree(pristine[0], root)
    return root


def _named(exc: BaseException, url: str, kind: str) -> bool:
    text = f"{exc} {getattr(exc, 'files', '')}"
    if kind in ("commit marker", "root marker"):
        # a deleted marker makes the step uncommitted: "no committed checkpoint" is the truth
        return any(w in text for w in (url, "commit marker", "checkpoint root", "no committed"))
    return url in text


def check_invariant(root: str, states: dict, damaged: list[Target], caplog, capsys) -> str:
    """Assert the invariant of the module docstring; return the outcome in words."""
    st = Storage(root)
    ck = Checkpointer(root, threads=2)
    hit = set().union(*(t.steps for t in damaged))
    must = [t for t in damaged if t.kind in MUST_DETECT]
    good, errors = {}, {}
    for s, state in states.items():
        target = h.zeros_like_state(state)
        try:
            assert ck.load(target, step=s) == s
            h.assert_same(state, target, f"step {s}")  # loaded => bitwise identical
            good[s] = True
        except CheckpointError as exc:
            good[s], errors[s] = False, exc
        try:
            ck.verify(s)
            verified = True
        except CheckpointError:
            verified = False
        assert verified == good[s], f"verify and load disagree on step {s}"
        if s not in hit:
            assert good[s], f"step {s} was not damaged but fails: {errors.get(s)}"
    for t in must:
        for s in t.steps:
            assert not good[s], f"damaged {t.kind} of step {s} was not detected"
            assert _named(errors[s], st.url(t.rel), t.kind), (t.kind, str(errors[s]))
    for s in hit - {s for t in must for s in t.steps}:
        if not good[s]:
            assert any(_named(errors[s], st.url(t.rel), t.kind) for t in damaged), str(errors[s])
    # load(step=None): the newest intact step, saying so when it skipped newer ones
    newest = max((s for s in good if good[s]), default=None)
    caplog.clear()
    target = h.zeros_like_state(states[3])
    with caplog.at_level(logging.WARNING, logger="ckptflow.checkpoint"):
        if newest is None:
            with pytest.raises(CheckpointError):
                ck.load(target)
        else:
            target = h.zeros_like_state(states[newest])
            assert ck.load(target) == newest
            h.assert_same(states[newest], target)
            skipped = [s for s, _ in ck.last_load.fell_back_from]
            visible = set(ck.committed_steps())
            assert skipped == sorted((s for s in visible if s > newest), reverse=True)
            if skipped:
                assert "falling back" in caplog.text
    # the CLI agrees
    bad_cli = [s for s in ck.committed_steps() if not good.get(s, False)]
    if ck.committed_steps():
        capsys.readouterr()
        try:
            code = ckpt_cli.main(["verify", root])
        except SystemExit as exc:
            code = exc.code
        out = capsys.readouterr()
        assert code == (1 if bad_cli else 0) or (code == 2 and bad_cli), (code, out)
        if must and bad_cli:
            assert any(st.url(t.rel) in out.out + out.err for t in must), out
    if not any(not good[s] for s in hit):
        return "harmless: every step loads bitwise"
    return "detected: " + ", ".join(f"step {s} refused" for s in sorted(hit) if not good[s])


def flip(root: str, t: Target, rng: random.Random) -> int:
    st = Storage(root)
    blob = bytearray(st.read(t.rel))
    pos = rng.randrange(len(blob))
    blob[pos] ^= 1 << rng.randrange(8)
    st.write(t.rel, bytes(blob))
    return pos


KINDS = [
    "tensor data file (zstd planes)",
    "integer tensor data file",
    "non-tensor value file",
    "delta data file",
    "delta base data file",
    "manifest",
    "commit marker",
    "root marker",
    "save intent",
]


@pytest.mark.parametrize("kind", KINDS)
def test_bit_flips(pristine, tmp_path, kind, caplog, capsys, fault):
    rng = random.Random(kind)
    outcomes = set()
    n = 3
    for i in range(n):
        root = _copy(pristine, tmp_path / str(i))
        t = targets(root)[kind]
        flip(root, t, rng)
        outcomes.add(check_invariant(root, pristine[2], [t], caplog, capsys).split(":")[0])
    fault(
        "corruption",
        f"bit flip at a random position in the {kind}",
        cases=n,
        detail=" / ".join(sorted(outcomes)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_many_bit_flips(pristine, tmp_path, kind, caplog, capsys, fault):
    rng = random.Random(f"many {kind}")
    n, outcomes = 40, set()
    for i in range(n):
        root = _copy(pristine, tmp_path / str(i))
        t = targets(root)[kind]
        flip(root, t, rng)
        outcomes.add(check_invariant(root, pristine[2], [t], caplog, capsys).split(":")[0])
    fault(
        "corruption",
        f"bit flip at a random position in the {kind} (slow run)",
        cases=n,
        detail=" / ".join(sorted(outcomes)),
    )


@pytest.mark.parametrize("how", ["truncate", "delete", "empty"])
@pytest.mark.parametrize("kind", KINDS)
def test_truncated_or_deleted(pristine, tmp_path, kind, how, caplog, capsys, fault):
    root = _copy(pristine, tmp_path)
    t = targets(root)[kind]
    st = Storage(root)
    if how == "delete":
        st.delete([t.rel])
    else:
        blob = st.read(t.rel)
        st.write(t.rel, blob[: len(blob) // 2] if how == "truncate" else b"")
    if kind == "commit marker" and how == "delete":
        # A step without its marker is uncommitted: invisible, never loaded.
        assert Checkpointer(root).committed_steps() == [1, 2]
    outcome = check_invariant(root, pristine[2], [t], caplog, capsys)
    word = {"truncate": "truncated to half", "delete": "deleted", "empty": "emptied"}[how]
    fault("corruption", f"{kind} {word}", detail=outcome.split(":")[0])


def _swap(st: Storage, a: str, b: str) -> None:
    da, db = st.read(a), st.read(b)
    st.write(a, db)
    st.write(b, da)


def test_swapped_data_files_between_steps(pristine, tmp_path, caplog, capsys, fault):
    root = _copy(pristine, tmp_path)
    ts = targets(root)
    a, b = ts["tensor data file (zstd planes)"], ts["delta data file"]
    _swap(Storage(root), a.rel, b.rel)
    check_invariant(root, pristine[2], [a, b], caplog, capsys)
    fault("corruption", "data files of step 3 and step 2 swapped", detail="detected")


def test_swapped_manifests_between_steps(pristine, tmp_path, caplog, capsys, fault):
    root = _copy(pristine, tmp_path)
    st = Storage(root)
    c2, c3 = (json.loads(st.read(layout.commit_path(s))) for s in (2, 3))
    m2 = f"{layout.step_dir(2)}/{c2['manifest']}"
    m3 = f"{layout.step_dir(3)}/{c3['manifest']}"
    _swap(st, m2, m3)
    check_invariant(
        root,
        pristine[2],
        [Target(m2, "manifest", {2}), Target(m3, "manifest", {3})],
        caplog,
        capsys,
    )
    fault("corruption", "manifests of steps 2 and 3 swapped", detail="detected")


def test_swapped_step_folders(pristine, tmp_path, caplog, capsys, fault):
    """COMMIT and manifest of step 2 moved into step 3's folder and back: self-consistent
    files in the wrong place; the manifest's own step number gives them away."""
    root = _copy(pristine, tmp_path)
    st = Storage(root)
    files = {}
    for s in (2, 3):
        c = json.loads(st.read(layout.commit_path(s)))
        sd = layout.step_dir(s)
        files[s] = {
            layout.COMMIT: st.read(f"{sd}/{layout.COMMIT}"),
            c["manifest"]: st.read(f"{sd}/{c['manifest']}"),
        }
        st.delete([f"{sd}/{n}" for n in files[s]])
    for s, other in ((2, 3), (3, 2)):
        for name, blob in files[other].items():
            st.write(f"{layout.step_dir(s)}/{name}", blob)
    c2, c3 = (json.loads(st.read(layout.commit_path(s))) for s in (2, 3))
    damaged = [
        Target(f"{layout.step_dir(2)}/{c2['manifest']}", "manifest", {2}),
        Target(f"{layout.step_dir(3)}/{c3['manifest']}", "manifest", {3}),
    ]
    check_invariant(root, pristine[2], damaged, caplog, capsys)
    fault(
        "corruption",
        "whole step folders (marker + manifest) of steps 2 and 3 swapped",
        detail="detected",
    )


@pytest.mark.parametrize("recommit", [False, True], ids=["as-is", "re-committed"])
def test_manifest_from_another_run(pristine, tmp_path, recommit, caplog, capsys, fault):
    root = _copy(pristine, tmp_path)
    st, other = Storage(root), Storage(pristine[1])
    c3 = json.loads(st.read(layout.commit_path(3)))
    co = json.loads(other.read(layout.commit_path(3)))
    rel = f"{layout.step_dir(3)}/{c3['manifest']}"
    foreign = other.read(f"{layout.step_dir(3)}/{co['manifest']}")
    st.write(rel, foreign)
    if recommit:  # a consistent marker too: only the root id tells them apart
        from ckptflow.core import codec

        c3["manifest_xxh3"] = codec.digest(foreign)
        st.write(layout.commit_path(3), json.dumps(c3).encode())
    check_invariant(root, pristine[2], [Target(rel, "manifest", {3})], caplog, capsys)
    if recommit:
        with pytest.raises(CheckpointError, match="another checkpoint root"):
            Checkpointer(root).manifest(3)
    fault(
        "corruption",
        "manifest replaced by one from another run "
        + ("(with a matching marker)" if recommit else "(without a matching marker)"),
        detail="detected",
    )
