"""Same-host exchange for the cooperative load: a rank copies a part straight out of the memory
of the rank that decoded it (Linux cross-memory attach, `process_vm_readv`).

Over loopback TCP a gloo broadcast moves ~0.5 GiB/s and costs the sender a copy per receiver;
ranks that share a host can do better, as NCCL's shared-memory transport does. Here the owner
decodes a part straight into its own destination tensor, as a plain load does, and raises a
one-byte ready flag in its own memory; a peer polls that flag (a 1-byte read of the owner's
memory) and, once it is up, copies the part from the owner's destination into its own in one
kernel copy: no socket, no shared buffer, no extra resident memory, and only the small control
messages of the setup go over the process group.

Integrity: the flag goes up only after the owner verified the part's checksum and decoded it
without error, so no rank uses bytes another rank did not verify; a failure raises the owner's
error flag instead and every rank waiting on it stops (then all fall back together, coop.py).
The owner's destination stays untouched until every rank has passed the final agreement.

Which peers are reachable is probed, not assumed: each rank reads a random token out of every
peer with the same boot id; a pair is local only when both directions read the right token
(another host, another pid namespace, a seccomp or ptrace policy that forbids it: the pair
keeps the process-group broadcast).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait

import numpy as np

_IOV_MAX = 1024  # segments per process_vm_readv call (Linux's UIO_MAXIOV)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc_readv():
    """libc's process_vm_readv, or None where there is none (not Linux, an old libc) or where
    the ready flag needs a memory fence this module does not issue: x86-64 keeps a thread's
    stores in order (the destination bytes are visible before the flag written after them);
    weaker orderings (aarch64) keep the broadcast until a release store is used for the flag."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    return fn


_READV = _libc_readv()


def read_remote(pid: int, segments: list[tuple[int, int, int]]) -> None:
    """Copy (local address, remote address, length) segments out of process `pid`; OSError when
    the kernel refuses or copies less (a partial copy is resumed where it stopped)."""
    todo = [s for s in segments if s[2] > 0]
    while todo:
        batch = todo[:_IOV_MAX]
        local = (_Iovec * len(batch))(*[_Iovec(d, n) for d, _, n in batch])
        remote = (_Iovec * len(batch))(*[_Iovec(s, n) for _, s, n in batch])
        got = _READV(pid, local, len(batch), remote, len(batch), 0) if _READV else -1
        if got <= 0:
            err = ctypes.get_errno() if _READV else 38  # ENOSYS
            raise OSError(err, f"cannot read the memory of rank process {pid}: {os.strerror(err)}")
        rest = todo[len(batch) :]
        for i, (d, s, n) in enumerate(batch):  # resume a partial copy at the first short segment
            if got < n:
                rest = [(d + got, s + got, n - got), *batch[i + 1 :], *rest]
                break
            got -= n
        todo = rest


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip()
    except OSError:
        return ""


def probe_info() -> tuple[tuple, np.ndarray]:
    """(what this rank tells its peers: boot id, pid, address and value of a random token;
    the token's buffer, to keep alive until every peer has probed it)."""
    token = os.urandom(16)
    buf = np.frombuffer(bytearray(token), dtype=np.uint8)
    return (_boot_id(), os.getpid(), buf.ctypes.data, token), buf


def probe_row(infos: list, rank: int) -> list[bool]:
    """For each rank: whether this rank read the right token out of its memory."""
    row = []
    for peer, info in enumerate(infos):
        boot, pid, addr, tok = info
        ok = peer == rank
        if not ok and boot and boot == _boot_id() and _READV is not None:
            got = np.zeros(16, dtype=np.uint8)
            try:
                read_remote(pid, [(got.ctypes.data, addr, 16)])
                ok = got.tobytes() == tok
            except OSError:
                ok = False
        row.append(ok)
    return row


def reach(rows: list[list[bool]]) -> list[list[bool]]:
    """reach[a][b]: a and b each read the other's token (what every rank agrees to use)."""
    n = len(rows)
    return [[bool(rows[a][b] and rows[b][a]) for b in range(n)] for a in range(n)]


class LocalPhase:
    """The parts exchanged by memory copy on one rank: decode the owned ones (at most `threads`
    in flight) raising a flag per part, copy the needed ones from their owners as their flags
    go up. `run` is coop._Run (its _read, _slice, _done, error); `flags` this rank's flag
    array (one per owned local part, the last one the error flag)."""

    def __init__(self, run, pool, own: list, flags: np.ndarray, needed: dict, remote: dict):
        self.run, self.pool, self.flags = run, pool, flags
        self.own = list(own)  # [(unit, flag index)]
        self.needed = needed  # owner rank -> [(unit, flag index, owner's address)]
        self.remote = remote  # owner rank -> (pid, address of its flags, number of flags)
        self.bytes_copied = 0

    def _decode(self, u, pos: int) -> None:
        self.run._read(u)
        if self.run.error is None:
            self.run._done(u[0])
        # Raised only after the checksum was verified and the part decoded without error.
        self.flags[-1 if self.run.error is not None else pos] = 1

    def _poll(self, owner: int) -> bool:
        """Copy what `owner` has ready; True when something came (or it failed)."""
        pid, addr, n = self.remote[owner]
        seen = np.zeros(n, dtype=np.uint8)
        read_remote(pid, [(seen.ctypes.data, addr, n)])
        if seen[-1]:
            raise PeerFailed(owner)
        ready = [w for w in self.needed[owner] if seen[w[1]]]
        if not ready:
            return False
        segs = []
        for u, _, src in ready:
            dst = self.run._slice(u)
            segs.append((dst.data_ptr(), src, dst.numel()))
        read_remote(pid, segs)
        for (u, _, _), seg in zip(ready, segs, strict=True):
            self.bytes_copied += seg[2]
            self.run._done(u[0])  # (a temporary chunk buffer is freed at its last part)
        self.needed[owner] = [w for w in self.needed[owner] if not seen[w[1]]]
        return True

    def _idle(self, seconds: float) -> None:
        """Wait for a peer's flag (nothing of this rank's own is in flight)."""
        time.sleep(seconds)

    def go(self) -> None:
        work, inflight = list(self.own), []
        window, idle = max(1, self.run.ex.threads), 0.0001
        try:
            while True:
                # Finished decodes are dropped before topping up: dropped after, a slot freed
                # by a decode that just finished stayed empty until the next round, and with
                # none in flight the round slept (every part waited up to 2 ms).
                inflight = [f for f in inflight if not f.done()]
                while work and len(inflight) < window:
                    inflight.append(self.pool.submit(self._decode, *work.pop(0)))
                got = any(self._poll(o) for o in list(self.needed) if self.needed[o])
                if self.run.error is not None:
                    break
                if not work and not inflight and not any(self.needed.values()):
                    break
                # Nothing new: wait for a decode of ours or a peer's flag, polling less often
                # the longer nothing comes (0.1 -> 0.5 ms: a part takes milliseconds to decode,
                # and a poll is one small read of the owner's memory).
                idle = 0.0001 if got else min(0.0005, idle * 2)
                if not got and inflight:
                    wait(inflight, timeout=idle, return_when=FIRST_COMPLETED)
                elif not got:
                    self._idle(idle)
        except (OSError, PeerFailed) as exc:  # reported to every rank at the end (coop.py)
            self.run.error = self.run.error or exc
            self.flags[-1] = 1
        finally:
            wait(inflight)


class PeerFailed(Exception):
    """The owner of a part this rank waits for could not read its share."""

    def __init__(self, owner: int):
        super().__init__(f"rank {owner} could not read its share")
