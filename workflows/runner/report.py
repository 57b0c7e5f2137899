"""What a person sees: a live view while the workflow runs, a final table, the status file.

On a terminal the live view redraws one block (running tasks with their elapsed time, the
counts per phase, and for a task whose log reports training progress its `step N/M`, loss and
last committed checkpoint); elsewhere (CI logs, files) it prints one plain line per start and
finish, and for a training task a plain progress line when that changed, every
`progress_every` seconds at most (a long pretraining was silent for minutes off a terminal).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from typing import TextIO

from ckptflow.workflows.runner.nodes import DONE, Node, NodeStore

__all__ = ["Reporter", "final_table", "write_status"]

_WORK_TYPES = ("Pod", "Retry", "Skipped")
# What a training step's log says (ckptflow.core.progress, ckptflow.steps.lib.loop)
_STEP = re.compile(rb"\bstep (\d+)/(\d+)")
_CKPT = re.compile(rb"\bcheckpoint (\d+) committed")
_LOSS = re.compile(rb"\btrain_loss ([0-9.eE+-]+|nan|inf)")
_TAIL = 16 * 1024  # bytes of a log read per redraw


def task_progress(log_file: str | None) -> str:
    """`step 300/1000, loss 1.23, checkpoint 200` from the end of a task's log ("" when it says
    none)."""
    if not log_file:
        return ""
    try:
        with open(log_file, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log_file) - _TAIL))
            tail = fh.read()
    except OSError:
        return ""
    steps, ckpts = _STEP.findall(tail), _CKPT.findall(tail)
    parts = [f"step {steps[-1][0].decode()}/{steps[-1][1].decode()}"] if steps else []
    losses = _LOSS.findall(tail)
    if losses:
        parts.append(f"loss {losses[-1].decode()}")
    if ckpts:
        parts.append(f"checkpoint {ckpts[-1].decode()}")
    return ", ".join(parts)


def _short(node: Node, workflow: str) -> str:
    name = node.name
    return name[len(workflow) + 1 :] if name.startswith(workflow + ".") else name


def _is_row(node: Node, store: NodeStore) -> bool:
    """A row of the table: a Retry node, a Pod not under a Retry node, or a skipped task."""
    if node.type not in _WORK_TYPES:
        return False
    if node.type == "Pod":
        return not any(node.id in p.children for p in store.nodes.values() if p.type == "Retry")
    return True


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def final_table(store: NodeStore) -> str:
    """The end-of-run table: task, phase, duration, retries, exit code."""
    rows = [("TASK", "PHASE", "DURATION", "RETRIES", "EXIT")]
    nodes = sorted(
        (n for n in store.nodes.values() if _is_row(n, store)),
        key=lambda n: (n.started_at or float("inf"), n.name),
    )
    for n in nodes:
        retries = str(max(n.attempts - 1, 0)) if n.type == "Retry" else "-"
        exit_code = "-" if n.exit_code is None else str(n.exit_code)
        rows.append(
            (_short(n, store.workflow_name), n.phase, _fmt_s(n.duration), retries, exit_code)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def write_status(path: str, document: dict) -> None:
    """Write the status JSON atomically (readers never see half a file)."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump(document, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:  # named by the status file's path, not its temporary one's
        raise type(exc)(exc.errno, exc.strerror, path) from exc


class Reporter:
    """Receives node changes; prints them and keeps the status file fresh."""

    def __init__(
        self,
        stream: TextIO | None = None,
        status=None,
        interval: float = 0.5,
        progress_every: float = 15.0,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.status = status  # callable writing the status file
        self.interval = interval
        self.store: NodeStore | None = None
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = 0
        self._t0 = time.monotonic()
        self.progress_every = progress_every
        self._progress_at = 0.0
        self._progress_seen: dict[str, str] = {}  # node id -> the progress last printed

    def on_change(self, node: Node, event: str) -> None:
        self._dirty.set()
        if self.tty or node.type not in ("Pod", "Skipped"):
            return
        if event == "running":
            line = f"started   {node.name}"
        elif event == "daemoned":
            line = f"daemoned  {node.name}"
        elif event == "finished" or (event == "created" and node.phase in DONE):
            extra = f" ({node.message})" if node.message else ""
            line = f"{node.phase.lower():<9} {node.name} {_fmt_s(node.duration)}{extra}"
        else:
            return
        stamp = time.strftime("%H:%M:%S")
        print(f"{stamp} {line}", file=self.stream, flush=True)

    def say(self, line: str) -> None:
        """One timestamped line of the run's own news (e.g. a node lost: nodelifecycle.py)."""
        print(f"{time.strftime('%H:%M:%S')} {line}", file=self.stream, flush=True)

    def start(self, store: NodeStore) -> None:
        self.store = store
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()
            if not self.tty:
                self.print_progress()

    def print_progress(self) -> None:
        """Off a terminal: one plain line per running task whose training progress changed
        since its last line, at most once per `progress_every` seconds."""
        now = time.monotonic()
        if self.store is None or now - self._progress_at < self.progress_every:
            return
        self._progress_at = now
        with self.store.cond:
            running = [n for n in self.store.nodes.values() if n.phase == "Running"]
        for n in running:
            done = task_progress(getattr(n, "log_file", None))
            # a rank that logs no steps of its own (only commits) would repeat rank 0's news
            if done.startswith("step") and self._progress_seen.get(n.id) != done:
                self._progress_seen[n.id] = done
                stamp = time.strftime("%H:%M:%S")
                print(f"{stamp} progress  {n.name} {done}", file=self.stream, flush=True)

    def flush(self) -> None:
        if not self._dirty.is_set() and not self.tty:
            return
        self._dirty.clear()
        if self.status is not None:
            self.status()
        if self.tty and self.store is not None:
            self._draw()

    def _draw(self) -> None:
        with self.store.cond:
            pods = [n for n in self.store.nodes.values() if n.type == "Pod"]
        running = [n for n in pods if n.phase == "Running"]
        counts: dict[str, int] = {}
        for n in pods:
            counts[n.phase] = counts.get(n.phase, 0) + 1
        lines = [
            f"{self.store.workflow_name}  {_fmt_s(time.monotonic() - self._t0)}  "
            + "  ".join(f"{k}:{v}" for k, v in sorted(counts.items()))
        ]
        for n in running[:15]:
            tag = " (daemon)" if n.daemoned else ""
            done = task_progress(getattr(n, "log_file", None))
            lines.append(f"  > {n.name}{tag}  {_fmt_s(n.duration)}" + (f"  {done}" if done else ""))
        if len(running) > 15:
            lines.append(f"  ... and {len(running) - 15} more")
        out = "".join("\x1b[1A\x1b[2K" for _ in range(self._drawn))
        self.stream.write(out + "\n".join(lines) + "\n")
        self.stream.flush()
        self._drawn = len(lines)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._dirty.set()
        self.flush()
