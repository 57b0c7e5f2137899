"""The snapshot copy of async saves: split over copy threads, bitwise complete, buffers reused."""

from __future__ import annotations

import threading

import numpy as np
import torch
from ckptflow.steps.checkpoint import Checkpointer, staging
from ckptflow.steps.checkpoint.staging import Stager

from ckptflow.core import adaptive
from ckptflow.core.storage import Storage


def _state() -> dict:
    """Over PARALLEL_MIN in all, with tensors that are no multiple of a copy slice."""
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(4096, 4096, generator=g),  # 64 MiB: four slices
        "e": torch.randn(1_000_003, generator=g),
        "nested": [{"b": torch.randn(7, generator=g)}, torch.tensor(3.0)],
        "step": 12,
    }


def _flat(obj, out=None, path=""):
    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        out[path] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flat(v, out, f"{path}/{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _flat(v, out, f"{path}/{i}")
    return out


def test_a_large_snapshot_is_copied_by_several_threads_bitwise_and_into_the_same_buffers():
    state = _state()
    assert sum(t.numel() * 4 for t in _flat(state).values()) >= staging.PARALLEL_MIN * 2
    stager = Stager(copy_threads=2)
    try:
        first = stager.stage(state)
        assert stager.copy_lanes == 2, "the copy slices were not shared by two threads"
        expect = {k: v.clone() for k, v in _flat(state).items()}
        for t in _flat(state).values():
            t.add_(1.0)  # training mutates right after the stage returns
        got = _flat(first)
        assert got.keys() == expect.keys() and first["step"] == 12
        for k, v in expect.items():
            assert torch.equal(
                got[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)
            ), k
        second = _flat(stager.stage(state))
        for k, v in got.items():
            assert second[k].data_ptr() == v.data_ptr(), f"{k}: a fresh buffer per save"
            assert torch.equal(second[k], _flat(state)[k])
    finally:
        stager.close()


def test_copy_threads_default_to_the_cores_at_most_four():
    for cores, want in ((1, 1), (2, 2), (4, 4), (16, 4), (192, 4)):
        assert staging.default_copy_threads(cores) == want, cores


def test_copy_threads_follow_the_cores_the_process_may_use(monkeypatch):
    # A pod limited to 1 CPU on a bigger node: os.cpu_count() says the node's cores.
    monkeypatch.setattr(adaptive, "process_cores", lambda: 1)
    assert staging.default_copy_threads() == 1


def test_a_small_snapshot_is_copied_by_the_calling_thread_alone():
    stager = Stager(copy_threads=4)
    state = {"w": torch.randn(256, 256)}
    staged = stager.stage(state)
    assert stager.copy_lanes == 1 and stager._pool is None
    assert torch.equal(staged["w"], state["w"])


class GatedStorage(Storage):
    """Object writes wait for `gate` (inject storage, don't patch it)."""

    def __init__(self, uri: str):
        super().__init__(uri)
        self.gate = threading.Event()

    def write(self, rel, data, *, exclusive=False, **kw):
        if rel.startswith("objects/"):
            self.gate.wait(30)
        return super().write(rel, data, exclusive=exclusive, **kw)


def test_an_async_save_copied_in_parallel_holds_the_state_of_its_call(tmp_path):
    st = GatedStorage(str(tmp_path / "r"))
    ck = Checkpointer("unused", storage=st)
    ck._stager.copy_threads = 2  # (as a 2-core host has it: a 1-core one copies alone)
    state = _state()
    expect = {k: v.clone() for k, v in _flat(state).items()}
    handle = ck.save(1, state, block=False)
    assert ck._stager.copy_lanes == 2
    for t in _flat(state).values():
        t.mul_(-3.0)  # the optimizer step right after save returns
    st.gate.set()
    handle.wait()
    loaded = _state()
    for t in _flat(loaded).values():
        t.zero_()
    ck.load(loaded)
    for k, v in _flat(loaded).items():
        assert torch.equal(v, expect[k]), k
    ck.close()
    assert ck._stager._pool is None, "close stops the copy threads"


def _vm_flags(addr: int) -> list[str]:
    """The VmFlags of the mapping of this process holding `addr` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_large_snapshot_buffers_ask_for_huge_pages():
    """The copy into the snapshot is the stall, bound by memory bandwidth: into buffers on huge
    pages it took 0.116 s per GiB against 0.135 s on 4 KiB pages (two copy threads, paired).
    Small ones stay ordinary tensors (a huge page each would waste most of it)."""
    stager = Stager()
    state = {"big": torch.randn(4 << 20), "small": torch.randn(8)}
    staged = stager.stage(state)
    assert torch.equal(staged["big"], state["big"]) and torch.equal(staged["small"], state["small"])
    assert "hg" in _vm_flags(staged["big"].data_ptr())
    assert staged["big"].dtype == torch.float32 and staged["big"].shape == state["big"].shape
    again = stager.stage(state)
    assert again["big"].data_ptr() == staged["big"].data_ptr()  # reused, as ever


def test_checkpointer_threads_follow_the_cores_the_process_may_use(monkeypatch, tmp_path):
    # 2 to 8 writer threads, from a pod's CPU quota (not the node's cores: 8 threads encoding
    # on a 1-CPU pod only fight over it).
    for cores, want in ((1, 2), (4, 4), (64, 8)):
        monkeypatch.setattr(adaptive, "process_cores", lambda c=cores: c)
        assert Checkpointer(str(tmp_path / "ck")).threads == want, cores


def test_unprepared_buffers_are_advised_onto_huge_pages_only_after_their_copy(monkeypatch):
    """Faulted in as huge pages during the stall, each fault zeroes 2 MiB (and may compact
    memory first): a first save without `prepare` copies into ordinary pages, then asks for
    huge pages (collapsed in the background); prepared buffers are advised when allocated."""
    import numpy as np

    seen = []
    advise = staging.advise_huge
    monkeypatch.setattr(
        staging,
        "advise_huge",
        lambda mm: (seen.append(bytes(np.frombuffer(mm, dtype=np.uint8)[:8])), advise(mm)),
    )
    state = {"big": torch.arange(1 << 20, dtype=torch.float32) + 1}
    staged = Stager().stage(state)
    assert seen == [state["big"].numpy().view(np.uint8)[:8].tobytes()]  # the copy came first
    assert "hg" in _vm_flags(staged["big"].data_ptr())
    seen.clear()
    prepared = Stager()
    prepared.prepare(state)
    prepared.wait_prepared()
    assert seen == [bytes(8)]  # advised when allocated, before any copy
    assert torch.equal(prepared.stage(state)["big"], state["big"])
    assert len(seen) == 1  # nothing more to advise: the prepared buffer was reused


def test_unprepared_buffers_are_private_memory_populated_slice_by_slice_before_the_copy(
    monkeypatch,
):
    """The first unprepared stall was page faults, not the copy: buffers were shared anonymous
    mappings (shmem), each 4 KiB page faulted in by the copy's first write. Private memory
    populated per copy slice by one madvise (MADV_POPULATE_WRITE, no trap per page) took
    0.19-0.22 CPU-s per 512 MiB on this host against 0.37-0.39 (fresh processes, alternated)."""
    seen = []
    real = staging.populate
    monkeypatch.setattr(
        staging, "populate", lambda dst: (seen.append((dst.ctypes.data, dst.nbytes)), real(dst))
    )
    state = {"big": torch.randn(staging.COPY_SLICE // 4 + 12345), "small": torch.randn(8)}
    stager = Stager(copy_threads=2)
    staged = stager.stage(state)
    assert torch.equal(staged["big"], state["big"]) and torch.equal(staged["small"], state["small"])
    assert "sh" not in _vm_flags(staged["big"].data_ptr()), "a shared (shmem) mapping"
    at, nbytes = staged["big"].data_ptr(), state["big"].numel() * 4
    assert sorted(seen) == [
        (at, staging.COPY_SLICE),
        (at + staging.COPY_SLICE, nbytes - staging.COPY_SLICE),
    ]
    seen.clear()
    state["big"].add_(1.0)
    again = stager.stage(state)
    assert seen == [] and again["big"].data_ptr() == staged["big"].data_ptr()  # pages are there
    assert torch.equal(again["big"], state["big"])


def test_buffers_of_entries_no_longer_staged_are_released():
    """Memory stays bounded by the last snapshot: a buffer kept per path ever staged grew with
    every differently keyed state (a model-only save after a full one kept the optimizer's)."""
    stager = Stager()
    stager.stage({"a": torch.randn(1 << 20), "n": {"s": torch.randn(8)}, "k": 1})
    staged = stager.stage({"b": torch.randn(1 << 20), "n": {"s": torch.randn(8)}})
    assert stager.nbytes() == (4 << 20) + 32
    assert torch.equal(staged["n"]["s"], stager.stage({"n": {"s": staged["n"]["s"]}})["n"]["s"])
    assert stager.nbytes() == 32


def _present_pages(addr: int, nbytes: int) -> int:
    """How many of the 4 KiB pages at [addr, addr + nbytes) are in memory (/proc/self/pagemap:
    bit 63 of each page's entry; a mapping's smaps counts the anonymous mappings it merged)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // 4096 * 8)
        entries = np.frombuffer(f.read(nbytes // 4096 * 8), dtype=np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum())


def test_populate_takes_a_fresh_slice_in_without_writing_it():
    buf, mm = staging.mapped_buffer((3 << 20,), torch.uint8)
    assert mm is not None and _present_pages(buf.data_ptr(), 3 << 20) == 0
    staging.populate(buf.numpy()[: 2 << 20])
    # (kernels before 5.14: none; the copy faults them in)
    assert _present_pages(buf.data_ptr(), 3 << 20) == (2 << 20) // 4096
    assert not buf.any()


def test_a_forked_child_does_not_share_the_snapshot_buffers_copy_on_write():
    """Private buffers (a shared mapping's pages fault in slower) would be copy-on-write in a
    child forked by training (DataLoader workers): the next snapshot's copy would then copy
    every page once more. The child gets them zero-filled instead (MADV_WIPEONFORK)."""
    import os

    state = {"big": torch.arange(1 << 20, dtype=torch.float32) + 1}
    staged = Stager().stage(state)["big"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what does it see? (nothing else: it leaves at once)
        os.write(w, staged.numpy()[:4].tobytes())
        os._exit(0)
    os.close(w)
    seen = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    assert seen == bytes(16), "the child shares the buffer copy-on-write"
    assert torch.equal(staged, state["big"])
