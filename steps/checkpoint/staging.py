"""Snapshot a state dict into reusable host buffers: the only part of an async save that stalls.

Tensors (plain and DTensor) are copied into CPU buffers kept across saves, keyed by their
path in the state dict, so resident memory does not grow from save to save. With CUDA the
buffers are pinned and the copies non-blocking, followed by one synchronize. Non-tensor values
are deep-copied, so training may mutate its own objects while the background save runs.

`prepare` allocates and pre-faults the buffers in a background thread before the first save:
fresh buffers fault in every page on their first copy (or are pinned page by page), which made
the first async save stall ten times longer than the later ones. Without `prepare`, fresh
buffers are private memory populated one copy slice at a time just before that slice's copy
(one madvise, no trap per 4 KiB page), and buffers of entries a snapshot no longer has are
released: memory stays one snapshot's.

Into buffers already there the stall is the host copy alone (profiled: over 95% of it is
memcpy), so CPU tensors are copied by up to `copy_threads` threads at once, in slices: one thread
copies at well under a host's memory bandwidth, and training waits for the copy anyway, so its
cores are free. (Into fresh buffers, the first stall was mostly the kernel faulting pages in.)
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import itertools
import math
import mmap
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ckptflow.core import adaptive

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch without distributed
    DTensor = ()  # type: ignore[assignment]


PAGE = 4096  # bytes per page touched by prepare (larger pages are touched more than once)
COPY_SLICE = 16 << 20  # bytes per copy task: threads stay balanced on one big tensor
# Below this many bytes a snapshot is copied by the calling thread alone: handing slices to
# other threads would cost more than it saves.
PARALLEL_MIN = 32 << 20
HUGE_MIN = 2 << 20  # a huge page's size: smaller buffers are ordinary tensors
# A host's memory bandwidth is reached with a few copy threads; more would only contend.
MAX_COPY_THREADS = 4
# madvise: fault a range's pages in for writing, in the kernel (Linux 5.14; the mmap module of
# Python 3.11 does not name it; include/uapi/asm-generic/mman-common.h)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
# madvise: a child forked later sees the range zero-filled, not shared copy-on-write (Linux 4.14)
MADV_WIPEONFORK = getattr(mmap, "MADV_WIPEONFORK", 18)


def host_buffer(shape, dtype) -> torch.Tensor:
    """An uninitialised CPU tensor; one of HUGE_MIN bytes or more is an anonymous mapping
    advised onto huge pages (where the kernel offers them, e.g. transparent_hugepage=madvise).

    The snapshot copy is bound by memory bandwidth and the TLB: into buffers on huge pages it
    took 0.116 s per GiB against 0.135 s on 4 KiB pages (two copy threads, paired rounds; then
    shared mappings, which this host never put on huge pages (shmem_enabled=never): that
    difference was not the pages' size)."""
    t, mm = mapped_buffer(shape, dtype)
    if mm is not None:
        advise_huge(mm)
    return t


def mapped_buffer(shape, dtype) -> tuple[torch.Tensor, mmap.mmap | None]:
    """An uninitialised CPU tensor and, for one of HUGE_MIN bytes or more, the anonymous
    mapping it views (not yet advised onto huge pages: `advise_huge`)."""
    n = math.prod(shape) * dtype.itemsize
    if n < HUGE_MIN:
        return torch.empty(shape, dtype=dtype), None
    # Private, not mmap's default shared mapping: shared anonymous memory is shmem, whose pages
    # fault in slower (first unprepared stall of 512 MiB: 0.37 CPU-s shared, 0.25 private) and
    # never on huge pages unless the host's shmem_enabled says so.
    mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # Private pages would be copy-on-write in a child forked while they live (DataLoader
    # workers): the next snapshot's copy would copy every page once more. No child needs them.
    if sys.platform == "linux":
        with contextlib.suppress(OSError):  # (kernels before 4.14: copy-on-write, as any tensor)
            mm.madvise(MADV_WIPEONFORK)
    # (the tensor holds the mapping: it is unmapped with the tensor's last reference)
    return torch.frombuffer(mm, dtype=torch.uint8).view(dtype).view(shape), mm


def advise_huge(mm: mmap.mmap) -> None:
    """Ask for huge pages for a mapping: pages not yet touched are faulted in as huge pages,
    and ones already there are collapsed later by the kernel (khugepaged, in the background)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no madvise, no THP
        mm.madvise(mmap.MADV_HUGEPAGE)


def _libc_madvise():
    """libc's madvise through ctypes, which releases the GIL for the call (mmap.madvise holds
    it: a copy thread populating its slice stopped the others between their copies)."""
    if sys.platform != "linux":
        return None
    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_MADVISE = _libc_madvise()


def populate(dst: np.ndarray) -> None:
    """Fault in the pages of `dst`, a page-aligned slice of a fresh mapping, for writing, in one
    call: trapping on each 4 KiB page during the copy cost more than the copy (populated first,
    the first unprepared stall of 512 MiB took 0.19-0.22 CPU-s against 0.25-0.29). Where the
    call fails (Linux < 5.14, other systems) the copy faults the pages in, as before."""
    if _MADVISE is not None and dst.nbytes:
        _MADVISE(dst.ctypes.data, dst.nbytes, MADV_POPULATE_WRITE)  # (-1 on failure: harmless)


def default_copy_threads(cores: int | None = None) -> int:
    """The cores this process may use (adaptive.process_cores: a pod's CPU quota, not the
    node's cores), at most MAX_COPY_THREADS: training waits for the copy, so its cores are
    free. (On a 2-core host, 1 GiB of 396 tensors, in the benchmark's async save after an
    AdamW step: a stall of 0.154 s with two copy threads, 0.220 s with one.)"""
    n = adaptive.process_cores() if cores is None else cores
    return max(1, min(MAX_COPY_THREADS, n))


class Stager:
    """Copies state dicts into host buffers it owns and reuses."""

    def __init__(self, copy_threads: int = 1):
        self._buffers: dict[str, torch.Tensor] = {}
        self._pin = torch.cuda.is_available()
        self._prep: threading.Thread | None = None
        self.prepared_s = 0.0  # how long the last prepare() took in the background
        self.copy_threads = max(1, copy_threads)  # threads copying a snapshot at once
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list = []  # (destination, source, fresh) of the stage under way
        self._staged: set[str] = set()  # the paths the stage under way gave a buffer
        self.copy_lanes = 0  # threads that shared the last stage's copy (tests read it)
        self._advise_after: list[mmap.mmap] = []  # buffers of the stage under way (_alloc_now)

    def _alloc(self, shape, dtype) -> torch.Tensor:
        if self._pin:
            return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=True)
        return host_buffer(shape, dtype)

    def _alloc_now(self, shape, dtype) -> tuple[torch.Tensor, bool]:
        """A buffer allocated while training waits (no `prepare`) and whether it is a fresh
        mapping (its copy populates it slice by slice: `populate`): on ordinary pages, advised
        onto huge pages only once the snapshot is copied (stage). Faulted in as huge pages
        during the copy, each fault zeroes 2 MiB, and on this host (a VM whose free huge
        blocks the hypervisor takes back) the first unprepared stall of 512 MiB took 0.7-3.0 s
        in 7 of 10 fresh processes (0.11-0.36 s in the others) against 0.14-0.58 s on ordinary
        pages."""
        if self._pin:
            return self._alloc(shape, dtype), False
        buf, mm = mapped_buffer(shape, dtype)
        if mm is not None:
            self._advise_after.append(mm)
        return buf, mm is not None

    def _buffer(self, path: str, src: torch.Tensor) -> torch.Tensor:
        buf, fresh = self._buffers.get(path), False
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf, fresh = self._alloc_now(src.shape, src.dtype)
            self._buffers[path] = buf
        self._staged.add(path)
        # A conjugate or negative view holds its values only lazily: its bytes are not them.
        src = src.detach().resolve_conj().resolve_neg()
        if src.device.type == "cpu" and src.is_contiguous() and src.numel():
            # Copied by _copy_pending once every buffer is known: plain memcpys on our own
            # threads (torch's copy_ would split them over its intra-op threads, which contend
            # with training's threads and stalled longer under load).
            self._pending.append(
                (
                    buf.reshape(-1).view(torch.uint8).numpy(),
                    src.reshape(-1).view(torch.uint8).numpy(),
                    fresh,
                )
            )
        else:
            buf.copy_(src, non_blocking=self._pin and src.is_cuda)
        return buf

    def _stage(self, obj, path: str):
        if isinstance(obj, DTensor):
            local = self._buffer(path, obj._local_tensor)
            # A CPU DTensor with the same mesh and placements: DCP plans the same chunks.
            return DTensor(local, obj._spec, requires_grad=False)
        if isinstance(obj, torch.Tensor):
            return self._buffer(path, obj)
        if isinstance(obj, dict):
            return {k: self._stage(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._stage(v, f"{path}/{i}") for i, v in enumerate(obj)]
        return copy.deepcopy(obj)

    def _shapes(self, obj, path: str, out: dict) -> dict:
        """path -> (shape, dtype) of every tensor `_stage` would give a buffer."""
        if isinstance(obj, DTensor):
            obj = obj._local_tensor
        if isinstance(obj, torch.Tensor):
            out[path] = (obj.shape, obj.dtype)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                self._shapes(v, f"{path}/{k}", out)
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                self._shapes(v, f"{path}/{i}", out)
        return out

    def prepare(self, state_dict: dict) -> None:
        """Allocate and pre-fault buffers for `state_dict`'s tensors in a background thread
        (shapes are read now); the next `stage` waits for it, then only copies."""
        self.wait_prepared()
        want = self._shapes(state_dict, "", {})
        self._prep = threading.Thread(
            target=self._allocate, args=(want,), name="ckpt-stage-prepare", daemon=True
        )
        self._prep.start()

    def _allocate(self, want: dict) -> None:
        t0 = time.perf_counter()
        for path, (shape, dtype) in want.items():
            buf = self._buffers.get(path)
            if buf is not None and buf.shape == shape and buf.dtype == dtype:
                continue
            buf = self._alloc(shape, dtype)
            if buf.numel():
                # One write per page faults it in now, not during the first snapshot's copy.
                buf.reshape(-1).view(torch.uint8).numpy()[::PAGE] = 0
            self._buffers[path] = buf
        self.prepared_s = time.perf_counter() - t0

    def wait_prepared(self) -> None:
        prep, self._prep = self._prep, None
        if prep is not None:
            prep.join()

    def stage(self, state_dict: dict) -> dict:
        """A host copy of `state_dict`, complete when this returns."""
        self.wait_prepared()
        self._pending, self._staged = [], set()
        try:
            staged = self._stage(state_dict, "")
            self._copy_pending()
            # Buffers of entries this snapshot lacks are released (memory stays one snapshot's).
            for path in self._buffers.keys() - self._staged:
                del self._buffers[path]
        finally:
            self._pending = []  # never keep training's arrays alive past the stage
            for mm in self._advise_after:  # the next saves copy into huge pages
                advise_huge(mm)
            self._advise_after = []
        if self._pin:
            torch.cuda.synchronize()
        return staged

    def _copy_pending(self) -> None:
        """Copy every pending (destination, source) pair in slices (a fresh mapping populated
        slice by slice, just before its copy), over the copy threads when the snapshot is
        large. Returns when all bytes are copied (a failure is raised here)."""
        pairs = self._pending
        total = sum(len(src) for _, src, _ in pairs)
        threads = min(self.copy_threads, max(1, total // PARALLEL_MIN))
        tasks = [
            (dst[o : o + COPY_SLICE], src[o : o + COPY_SLICE], fresh)
            for dst, src, fresh in pairs
            for o in range(0, len(src), COPY_SLICE)
        ]
        if threads == 1:
            _drain(tasks, itertools.count(), set())
            self.copy_lanes = 1
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.copy_threads - 1, thread_name_prefix="ckpt-stage-copy"
            )
        nxt, copiers = itertools.count(), set()  # next() of a count is atomic under the GIL
        futures = [self._pool.submit(_drain, tasks, nxt, copiers) for _ in range(threads - 1)]
        _drain(tasks, nxt, copiers)  # the calling thread copies too
        for f in futures:
            f.result()
        self.copy_lanes = len(copiers)

    def close(self) -> None:
        """Stop the copy threads (buffers stay usable: a later stage starts new ones)."""
        self.wait_prepared()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


def _drain(tasks: list, nxt, copiers: set) -> None:
    """Copy tasks[next(nxt)] until none is left (numpy's copy releases the GIL); `copiers`
    collects the threads that shared the queue (every one has returned when stage returns)."""
    copiers.add(threading.get_ident())
    while (i := next(nxt)) < len(tasks):
        dst, src, fresh = tasks[i]
        if fresh:
            populate(dst)
        np.copyto(dst, src)
