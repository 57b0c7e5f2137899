"""Same-host exchange of the cooperative load (coop_local.py), in one process: memory reads,
the reachability probe, and which parts go by memory rather than broadcast."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from ckptflow.steps.checkpoint import coop_local
from ckptflow.steps.checkpoint.coop import _Plan

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or coop_local._READV is None,
    reason="process_vm_readv is Linux-only",
)


def test_read_remote_copies_many_segments_in_batches():
    src = np.arange(3000, dtype=np.uint8)
    dst = np.zeros(3000, dtype=np.uint8)
    # more segments than one call takes (1024), and an empty one
    segs = [(dst.ctypes.data + i, src.ctypes.data + i, 1) for i in range(2999)]
    segs.append((dst.ctypes.data + 2999, src.ctypes.data + 2999, 0))
    coop_local.read_remote(os.getpid(), segs)
    assert np.array_equal(dst[:2999], src[:2999]) and dst[2999] == 0


def test_read_remote_of_unmapped_memory_is_an_oserror():
    dst = np.zeros(16, dtype=np.uint8)
    with pytest.raises(OSError):
        coop_local.read_remote(os.getpid(), [(dst.ctypes.data, 8, 16)])


def test_probe_trusts_only_the_right_token_on_the_same_boot():
    info, buf = coop_local.probe_info()
    boot, pid, addr, token = info
    wrong = (boot, pid, addr, bytes(16))
    elsewhere = ("another-boot", pid, addr, token)
    assert coop_local.probe_row([info, info, wrong, elsewhere], 0) == [True, True, False, False]
    del buf
    reach = coop_local.reach([[True, True, False], [False, True, True], [True, True, True]])
    assert reach == [[True, False, False], [False, True, True], [False, True, True]]


def _plan(ptrs=(1000, 2000), gpu=(False, False)):
    chunk = {r: {"w@0": ([64, 32], gpu[r], ptrs[r])} for r in (0, 1)}
    return _Plan(2, [chunk[0], chunk[1]])


def test_parts_go_by_memory_only_when_owner_and_every_needer_can():
    both = [[True, True], [True, True]]
    plan = _plan()
    assert all(plan.by_memory(u, both) for u in plan.owners)
    # the second part starts where the first ends in each rank's destination
    assert plan.ptrs[(1, ("w@0", 1))] == 2064
    assert not any(plan.by_memory(u, [[True, False], [False, True]]) for u in plan.owners)
    gpu = _plan(gpu=(False, True))
    assert not any(gpu.by_memory(u, both) for u in gpu.owners)
    unfilled = _plan(ptrs=(0, 0))  # neither fills a destination directly: broadcast
    assert not any(unfilled.by_memory(u, both) for u in unfilled.owners)
