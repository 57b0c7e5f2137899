"""Async saves: only the snapshot stalls, one save in flight, failures surface, memory is reused."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core.storage import Storage, StorageError


class GatedStorage(Storage):
    """Object writes wait for `gate`; optionally fail (inject storage, don't patch it)."""

    def __init__(self, uri: str):
        super().__init__(uri)
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def write(self, rel, data, *, exclusive=False, **kw):
        if rel.startswith("objects/"):
            self.gate.wait(30)
            if self.fail:
                raise StorageError("injected: no space left on device")
        return super().write(rel, data, exclusive=exclusive, **kw)


def _rss() -> int:
    """Resident bytes of live memory: glibc's free lists are returned to the system first
    (malloc_trim), so memory the allocator merely caches for threads that have ended (each
    save's writer threads) is not counted as held by the checkpointer."""
    if _trim is not None:
        _trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None).malloc_trim
    except (OSError, AttributeError):  # not glibc: RSS as it is
        return None


_trim = _malloc_trim()


def test_async_save_stalls_only_for_the_snapshot(tmp_path):
    st = GatedStorage(str(tmp_path / "r"))
    ck = Checkpointer("unused", storage=st)
    state = {"w": torch.randn(512, 512)}
    saved = state["w"].clone()
    st.gate.clear()
    handle = ck.save(1, state, block=False)
    assert not handle.done(), "the write must still be running while training continues"
    state["w"].add_(1.0)  # training mutates its tensors: the snapshot must not see it
    st.gate.set()
    stats = handle.wait()
    assert handle.done() and stats.stall_s < stats.background_s + stats.stall_s
    assert stats.bytes_raw == 512 * 512 * 4 and stats.bytes_written > 0 and stats.gib_per_s > 0
    t = {"w": torch.zeros(512, 512)}
    ck.load(t)
    assert torch.equal(t["w"], saved)


def test_next_save_waits_for_the_one_in_flight_and_reports_it(tmp_path):
    st = GatedStorage(str(tmp_path / "r"))
    ck = Checkpointer("unused", storage=st)
    st.gate.clear()
    ck.save(1, {"w": torch.randn(64, 64)}, block=False)
    threading.Timer(0.3, st.gate.set).start()
    second = ck.save(2, {"w": torch.randn(64, 64)}, block=False)
    assert second.stats.wait_s >= 0.2
    second.wait()
    assert ck.committed_steps() == [1, 2]
    ck.close()


@pytest.mark.parametrize("surface", ["save", "wait", "close"])
def test_background_failure_is_raised_never_lost(tmp_path, surface):
    st = GatedStorage(str(tmp_path / "r"))
    ck = Checkpointer("unused", storage=st)
    st.fail = True
    handle = ck.save(1, {"w": torch.randn(64, 64)}, block=False)
    while not handle.done():
        time.sleep(0.01)
    with pytest.raises(StorageError, match="injected"):
        if surface == "save":
            st.fail = False
            ck.save(2, {"w": torch.randn(64, 64)})
        elif surface == "wait":
            handle.wait()
        else:
            ck.close()
    assert 1 not in ck.committed_steps()


def test_staging_buffers_are_reused_over_50_async_saves(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=5)
    # A 0-dim tensor too: AdamW keeps its step count as one.
    state = {
        "w": torch.randn(2048, 2048),
        "b": torch.randn(1024),
        "n": torch.tensor(0.0),
        "step": 0,
    }
    for step in range(5):  # warm up: buffers, base copy, allocator pools
        state["w"].add_(0.001)
        state["step"] = step
        ck.save(step, state, block=False)
    ck.save(5, state, block=False).wait()
    before = _rss()
    halfway = None
    for step in range(6, 56):
        state["w"].add_(0.001)
        state["n"].add_(1)
        state["step"] = step
        ck.save(step, state, block=False)
        if step == 30:
            halfway = _rss()
    ck.close()
    grown = _rss() - before
    # A leak of one snapshot per save would be 50 x 16 MiB (25 x 16 over the second half).
    # Allocator noise is a few MiB on an idle machine, up to ~55 MiB on a loaded one (malloc
    # arenas of the save threads, touched once): bounded well below one snapshot per save.
    assert grown < 128 << 20, f"resident memory grew by {grown / 2**20:.1f} MiB over 50 saves"
    per_save = (_rss() - halfway) / 25
    assert per_save < 4 << 20, f"resident memory grows {per_save / 2**20:.2f} MiB per save"
    t = {"w": torch.zeros(2048, 2048), "b": torch.zeros(1024), "n": torch.tensor(0.0), "step": None}
    assert Checkpointer(str(tmp_path / "r")).load(t) == 55
    assert torch.equal(t["w"], state["w"]) and t["step"] == 55 and t["n"] == state["n"]


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_prepare_pre_faults_the_snapshot_buffers_before_the_first_async_save(tmp_path):
    """The first async save's stall used to fault in every page of fresh snapshot buffers;
    after prepare() (which runs in the background) the snapshot only copies into them."""
    ck = Checkpointer(str(tmp_path / "r"))
    state = {"w": torch.randn(4096, 4096), "b": torch.randn(7), "step": 3}
    pages = state["w"].numel() * 4 // 4096
    ck.prepare(state)
    ck._stager.wait_prepared()  # as training does its next steps meanwhile
    before = _minor_faults()
    handle = ck.save(1, state, block=False)
    faults = _minor_faults() - before  # includes a little of the background save's start
    handle.wait()
    assert faults < pages // 4, f"{faults} page faults during the stall ({pages} pages staged)"
    t = {"w": torch.zeros(4096, 4096), "b": torch.zeros(7), "step": None}
    ck.load(t)
    assert torch.equal(t["w"], state["w"]) and t["step"] == 3
    ck.close()
