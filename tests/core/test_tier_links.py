"""The local tier's folders planted as links (ckptflow.core.tier, issue 35 audit): another run's
folder and a user's files reached through a link under <local_dir>/<run_key>/ are never read
(list_pieces) and `link_problem` names the link for the writers (LocalTier, peers), which only
ever write and delete inside the run's own folder. Sandboxes in tmp_path only."""

from __future__ import annotations

import os

from ckptflow.core import tier
from tests.core.test_tier import _piece, _root

RUN = "s3://bucket/run"
OTHER = "s3://bucket/another-run"


def test_no_link_is_no_problem_and_an_absent_folder_neither(tmp_path):
    key = tier.run_key(RUN)
    assert tier.link_problem(str(tmp_path / "local"), key, 0) is None  # nothing there yet
    _piece(_root(tmp_path, rank=0))
    assert tier.link_problem(str(tmp_path / "local"), key, 0) is None
    assert tier.link_problem(f"file://{tmp_path}/local", key, 0) is None
    assert tier.link_problem("memory://local", key, 0) is None  # not a disk: no links
    os.symlink(tmp_path, tmp_path / "alias")  # local_dir itself may be a link (a mount's)
    assert tier.link_problem(str(tmp_path / "alias" / "local"), key, 0) is None


def test_a_run_folder_that_is_a_link_is_a_problem_and_lists_nothing(tmp_path):
    _piece(_root(tmp_path, rank=0, run=OTHER))  # another run's piece in the same hostPath
    local = tmp_path / "local"
    key, other = tier.run_key(RUN), tier.run_key(OTHER)
    os.symlink(local / other, local / key)
    problem = tier.link_problem(str(local), key, 0)
    assert problem and str(local / key) in problem and "link" in problem
    assert tier.list_pieces(str(local), key) == []  # another run's piece is never read


def test_a_rank_folder_that_is_a_link_is_a_problem_and_is_not_listed(tmp_path):
    _piece(_root(tmp_path, rank=0))
    _piece(_root(tmp_path, rank=1, run=OTHER), rank=1)
    local = tmp_path / "local"
    key, other = tier.run_key(RUN), tier.run_key(OTHER)
    os.symlink(local / other / "rank-1", local / key / "rank-1")
    assert tier.link_problem(str(local), key, 0) is None  # rank 0's own folder is fine
    problem = tier.link_problem(str(local), key, 1)
    assert problem and str(local / key / "rank-1") in problem
    assert [(p.rank, p.step) for p in tier.list_pieces(str(local), key)] == [(0, 5)]
    (local / key / "rank-2").write_text("junk")  # not a folder
    assert "not a folder" in tier.link_problem(str(local), key, 2)
