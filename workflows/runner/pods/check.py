"""Whether pods work on this machine, and if not, the one thing that is missing."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from ckptflow.workflows.runner.pods import cgroups

__all__ = ["available", "tool"]

TOOLS = {"ip": "iproute2", "unshare": "util-linux", "nsenter": "util-linux"}
# Where the tools live even when PATH lacks the sbin directories (non-login shells, CI steps).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def tool(name: str) -> str:
    """The absolute path of a tool (PATH first, then the system directories), else `name`."""
    search = (os.environ.get("PATH") or "") + os.pathsep + SYSTEM_PATH
    return shutil.which(name, path=search) or name


# Run in a throw-away network namespace: nothing it creates outlives the probe.
PROBE = ["link add ckpprobe0 type bridge", "link add ckpprobe1 type veth peer name ckpprobe2"]


@functools.cache
def available() -> str | None:
    """None when pods can be built here, else one line naming the missing privilege or tool
    (the runner then stays in process mode, its default)."""
    if not hasattr(os, "geteuid") or not os.path.isdir("/proc/self/ns"):
        return "pods need Linux namespaces (this is not Linux)"
    if os.geteuid() != 0:
        return "pods need root (network, UTS and mount namespaces, cgroups); run as root"
    for name, package in TOOLS.items():
        if tool(name) == name:
            return f"pods need `{name}` on PATH (install {package})"
    why = cgroups.problem()
    if why:
        return f"pods need cgroup v1: {why}"
    try:
        done = subprocess.run(
            [tool("unshare"), "--net", "--uts", "--mount", "--", tool("ip"), "-batch", "-"],
            input="\n".join(PROBE) + "\n",
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pods need `unshare --net --uts --mount`, which failed: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"creating a namespace with a bridge and a veth was refused: {last}"
    return None
