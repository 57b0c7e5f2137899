"""The restore's choice (issue 35), without a gang: which ranks hold what (from gathered
listings, validated: a gathered object is input), which steps the gang can assemble, and
which local pieces a rank offers (another world size's never; damaged ones reported)."""

from __future__ import annotations

from ckptflow.steps.checkpoint.tier import restore as rs

from ckptflow.core import tier
from ckptflow.core.storage import Storage
from ckptflow.core.storage_errors import StorageError
from tests.steps.tier_restore_workers import copy_piece


def test_holders_drop_malformed_and_hostile_entries():
    a, b = "manifest-0123456789abcdef.json", "manifest-fedcba9876543210.json"
    gathered = [
        {"pieces": [[0, 4, a], [1, 4, a], [0, 3, a]]},
        {"pieces": [[1, 4, a], [1, 3, a], [5, 4, a], [-1, 4, a], [True, 4, a], ["0", 4, a]]},
        {"pieces": [[0], None, [0, 2**70, a], [0, 4], [0, 4, "../x.json"], [0, 4, 7], [1, 4, b]]},
        "not a dict",
        {"pieces": "nope"},
    ]
    held = rs.holders(gathered, world=2)
    assert held == {
        (0, 4, a): [0],
        (1, 4, a): [0, 1],
        (0, 3, a): [0],
        (1, 3, a): [1],
        (1, 4, b): [2],
    }


def test_candidates_need_every_rank_and_are_not_older_than_the_durable_step():
    a, b = "manifest-0123456789abcdef.json", "manifest-fedcba9876543210.json"
    held = {(0, 4, a): [0], (1, 4, a): [1], (0, 3, a): [0], (1, 3, a): [0], (0, 5, a): [0]}
    assert rs.candidates(held, 2, None) == [(4, a), (3, a)]  # step 5 lacks rank 1
    assert rs.candidates(held, 2, 4) == [(4, a)]  # a tie goes to the local step
    assert rs.candidates(held, 2, 5) == []  # the store is newer
    assert rs.candidates(held, 3, None) == []  # a rank the pieces never had
    mixed = {(0, 6, a): [0], (1, 6, b): [1], **held}  # two saves of step 6, one rank each
    assert rs.candidates(mixed, 2, None) == [(4, a), (3, a)]  # never assembled together


def test_a_rank_offers_only_sound_pieces_of_its_world_size(tmp_path):
    import torch
    from ckptflow.steps.checkpoint import Checkpointer

    scratch = Checkpointer(str(tmp_path / "scratch"))
    scratch.save(3, {"w": torch.arange(10.0)})
    scratch.save(4, {"w": torch.arange(10.0) + 1})
    key = "0123456789abcdef"
    local = str(tmp_path / "local")
    copy_piece(scratch.root, 3, 0, 1, tier.piece_root(local, key, 0))
    copy_piece(scratch.root, 4, 0, 1, tier.piece_root(local, key, 0))
    # a piece saved by a gang of two (rank 1's, replicated here): not for a gang of one
    copy_piece(scratch.root, 4, 1, 2, tier.piece_root(local, key, 1))
    # step 4's manifest is gone from rank 0's root: that piece is damaged, and named
    root = tier.piece_root(local, key, 0)
    piece = tier.read_piece(Checkpointer(root).storage, 4, 0)
    (tmp_path / "local" / key / "rank-0" / "step-00000004" / piece.manifest).unlink()
    skipped: list[str] = []
    offered = rs.held_pieces(rs.TierSource(local, key), 0, 1, skipped)
    assert [(p.rank, p.step) for p in offered] == [(0, 3)]
    assert len(skipped) == 1 and piece.manifest in skipped[0], skipped
    # a piece older than the durable step is never used: not offered, not even checked
    assert rs.held_pieces(rs.TierSource(local, key), 0, 1, [], durable=4) == []
    assert [p.step for p in rs.held_pieces(rs.TierSource(local, key), 0, 1, [], durable=3)] == [3]


class BrokenVolume(Storage):
    """A local volume whose every listing fails (an I/O error the storage layer translates)."""

    def child(self, rel: str) -> Storage:
        return self

    def listdir(self, rel: str = "") -> list[str]:
        raise StorageError(f"{self.uri}: input/output error", "io")


def test_an_unreadable_local_volume_costs_the_local_tier_not_the_restore(tmp_path):
    """Any failure of a rank's local work is that rank's missing piece (agreed with the
    gang), never an exception on one rank while the others wait in a collective."""
    import torch
    from ckptflow.steps.checkpoint import Checkpointer

    durable = Checkpointer(str(tmp_path / "ckpt"))
    durable.save(2, {"w": torch.arange(4.0)})
    local = str(tmp_path / "local")
    src = rs.TierSource(local, tier.run_key(durable.root), storage=BrokenVolume(local))
    state = {"w": torch.zeros(4)}
    found = rs.restore(Checkpointer(durable.root), state, src)
    assert (found.step, found.source) == (2, "store") and torch.equal(state["w"], torch.arange(4.0))
    assert any("input/output error" in s for s in found.skipped), found.skipped
