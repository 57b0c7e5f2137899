"""The candidate steps of a load of the newest valid step, re-resolved under races (issue 37)."""

from __future__ import annotations

import pytest

from ckptflow.core import candidates
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint, FileMissing, NotCommitted


def _lister(*states):
    """A committed-steps listing that returns each of `states` in turn (the last one forever)."""
    seq = [list(s) for s in states]

    def steps() -> list[int]:
        return seq.pop(0) if len(seq) > 1 else list(seq[0])

    return steps


def test_a_step_deleted_under_the_read_is_not_damage_and_a_newer_one_is_next():
    c = candidates.Candidates("r", _lister([1, 2], [1, 3]))
    assert c.next() == 2
    assert c.failed(2, FileMissing("gone")) == "deleted"
    assert c.next() == 3
    assert c.fell_back == [] and c.deleted == [2]


def test_missing_commit_of_a_deleted_step_is_a_deletion():
    c = candidates.Candidates("r", _lister([1, 2], [1]))
    assert c.next() == 2
    assert c.failed(2, NotCommitted("no COMMIT")) == "deleted"
    assert c.next() == 1 and c.fell_back == []


def test_a_missing_file_of_a_step_still_committed_is_retried_once_then_damage():
    c = candidates.Candidates("r", _lister([1, 2]))
    assert c.next() == 2
    assert c.failed(2, FileMissing("moved?")) == "retry"
    assert c.next() == 2
    assert c.failed(2, FileMissing("still missing")) == "damaged"
    assert c.next() == 1
    assert [s for s, _ in c.fell_back] == [2]


def test_a_checksum_mismatch_of_a_committed_step_is_damage_at_once():
    c = candidates.Candidates("r", _lister([1, 2]))
    assert c.next() == 2
    assert c.failed(2, CorruptCheckpoint("checksum")) == "damaged"
    assert c.next() == 1 and c.next() is None


def test_a_newer_step_committed_during_a_damaged_read_is_tried_before_older_ones():
    c = candidates.Candidates("r", _lister([1, 2], [1, 2, 3]))
    assert c.next() == 2
    assert c.failed(2, CorruptCheckpoint("checksum")) == "damaged"
    assert c.next() == 3


def test_a_root_that_keeps_changing_under_the_read_is_an_error_not_an_endless_load():
    n = iter(range(2, 10_000))

    def steps() -> list[int]:
        s = next(n)
        return [s]  # every listing: one newer step, the one just read deleted

    c = candidates.Candidates("r", steps)
    with pytest.raises(CheckpointError, match="changed 17 times"):
        while (s := c.next()) is not None:
            c.failed(s, FileMissing("gone"))
