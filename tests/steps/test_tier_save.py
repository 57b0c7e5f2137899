"""The local tier's saves (steps/checkpoint/tier/local_save.py, issue 35): a global-planned
save into each rank's own root, the fan-out and PIECE, each rank loading from its root alone."""

from __future__ import annotations

import json

from tests.steps import distworkers as dw
from tests.steps import tier_save_workers as tw


def test_each_rank_loads_the_step_from_only_its_own_root(tmp_path):
    local, out = tmp_path / "local", tmp_path / "out"
    out.mkdir()
    dw.spawn(2, tw.save_and_load_alone, str(local), str(out))
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r, rep in enumerate(reports):
        assert rep["loaded"] == rep["step"] == 4
        assert rep["diff"] == [], rep["diff"][:10]
        assert rep["keys"] > 20 and rep["differed_before"] > 10  # the load changed the state
        assert rep["piece"][:2] == [4, r] and rep["problem"] is None
        assert rep["steps"] == [2, 4]  # keep=2: both local steps
        assert rep["bytes_read"] > 0


def test_a_rank_whose_piece_fails_leaves_no_collective_waiting(tmp_path):
    local, out = tmp_path / "local", tmp_path / "out"
    out.mkdir()
    dw.spawn(2, tw.one_rank_fails_worker, str(local), str(out))
    reps = [json.loads((out / f"fail{r}.json").read_text()) for r in range(2)]
    receiver = [r for r, rep in enumerate(reps) if rep["received"] == [6]]
    assert len(receiver) == 1  # the rank without the shared items
    for r, rep in enumerate(reps):
        lost = {6} if r in receiver else set()
        lost |= {4} if r == 1 else set()
        assert rep["complete"] == sorted({2, 4, 6, 8} - lost), (r, rep)
        assert rep["failures"] == len(lost) and rep["enabled"]


def test_objects_damaged_on_the_way_are_refused_by_their_key(tmp_path):
    local, out = tmp_path / "local", tmp_path / "out"
    out.mkdir()
    dw.spawn(2, tw.damaged_sender_worker, str(local), str(out))
    reps = [json.loads((out / f"damaged{r}.json").read_text()) for r in range(2)]
    (sender,) = [r for r, rep in enumerate(reps) if rep["sent"]]
    assert reps[sender]["complete"] == [2, 4] and reps[sender]["failures"] == 0
    assert reps[1 - sender]["complete"] == [4] and reps[1 - sender]["failures"] == 1
    assert "does not match its key" in reps[1 - sender]["why"]
