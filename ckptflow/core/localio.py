"""Local-disk I/O primitives of the checkpoint engine: early writeback, per-file durability,
O_DIRECT writes and reads into caller buffers.

Every function degrades to a portable equivalent where the platform lacks the primitive
(`sync_file_range` is Linux-only and not in Python's `os`; O_DIRECT is refused by tmpfs and
some filesystems), so callers never need to know which one ran.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import threading

import numpy as np

ALIGN = 4096  # O_DIRECT wants buffers, lengths and offsets aligned to the logical block size
DIRECT_BLOCK = 8 << 20  # bounce-buffer size of one O_DIRECT write
READ_BLOCK = 16 << 20  # bounce-buffer size of one O_DIRECT read (read_into)
DIRECT_READ_MIN = 1 << 20  # smaller files are read through the page cache
# A thread's buffer for an object read whole (the reader's `stored`) and, when it reads into a
# caller's unaligned buffer instead, the O_DIRECT bounce of that read: a thread reads one object
# at a time, so it need not hold both (a cold load held a 53 MiB read buffer and a 10 MiB
# bounce per thread).
READ_BUFFER = "read"
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages, do not wait

_local = threading.local()


def _libc_fn(name: str, argtypes: list, restype=ctypes.c_int):
    """A libc function with its signature set, or None where this platform lacks it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = argtypes, restype
    return fn


_SFR_ARGS = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_sfr = _libc_fn("sync_file_range", _SFR_ARGS) if os.uname().sysname == "Linux" else None
# mmap, mincore and munmap: the page-cache residency of a file (`cached`)
_mmap = _libc_fn(
    "mmap",
    [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_int64],
    ctypes.c_void_p,
)
_mincore = _libc_fn("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p])
_munmap = _libc_fn("munmap", [ctypes.c_void_p, ctypes.c_size_t])
_MAP_FAILED = ctypes.c_void_p(-1).value


def aligned_empty(n: int) -> np.ndarray:
    """An uninitialised uint8 array of n bytes whose data starts on an ALIGN boundary."""
    base = np.empty(n + ALIGN, dtype=np.uint8)
    skip = (-base.ctypes.data) % ALIGN
    return base[skip : skip + n]


def scratch(name: str, n: int) -> np.ndarray:
    """A per-thread reusable aligned buffer of at least n bytes (its first n returned).

    Fresh arrays per part cost a page fault per 4 KiB on every save and load; a buffer reused
    by the thread that owns it costs them once. Valid until this thread asks for `name` again."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    buf = bufs.get(name)
    if buf is None or len(buf) < n:
        buf = bufs[name] = aligned_empty(max(n, 1))
    return buf[:n]


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing a file's dirty pages now, without waiting: its later
    fdatasync then finds most of the data on disk already (early writeback)."""
    if _sfr is not None:
        _sfr(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # best effort: fdatasync still guarantees it


def _synced(path: str, sync) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        sync(fd)
    finally:
        os.close(fd)


def datasync(path: str) -> None:
    """fdatasync one file by path (its data and size; its directory entry: sync_dirs)."""
    _synced(path, os.fdatasync)


def dirs_of(paths: list[str]) -> list[str]:
    """The folders holding these files and their parents (a new fan-out folder is a new entry
    of its parent too), each once: what must be fsynced for the files' names to be durable."""
    dirs: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path)
        dirs |= {parent, os.path.dirname(parent)}
    return sorted(dirs)


def fsync_dir(d: str) -> None:
    """fsync one folder (its entries: the names of files created in it)."""
    _synced(d, os.fsync)


def sync_dirs(paths: list[str]) -> None:
    """fsync the folders holding these files and their parents, each once."""
    for d in dirs_of(paths):
        fsync_dir(d)


def sync_files(paths: list[str]) -> None:
    """Make these files and their directory entries durable (only them, not the whole host:
    os.sync() would also wait for every other process's dirty data)."""
    for path in paths:
        datasync(path)
    sync_dirs(paths)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


def write_direct(path: str, data, sync: bool = True) -> bool:
    """Write `data` (one buffer, or a list of buffers written one after another) to a new
    `path` with O_DIRECT, bypassing the page cache, then fdatasync (`sync=False`: the caller
    fdatasyncs it later, e.g. from a pool that overlaps many; O_DIRECT puts the data on the
    device, the fdatasync makes its allocation and size durable). False when the platform or
    filesystem refuses O_DIRECT or the data is under one block (nothing is left behind then;
    the caller writes the file the ordinary way)."""
    flag = getattr(os, "O_DIRECT", 0)
    chunks = [
        np.frombuffer(c, dtype=np.uint8) for c in (data if isinstance(data, list) else [data])
    ]
    if not flag or sum(len(c) for c in chunks) < ALIGN:
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    try:
        _direct_body(fd, chunks, flag)
        if sync:
            os.fdatasync(fd)
    except OSError as exc:
        os.close(fd)
        fd = -1
        os.unlink(path)
        if exc.errno == errno.EINVAL:
            return False
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    return True


def _direct_body(fd: int, chunks: list[np.ndarray], flag: int) -> None:
    """Aligned blocks (straight from an aligned single buffer, else through an aligned bounce
    buffer that the chunks are packed into); the unaligned tail with O_DIRECT off."""
    n = sum(len(c) for c in chunks)
    body = n - n % ALIGN
    if len(chunks) == 1 and chunks[0].ctypes.data % ALIGN == 0:
        src = chunks[0]
        for off in range(0, body, DIRECT_BLOCK):
            _write_all(fd, memoryview(src[off : min(off + DIRECT_BLOCK, body)]))
        tail = src[body:]
    else:
        tail = _bounced(fd, chunks, body)
    if len(tail):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~flag)
        _write_all(fd, memoryview(tail))


def _bounced(fd: int, chunks: list[np.ndarray], body: int) -> np.ndarray:
    """Write the first `body` bytes of the chunks through the bounce buffer, in full blocks;
    returns the bytes left over (under one alignment unit)."""
    bounce = scratch("direct", min(DIRECT_BLOCK, body)) if body else None
    fill, written, rest = 0, 0, []
    for c in chunks:
        pos = 0
        while pos < len(c):
            if written + fill >= body:
                rest.append(c[pos:])
                break
            k = min(len(c) - pos, len(bounce) - fill, body - written - fill)
            np.copyto(bounce[fill : fill + k], c[pos : pos + k])
            fill, pos = fill + k, pos + k
            if fill == len(bounce) or written + fill == body:
                _write_all(fd, memoryview(bounce[:fill]))
                written, fill = written + fill, 0
    return np.concatenate(rest) if rest else np.empty(0, dtype=np.uint8)


def read_into(f, expect: int, get_buf, block: int = READ_BLOCK) -> tuple[int, np.ndarray | None]:
    """Read an open local file `f` of `expect` bytes into `get_buf(expect)`, with no
    intermediate copy of the whole.

    Returns (the file's size, the filled buffer); when the size differs from `expect` nothing
    is read or allocated and the buffer is None (a manifest that declares a huge object never
    makes the reader allocate it), and likewise when the file shrank while being read.

    A file of DIRECT_READ_MIN bytes or more that is not in the page cache (the saves write
    with O_DIRECT, so a checkpoint's objects usually are not) is read with O_DIRECT: large
    requests straight to the device, nothing copied into the cache or evicted from it. A cold
    GiB of 64 MiB objects read here in 0.54-0.64 s, against 1.0-1.5 s through the page cache,
    whose read-ahead keeps fewer requests in flight. An unaligned destination (a tensor:
    torch aligns to 64 bytes) is filled through bounce blocks of `block` bytes in the thread's
    READ_BUFFER (16 MiB blocks, with 4 reads in flight, were as fast as reading straight into
    aligned memory; 8 MiB blocks 1.0 s). A cached file, or one the filesystem will not read
    directly, is read the ordinary way. Reads are positional: `f`'s own position and buffer
    are not used."""
    fd = f.fileno()
    size = os.fstat(fd).st_size
    if size != expect:
        return size, None
    buf = get_buf(expect)
    got = None
    if expect >= DIRECT_READ_MIN and not cached(fd) and _direct(fd, True):
        try:
            got = _read_direct(fd, buf, block)
        finally:
            _direct(fd, False)  # the descriptor is the caller's: left as it came
    if got is None:  # not direct, or refused: from the start, through the page cache
        got = _read_full(fd, memoryview(buf), 0)
    return (got, buf) if got == expect else (got, None)


def cached(fd: int) -> bool:
    """Whether the file's first page is in the page cache, asked with mincore() on a mapping
    that is never touched. (A read with RWF_NOWAIT would answer too, but on a miss it starts
    the read-ahead it declines to wait for: the file went through the cache after all.) False
    where the platform cannot tell."""
    if None in (_mmap, _mincore, _munmap):
        return False
    addr = _mmap(None, ALIGN, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        return False
    try:
        vec = ctypes.create_string_buffer(1)
        return _mincore(addr, ALIGN, vec) == 0 and bool(vec.raw[0] & 1)
    finally:
        _munmap(addr, ALIGN)


def is_direct(fd: int) -> bool:
    """Whether reads and writes of this descriptor bypass the page cache (O_DIRECT)."""
    flag = getattr(os, "O_DIRECT", 0)
    return bool(flag) and bool(fcntl.fcntl(fd, fcntl.F_GETFL) & flag)


def _direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for an open descriptor; False where it is refused."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (fl | flag) if on else (fl & ~flag))
    except OSError:
        return False
    return True


def _pread(fd: int, view: memoryview, offset: int) -> int:
    return os.preadv(fd, [view], offset)


def _read_full(fd: int, view: memoryview, offset: int) -> int:
    """Read into all of `view` from `offset` on; the bytes read (fewer at the end of file)."""
    got = 0
    while got < len(view):
        k = _pread(fd, view[got:], offset + got)
        if not k:
            break
        got += k
    return got


def _read_direct(fd: int, buf: np.ndarray, block: int) -> int | None:
    """Read the whole file into `buf` with O_DIRECT on: straight into it when it is aligned
    (its unaligned tail through the bounce buffer), else one bounce block at a time. The bytes
    read, or None when the kernel refused (EINVAL: alignment or filesystem)."""
    n = len(buf)
    straight = buf.ctypes.data % ALIGN == 0
    try:
        pos = n - n % ALIGN if straight else 0
        if straight and pos:
            got = _read_full(fd, memoryview(buf[:pos]), 0)
            if got < pos:
                return got
        bounce = _bounce(buf, min(block, _round_up(n - pos)))
        while pos < n:
            want = min(len(bounce), _round_up(n - pos))
            got = _read_full(fd, memoryview(bounce[:want]), pos)
            k = min(got, n - pos)
            buf[pos : pos + k] = bounce[:k]
            pos += k
            if got < want:
                break  # the end of the file: its last block, or it shrank (then pos < n)
        return pos
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise


def _bounce(buf: np.ndarray, n: int) -> np.ndarray:
    """The bounce of a direct read into `buf`: the thread's READ_BUFFER, unless `buf` lies in
    it (the tail of an object read into it), which a bounce carved from it would overwrite."""
    shared = scratch(READ_BUFFER, n)
    if not np.may_share_memory(shared, buf):
        return shared
    return scratch("direct-read", n)


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
