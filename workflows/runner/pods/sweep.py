"""Finding and removing what Nodes left behind.

`leftovers(start)` lists everything on this machine whose name starts with `start` (a prefix or
one Node's tag): cgroups, links, named network namespaces, mounts, state directories.
`sweep(prefix)` removes those of Nodes whose owner process is dead (a runner that was
SIGKILLed or crashed before its cleanup ran): first their processes (found through their
cgroups, so also those that left their session), which takes their network namespaces and veths
with them, then the cgroups, the bridge, mounts and state directories.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil

from ckptflow.workflows.runner.pods import cgroups, net, podinit
from ckptflow.workflows.runner.pods.naming import PREFIX, owner_alive, owner_pid

__all__ = ["STATE_ROOT", "leftovers", "sweep"]

STATE_ROOT = "/var/tmp/ckptflow-pods"  # on disk: emptyDir volumes live here
NETNS_DIR = "/run/netns"
_ESCAPE = re.compile(rb"\\([0-7]{3})")
OWNER_FILE = "owner"  # in a Node's state directory: "PID START_TIME"


def mount_points() -> list[str]:
    """Every mount point of this mount namespace, as the kernel lists them."""
    out = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            # mountinfo escapes space, tab, newline and backslash as \ooo
            raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), line.split(b" ")[4])
            out.append(os.fsdecode(raw))
    return out


def _tagged(path: str, matches) -> bool:
    return any(matches(part) for part in path.split("/") if part)


def leftovers(start: str = PREFIX, state_root: str = STATE_ROOT) -> dict[str, list[str]]:
    """What exists of Nodes whose names start with `start`, by kind (empty lists: nothing)."""

    def mine(name: str) -> bool:
        return name.startswith(start)

    netns = sorted(n for n in _listdir(NETNS_DIR) if mine(n))
    return {
        "cgroups": cgroups.tagged_dirs(mine),
        "links": sorted(n for n in net.links() if mine(n)),
        "netns": netns,
        "mounts": [m for m in mount_points() if _tagged(m, mine)],
        "state": sorted(os.path.join(state_root, n) for n in _listdir(state_root) if mine(n)),
    }


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class _Owners:
    """Which tags belong to a dead owner (cached: one answer per tag during a sweep)."""

    def __init__(self, prefix: str, state_root: str) -> None:
        self.prefix, self.state_root = prefix, state_root
        self._dead: dict[str, bool] = {}

    def dead(self, name: str) -> bool:
        found = owner_pid(name, self.prefix)
        if found is None:
            return False
        tag, pid = found
        if tag not in self._dead:
            self._dead[tag] = not owner_alive(pid, self._recorded_start(tag))
        return self._dead[tag]

    def _recorded_start(self, tag: str) -> str | None:
        # The owner file tells a reused pid from the original owner.
        path = os.path.join(self.state_root, tag, OWNER_FILE)
        with contextlib.suppress(OSError, IndexError), open(path) as f:
            return f.read().split()[1]
        return None


def _subtree(directory: str) -> list[str]:
    return [dirpath for dirpath, _, _ in os.walk(directory)]


def sweep(prefix: str = PREFIX, state_root: str = STATE_ROOT) -> list[str]:
    """Remove what Nodes of `prefix` with a dead owner left; return what was removed."""
    owners = _Owners(prefix, state_root)
    removed: list[str] = []
    dirs = cgroups.tagged_dirs(owners.dead)
    cgroups.kill_all([d for top in dirs for d in _subtree(top)])
    for d in dirs:
        with contextlib.suppress(OSError):
            cgroups.remove_dir(d)
            removed.append(d)
    for name in net.links():
        if owners.dead(name):
            net.delete_link(name)
            removed.append(f"link {name}")
    for name in _listdir(NETNS_DIR):
        if owners.dead(name):
            with contextlib.suppress(net.NetError):
                net.ip("netns", "del", name)
                removed.append(f"netns {name}")
    for point in sorted(mount_points(), key=len, reverse=True):  # deepest first
        if _tagged(point, owners.dead):
            with contextlib.suppress(OSError):
                podinit.detach(point)
                removed.append(f"mount {point}")
    mounted = mount_points()
    for name in _listdir(state_root):
        path = os.path.join(state_root, name)
        # Never delete through a mount that would not go: it may be someone's data.
        if owners.dead(name) and not any(m.startswith(path + "/") or m == path for m in mounted):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
