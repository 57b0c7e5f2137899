"""What a container needs from this machine, checked before anything runs: its command
installed here (the image that had it is not), and Linux (a Windows container cannot run).

Both give (field, why) pairs, which spec.py reports as refusals naming the template.
"""

from __future__ import annotations

import os
import shutil

from ckptflow.workflows.runner.substitution import to_str

__all__ = ["command_problems", "os_problems"]


def command_problems(c: dict, env: dict[str, str]) -> list[tuple[str, str]]:
    """A bare command name must be on PATH (the template's own `env` PATH, else the runner's):
    `cowsay` of docker/whalesay is not here, and a run that fails on it half-way helps no one.
    A path is not checked (an earlier step may make it); `python` is the runner's own."""
    command = c.get("command")
    if not isinstance(command, list) or not command:
        return []
    cmd = to_str(command[0])
    if "/" in cmd or "{{" in cmd or cmd in ("python", "python3"):
        return []
    path = next(
        (to_str(e.get("value")) for e in c.get("env") or []
         if isinstance(e, dict) and e.get("name") == "PATH" and "value" in e),
        env.get("PATH", os.defpath),
    )  # fmt: skip
    if shutil.which(cmd, path=path) is not None:
        return []
    image = f" (the image {c['image']!r} has it)" if c.get("image") else ""
    return [(f"command {cmd!r}", f"not installed on this machine{image}; put it on PATH")]


def os_problems(obj: dict) -> list[tuple[str, str]]:
    """A pod pinned to another OS (`nodeSelector: kubernetes.io/os: windows`)."""
    selector = obj.get("nodeSelector")
    wanted = selector.get("kubernetes.io/os") if isinstance(selector, dict) else None
    if wanted in (None, "linux"):
        return []
    return [
        (
            f"nodeSelector.kubernetes.io/os={wanted}",
            "the container needs another operating system; only Linux ones run locally",
        )
    ]
