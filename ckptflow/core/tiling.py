"""Whether a tensor's chunks tile it exactly: DCP reads chunks by their offsets, so chunks
of a manifest that overlap or leave a gap would leave part of a tensor unloaded, silently
(volumes alone add up with a chunk listed twice). Used by manifest validation."""

from __future__ import annotations

import math

import numpy as np


def problem(size: list[int], boxes: list, cover: bool = True) -> str | None:
    """None when the boxes (offsets, sizes) inside a tensor of `size` tile it exactly, else
    what is wrong (`cover` False: only that they do not overlap; one rank's chunks, format
    5's rank manifests, cover only its shards). The tensor is cut into slabs at every box edge along each dimension but
    one; each box is listed once per slab it spans, and within every slab the boxes' extents
    along the uncut dimension must follow each other from 0 to its end. A grid (as DTensor
    shards make) costs one entry per box; layouts needing over 4 per box are refused."""
    if math.prod(size) == 0:
        return None  # nothing to cover: every chunk inside is empty
    boxes = [b for b in boxes if all(b[1])]  # an empty chunk holds no element
    if not size:
        if len(boxes) == 1 or (not cover and not boxes):
            return None
        return "chunks overlap or leave the tensor uncovered"
    if all(list(o[1:]) == [0] * (len(size) - 1) and list(s[1:]) == size[1:] for o, s in boxes):
        return _rows(size[0], boxes, cover)
    n = len(size)
    lo = np.array([o for o, _ in boxes], dtype=np.int64).reshape(-1, n)
    hi = lo + np.array([s for _, s in boxes], dtype=np.int64).reshape(-1, n)
    # Cut along the cheapest dimensions first and leave the costliest one uncut (a layout of
    # full-height columns is cut into columns, one of full-width rows into rows).
    edges = [np.unique(np.concatenate([lo[:, d], hi[:, d], [0, size[d]]])) for d in range(n)]
    cost = [
        int((np.searchsorted(e, hi[:, d]) - np.searchsorted(e, lo[:, d])).sum())
        for d, e in enumerate(edges)
    ]
    dims = sorted(range(n), key=lambda d: cost[d])
    lo, hi, size, edges = (
        lo[:, dims],
        hi[:, dims],
        [size[d] for d in dims],
        [edges[d] for d in dims],
    )
    box = np.arange(len(boxes))
    group = np.zeros(len(boxes), dtype=np.int64)
    slabs = 1
    for d in range(n - 1):
        first = np.searchsorted(edges[d], lo[box, d])
        count = np.searchsorted(edges[d], hi[box, d]) - first
        total = int(count.sum())
        if total > 4 * len(boxes) + 1024:
            return f"chunks too irregular to check ({total} slab pieces of {len(boxes)} chunks)"
        slab = np.repeat(first - np.cumsum(count) + count, count) + np.arange(total)
        cut = np.repeat(group, count) * (len(edges[d]) - 1) + slab
        group = np.unique(cut, return_inverse=True)[1]
        box = np.repeat(box, count)
        slabs *= len(edges[d]) - 1
    order = np.lexsort((lo[box, n - 1], group))
    g, a, b = group[order], lo[box, n - 1][order], hi[box, n - 1][order]
    inner = g[1:] == g[:-1]  # consecutive pieces within one slab
    if (a[1:] < b[:-1])[inner].any():
        return "chunks overlap"
    if not cover:
        return None
    covered = (
        len(g) > 0
        and int(g[-1]) + 1 == slabs  # every slab has a piece (g is sorted)
        and not (a[1:] > b[:-1])[inner].any()
        and (a[np.r_[True, ~inner]] == 0).all()
        and (b[np.r_[~inner, True]] == size[-1]).all()
    )
    return None if covered else "chunks leave part of the tensor uncovered"


def _rows(height: int, boxes: list, cover: bool = True) -> str | None:
    """`problem` for chunks of whole rows (one rank's whole tensor, dim-0 shards: nearly every
    save), in plain Python: the general check's numpy costs ~0.1 ms a tensor, 40 ms of every
    save's commit and every load of a 400-tensor model."""
    end = 0
    for o, s in sorted((o[0], s[0]) for o, s in boxes):
        if o < end:
            return "chunks overlap"
        if o > end and cover:
            return "chunks leave part of the tensor uncovered"
        end = o + s
    return None if end == height or not cover else "chunks leave part of the tensor uncovered"
