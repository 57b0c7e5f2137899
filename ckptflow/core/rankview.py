"""One rank's view of a format-5 step (issue 36): the step index and its own rank manifest,
what a load at the saved world size plans with. Apart from rankmanifest.py because it reads
the index through rootreader, which reads rank manifests through rankmanifest: in either of
those it would make an import cycle (tests/test_layering.py)."""

from __future__ import annotations

from ckptflow.core import jsonfile, rankmanifest, rootreader
from ckptflow.core.storage import Storage


def read_rank_view(
    storage: Storage,
    step: int,
    rank: int,
    only: set[str] | None = None,
    world_size: int | None = None,
) -> tuple[dict, int] | None:
    """What rank `rank` of a load at the saved world size plans with: its own rank manifest (its
    shards and every replicated item it holds), read with the COMMIT marker and the index, and
    the bytes read. None when the step is not a format-5 save of at least rank+1 ranks (then
    the caller reads the merged manifest; also when `world_size` is given and the save's
    differs). O(its own shards + the index), whatever the number of ranks."""
    found = rootreader.read_index(storage, step)
    if found is None:
        return None
    index, size = found
    if rank >= index["world_size"] or world_size not in (None, index["world_size"]):
        return None
    with jsonfile.collector_paused():  # validating and merging build acyclic trees too
        m, own = rankmanifest.read_rank(storage, step, index, rank, only)
        view = rankmanifest.merge(index, [m])
    view["rank_view"] = rank  # one rank's chunks only: never a whole step's manifest
    return view, size + own
