"""What runs first inside a new pod (after `unshare --net --uts --mount`), then execs the task.

Run as `python -I -S podinit.py STATUS_FD GO_FD`: it imports only the standard library (no
site-packages, no ckptflow), so it starts fast and cannot be confused by the task's environment.

Protocol with the node (`pod.py`): write `R` on STATUS_FD once the namespaces exist (the node
then joins us to the cgroups and wires the network), read the JSON spec from GO_FD until EOF,
build the pod's filesystem, set the hostname, and exec the task. STATUS_FD is close-on-exec, so
the node reads EOF when the exec succeeded, or one line saying why the pod could not start.

The filesystem: the pod's `/` (pivot_root) is a writable overlay of the host's root filesystem
whose upper layer lies in the pod's own storage, with the host's other mounts (/proc, /dev,
/sys, ...) bound at their place except `/tmp` (`overlay_root`); a write to `/` stays in the pod.
Without an upper directory it is a fresh tmpfs with each top-level entry of the host's `/`
bind-mounted into it (recursively), except `/tmp`. Then the pod's own mounts go on top, in the pod's view (so symlinks
resolve as the task will see them): its `/tmp`, `/dev/shm`, volumes, `/etc/hosts`,
`/etc/resolv.conf`. A mount point that does not exist is created without touching the host:
directly in the root tmpfs, or, below a host directory, by "shadowing" that directory with a
tmpfs that re-binds each of its entries, so the new directory exists only in the pod.

The module also provides the mount syscalls the node uses on the host side.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_OLD = "/.ckp-oldroot"  # where the host's / sits during the build, detached before the exec
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """mount(2); OSError naming the target on failure."""
    ret = _libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    _check(ret, f"mount {source} on {target}")


def bind(source: str, target: str, *, recursive: bool = True, read_only: bool = False) -> None:
    """Bind-mount `source` on `target` (with its submounts when `recursive`)."""
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def tmpfs(target: str, size: int | None = None, mode: str = "1777") -> None:
    """Mount a fresh tmpfs on `target` (`size` bytes at most, else the kernel's default)."""
    opts = f"mode={mode}" + (f",size={size}" if size else "")
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts)


def detach(target: str) -> None:
    """Lazily unmount `target` and everything below it (umount2 MNT_DETACH)."""
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    """pivot_root(2); falls back to util-linux's pivot_root where the syscall number is unknown."""
    number = _PIVOT_ROOT.get(platform.machine())
    if number is None:
        subprocess.run(["pivot_root", new_root, put_old], check=True)
        return
    _check(_libc.syscall(number, new_root.encode(), put_old.encode()), "pivot_root")


def _copy_entry(src: str, dst: str) -> None:
    """Make `dst` show what `src` is: a symlink copied, anything else bind-mounted."""
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        os.mkdir(dst)
        bind(src, dst)
    else:  # regular files, sockets, devices: bind onto an empty file
        open(dst, "wb").close()
        bind(src, dst)


def _unescape(field: str) -> str:
    """A path of /proc/self/mountinfo (space, tab, newline and backslash are octal escapes)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def top_mounts() -> list[str]:
    """The mount points directly on the root filesystem (/proc, /dev, /sys, a volume at
    /work...): those that no other mount point except `/` contains, from /proc/self/mountinfo."""
    with open("/proc/self/mountinfo") as f:
        points = {_unescape(line.split()[4]) for line in f if len(line.split()) > 4}
    points.discard("/")
    return sorted(
        p for p in points if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in points)
    )


def overlay_root(root: str, upper: str, skip: set[str]) -> None:
    """The pod's writable root, as a container runtime's writable layer: an overlay of the
    host's root filesystem (read-only below) with its upper directory in the pod's own storage
    (`upper`, a tmpfs the node discards with the pod), so whatever the task writes in `/`
    (`/result.txt`, `/etc/x`) stays in the pod and the host's files never change. The host's
    other mounts (/proc, /dev, /sys, ...) are bound at their place, except those under `skip`."""
    os.makedirs(upper + "/upper", exist_ok=True)
    os.makedirs(upper + "/work", exist_ok=True)
    options = f"lowerdir=/,upperdir={upper}/upper,workdir={upper}/work"
    mounts = top_mounts()  # before the overlay: it is a mount below / too
    mount("overlay", root, "overlay", MS_NOSUID, options)
    for point in mounts:
        if point.strip("/").split("/")[0] in skip or point.startswith(upper):
            continue
        target = root + point
        if not os.path.lexists(target):
            continue  # a mount point the overlay cannot show (gone meanwhile)
        with contextlib.suppress(FileNotFoundError):
            bind(point, target)


def build_root(root: str, skip: set[str], upper: str | None = None) -> None:
    """The pod's root at `root`: with `upper`, a writable overlay of the host's root
    (overlay_root); otherwise a tmpfs with binds of the host's top-level entries (except
    `skip`)."""
    if upper:
        try:
            overlay_root(root, upper, skip)
        except OSError as exc:  # no overlayfs here: the tmpfs root below (writes to host binds)
            print(f"pod root: no overlay ({exc}); a tmpfs root instead", file=sys.stderr)
        else:
            os.mkdir(root + _OLD)
            return
    tmpfs(root, mode="0755")
    for name in sorted(os.listdir("/")):
        path = os.path.join("/", name)
        if name in skip:
            if os.path.isdir(path) and not os.path.islink(path):
                os.mkdir(os.path.join(root, name), 0o755)
            continue
        with contextlib.suppress(FileNotFoundError):  # an entry that went away meanwhile
            _copy_entry(path, os.path.join(root, name))
    os.mkdir(root + _OLD)


class Tree:
    """The pod's view while it is built, and where a missing mount point may be created.

    A directory may get a new entry when the entry lands in the pod's own storage: the root
    tmpfs itself or a shadow tmpfs (exactly there: their entries are host binds), or anywhere
    below a directory we created or a volume (which is what a container runtime does, too).
    Anywhere else the host's directory is shadowed first, so the host never changes.
    """

    def __init__(self) -> None:
        self.exact = {"/"}
        self.below: set[str] = set()
        self._shadows = 0

    def ours(self, directory: str) -> bool:
        """Whether creating an entry in `directory` leaves the host untouched."""
        if directory in self.exact:
            return True
        return any(directory == d or directory.startswith(d + "/") for d in self.below)

    def shadow(self, directory: str) -> None:
        """Replace `directory` (a host one) by a tmpfs that binds each of its entries back."""
        self._shadows += 1
        keep = f"/.ckp-shadow{self._shadows}"
        os.mkdir(keep)
        bind(directory, keep)
        mode = oct(os.stat(directory).st_mode & 0o7777)[2:]
        tmpfs(directory, mode=mode)
        for name in os.listdir(keep):
            with contextlib.suppress(FileNotFoundError):  # gone meanwhile (e.g. in /proc)
                _copy_entry(os.path.join(keep, name), os.path.join(directory, name))
        detach(keep)
        os.rmdir(keep)
        self.exact.add(directory)

    def ensure(self, path: str, is_dir: bool) -> str:
        """The real path of `path` in the pod, created (dir or empty file) if it is missing."""
        real = os.path.realpath(path)
        if os.path.lexists(real):
            return real
        parent = os.path.dirname(real)
        if not os.path.isdir(parent):
            parent = self.ensure(parent, True)
        if not self.ours(parent):
            self.shadow(parent)
        target = os.path.join(parent, os.path.basename(real))
        if is_dir:
            os.mkdir(target, 0o755)
            self.below.add(target)
        else:
            open(target, "wb").close()
        return target


def apply_mounts(mounts: list[dict], hide: list[str]) -> None:
    """Put the pod's own mounts on (pod view, host sources under the old root), then hide
    the node's state directories so no pod sees another pod's files."""
    tree = Tree()
    for m in mounts:
        source = _OLD + m["source"]
        is_dir = os.path.isdir(source)
        target = tree.ensure(m["target"], is_dir)
        if os.path.isdir(target) != is_dir or os.path.islink(target):
            raise OSError(
                f"mountPath {m['target']}: cannot mount a {'directory' if is_dir else 'file'} there"
            )
        bind(source, target, read_only=bool(m.get("read_only")))
        if is_dir:
            tree.below.add(target)  # nested mount points are made inside the volume
    for path in hide:
        if os.path.isdir(path):
            tmpfs(path, mode="0755")
            mount("none", path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter(spec: dict) -> None:
    """Build the pod's filesystem and identity from the node's spec, then chdir."""
    root = spec["root"]
    build_root(root, skip={"tmp"}, upper=spec.get("upper"))
    os.chdir(root)
    pivot_root(".", "." + _OLD)
    os.chdir("/")
    apply_mounts(spec["mounts"], spec.get("hide") or [])
    detach(_OLD)
    os.rmdir(_OLD)
    if spec.get("read_only_root"):  # securityContext.readOnlyRootFilesystem: / only, not volumes
        mount("none", "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    socket.sethostname(spec["hostname"])
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        raise OSError(f"workingDir {spec['cwd']}: {exc.strerror}") from None


def _code(rc: int) -> int:
    """An exit status as a node reports it (128 + signal for a killed process)."""
    return 128 - rc if rc < 0 else rc


def _end(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM the sidecars, SIGKILL those still running after `grace` seconds
    (workflow/executor/executor.go KillSidecars)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_containers(spec: dict) -> int:
    """A pod with init containers or sidecars (workflow/controller/workflowpod.go): the init
    containers one after another to completion (a failing one ends the pod with its code),
    then the sidecars and the main container; when the main container ends the sidecars are
    stopped and the pod's exit code is the main container's. Their stdout goes to stderr (the
    pod's log), so only the main container's stdout is its result."""
    # a SIGTERM for the pod reaches every process of its group; this one keeps waiting for
    # the main container so the pod reports what the main container did with it (a handler,
    # not SIG_IGN: an ignored signal would stay ignored in the containers it starts)
    signal.signal(signal.SIGTERM, lambda *_: None)
    for c in spec.get("init") or []:
        try:
            rc = subprocess.call(c["argv"], env=c["env"], cwd=c["cwd"], stdout=2)
        except OSError as exc:
            print(f"init container {c['name']}: {exc}", file=sys.stderr)
            return 128
        if rc != 0:
            print(f"init container {c['name']} failed (exit code {_code(rc)})", file=sys.stderr)
            return _code(rc)
    sidecars: list[subprocess.Popen] = []
    try:
        for c in spec.get("sidecars") or []:
            try:
                sidecars.append(subprocess.Popen(c["argv"], env=c["env"], cwd=c["cwd"], stdout=2))
            except OSError as exc:
                print(f"sidecar {c['name']}: {exc}", file=sys.stderr)
                return 128
        try:
            main = subprocess.Popen(spec["argv"], env=spec["env"])
        except OSError as exc:
            print(f"{spec['argv'][0]}: {exc}", file=sys.stderr)
            return 127
        return _code(main.wait())
    finally:
        _end(sidecars, float(spec.get("grace") or 0))


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def main(argv: list[str]) -> int:
    """Run the protocol described in the module docstring; on success this never returns."""
    status, go = int(argv[0]), int(argv[1])
    os.set_inheritable(status, False)  # closes on exec: EOF tells the node the exec worked
    os.write(status, b"R")
    raw = _read_all(go)
    os.close(go)
    if not raw:  # the node gave up (or died) before sending the spec
        return 1
    try:
        spec = json.loads(raw)
        enter(spec)
        if not (spec.get("init") or spec.get("sidecars")):
            os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except Exception as exc:  # whatever stops the start is the one line the node reports
        os.write(status, f"{type(exc).__name__}: {exc}".encode()[:4000])
        return 127
    os.close(status)  # the pod started (as an exec would say); its containers run now
    return run_containers(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
