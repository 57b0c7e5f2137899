"""What a save and a load cost each rank must not grow with the number of ranks (issue 36).

Counted, not timed: each rank's requests to an S3 API (moto, counted per access key by
benchmarks/s3_requests.py), at 2 and at 8 ranks with the same tensors per rank.
"""

from __future__ import annotations

import pytest

from benchmarks import scale

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def counted():
    """{world: per-rank request summary} for a save and a fresh Checkpointer's load."""
    rows = scale.summarize_requests(scale.count_requests([2, 8], tensors=4, numel=1024))
    return {r["world"]: r for r in rows}


def test_a_ranks_requests_on_load_do_not_grow_with_the_ranks(counted):
    two, eight = counted[2]["load"], counted[8]["load"]
    assert eight["rank0"] <= two["rank0"], (two, eight)
    assert eight["others_max"] <= two["others_max"], (two, eight)
    # O(own shards + one manifest): 4 small tensors are one pack, read by one GET
    assert eight["other_kinds"].get("GET", 0) <= 8, eight


def test_rank_0s_requests_on_save_do_not_grow_with_the_ranks(counted):
    """Rank 0 writes one manifest and the commit; it neither lists nor checks the objects
    of the other ranks (each rank checks its own before the commit)."""
    two, eight = counted[2]["save"], counted[8]["save"]
    assert eight["rank0"] <= two["rank0"], (two, eight)
    assert eight["others_max"] <= two["others_max"], (two, eight)
