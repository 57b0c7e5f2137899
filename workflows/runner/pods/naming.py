"""Names of everything a Node creates, and who owns them.

Every bridge, veth, cgroup, mount and state directory of a Node carries its tag:
`PREFIX + owner pid (5 base-36 digits) + 2 random base-36 digits`, e.g. `ckp00a1b7x`
(10 characters), so a veth `TAG + "v" + pod index (up to 4 base-36 digits)` stays within the
kernel's 15-character interface names. The owner pid in the name lets `sweep` tell leftovers
of a crashed run (owner dead) from those of a live one, and the random part keeps several Nodes
of one process (and a reused pid) apart.
"""

from __future__ import annotations

import os
import re
import secrets
import threading

__all__ = ["PREFIX", "new_tag", "owner_pid", "owner_alive", "pod_suffix", "start_time"]

PREFIX = "ckp"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
PID_DIGITS = 5  # 36**5 > 4194304, the largest pid Linux hands out
MAX_POD_INDEX = 36**4 - 1  # TAG (10) + "v" + 4 digits = 15 characters
_used: set[str] = set()
_lock = threading.Lock()


def base36(number: int, width: int = 0) -> str:
    """`number` in base 36 (lower case), left-padded with zeros to `width`."""
    out = ""
    while number:
        number, digit = divmod(number, 36)
        out = _DIGITS[digit] + out
    return (out or "0").rjust(width, "0")


def new_tag(prefix: str = PREFIX) -> str:
    """A tag not used before by this process, naming this process as the owner."""
    with _lock:
        while True:
            rand = "".join(secrets.choice(_DIGITS) for _ in range(2))
            tag = f"{prefix}{base36(os.getpid(), PID_DIGITS)}{rand}"
            if tag not in _used:
                _used.add(tag)
                return tag


def tag_pattern(prefix: str = PREFIX) -> re.Pattern[str]:
    """Matches a name that starts with a tag of `prefix`; group 1 is the tag, 2 the pid."""
    return re.compile(rf"^({re.escape(prefix)}([0-9a-z]{{{PID_DIGITS}}})[0-9a-z]{{2}})")


def owner_pid(name: str, prefix: str = PREFIX) -> tuple[str, int] | None:
    """(tag, owner pid) of a name that carries a tag of `prefix`, else None."""
    match = tag_pattern(prefix).match(name)
    return (match.group(1), int(match.group(2), 36)) if match else None


def pod_suffix(index: int) -> str:
    """The per-pod part of a name (`v` + base-36 index) appended to the node's tag."""
    if not 0 <= index <= MAX_POD_INDEX:
        raise ValueError(f"pod index {index} is beyond {MAX_POD_INDEX}")
    return "v" + base36(index)


def start_time(pid: int) -> str | None:
    """The start time (in clock ticks since boot) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and ')': fields count from the last ')'.
    return stat.rsplit(")", 1)[-1].split()[19]


def owner_alive(pid: int, recorded_start: str | None = None) -> bool:
    """Whether the owner of a tag still runs (same pid and, if known, the same start time)."""
    now = start_time(pid)
    if now is None:
        return False
    return recorded_start is None or now == recorded_start
