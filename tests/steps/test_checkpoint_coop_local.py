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


class _FakeRun:
    """What LocalPhase uses of coop._Run: decodes that count how many run at once."""

    def __init__(self, threads=2, fail=None):
        import threading

        import torch

        self.ex = type("Ex", (), {"threads": threads})()
        self.error = None
        self.fail, self.lock = fail, threading.Lock()
        self.running = self.peak = 0
        self.done: list = []
        self.bufs = {u: torch.zeros(64, dtype=torch.uint8) for u in [("a", i) for i in range(8)]}

    def _read(self, u):
        import time

        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.01)
        with self.lock:
            self.running -= 1
        if u == self.fail:
            self.error = self.error or OSError("unreadable")

    def _done(self, key):
        self.done.append(key)

    def _slice(self, u):
        return self.bufs[u]


class _CountingPhase(coop_local.LocalPhase):
    """LocalPhase that counts its idle sleeps (waits with no decode of its own in flight)."""

    sleeps = 0

    def _idle(self, seconds: float) -> None:
        self.sleeps += 1
        super()._idle(seconds)


def _phase(run, own, needed=None, remote=None):
    from concurrent.futures import ThreadPoolExecutor

    flags = np.zeros(len(own) + 1, dtype=np.uint8)
    with ThreadPoolExecutor(max_workers=4) as pool:
        phase = _CountingPhase(run, pool, own, flags, needed or {}, remote or {})
        phase.go()
    return phase, flags


@pytest.mark.parametrize("threads", [1, 2])
def test_owned_parts_follow_each_other_without_idle_sleeps(threads):
    """A finished decode is replaced at once: the loop sleeps only when it waits for peers
    (it slept after every decode that finished, up to 2 ms a part: 6x a plain load with one
    thread)."""
    run = _FakeRun(threads=threads)
    phase, flags = _phase(run, [(("a", i), i) for i in range(6)])
    assert list(flags) == [1] * 6 + [0]
    assert phase.sleeps == 0


def test_owned_parts_are_decoded_at_most_threads_at_once_then_flagged():
    run = _FakeRun(threads=2)
    own = [(("a", i), i) for i in range(6)]
    _, flags = _phase(run, own)
    assert run.peak <= 2 and run.error is None
    assert list(flags) == [1] * 6 + [0]  # every part flagged, the error flag down


def test_a_part_that_fails_is_never_flagged_and_raises_the_error_flag():
    run = _FakeRun(threads=1, fail=("a", 2))
    own = [(("a", i), i) for i in range(6)]
    _, flags = _phase(run, own)
    assert isinstance(run.error, OSError)
    assert flags[2] == 0 and flags[-1] == 1 and not flags[3:-1].any()


def test_a_part_is_copied_once_its_owner_flags_it_and_a_failed_owner_stops_the_wait():
    import threading

    src = np.full(64, 7, dtype=np.uint8)
    peer = np.zeros(2, dtype=np.uint8)  # the "owner's" flags: one part, then its error flag
    run = _FakeRun()
    needed = {1: [(("a", 7), 0, src.ctypes.data)]}
    remote = {1: (os.getpid(), peer.ctypes.data, 2)}
    threading.Timer(0.05, lambda: peer.__setitem__(0, 1)).start()
    phase, _ = _phase(run, [], dict(needed), remote)
    assert run.bufs[("a", 7)].numpy().tolist() == [7] * 64 and phase.bytes_copied == 64
    assert run.error is None and run.done == ["a"]
    peer[:] = [0, 1]  # the owner failed before flagging the part: no copy, PeerFailed
    run = _FakeRun()
    phase, flags = _phase(run, [], dict(needed), remote)
    assert isinstance(run.error, coop_local.PeerFailed) and phase.bytes_copied == 0
    assert run.bufs[("a", 7)].numpy().sum() == 0 and flags[-1] == 1


def test_parts_copied_by_memory_go_largest_first_in_one_order_for_every_rank():
    from ckptflow.steps.checkpoint.coop import largest_first

    sizes = {("a", 0): 10, ("a", 1): 300, ("b", 0): 300, ("c", 0): 5}
    assert largest_first(list(sizes), sizes) == [("a", 1), ("b", 0), ("a", 0), ("c", 0)]
    assert largest_first(list(reversed(sizes)), sizes) == largest_first(list(sizes), sizes)
