"""`python -m ckptflow.steps.rdzv ARGS -- TORCHRUN_ARGS`: a rank pod's rendezvous, then torchrun.

Design (issue 34). torchrun's c10d rendezvous needs one TCP store every rank can reach at an
address the ranks learn when they start. It used to be a separate daemon pod whose IP Argo
baked into the ranks' arguments (`{{tasks.rdzv.ip}}`): a daemon has no retry, and a retried
one would come back at an IP the ranks never learn, so losing that pod lost the run. Now the
rank pod of index 0 hosts the store itself and publishes where it is in the run's storage,
which every rank already reaches (it holds the checkpoints):

    <run_root>/rendezvous/gen-000007.json   {"generation", "host", "port", "nonce", "at"}

Each start of rank 0 (the first, and each Argo retry: a new pod, a new IP) is a new
generation: it opens its store, writes the generation and a fresh nonce into it, then
publishes the file. The other ranks read the newest file and use it only when its store
answers with that nonce: a dead host (its pod gone, its IP silent) or an address that now
serves someone else is stale and is retried, until a newer generation is live or
`--join-timeout-s` passes (one line, RDZV_TIMEOUT_EXIT). Then this process runs torchrun with
`--rdzv-endpoint=HOST:PORT` and returns its exit code; rank 0's store lives exactly as long as
its torchrun (a failed rank 0 takes the store with it, so every rank fails and comes back).

Why not a Service in front of a retried daemon? It needs cluster DNS and a Service per run
(the local runner has neither) and still leaves the store a pod apart from the ranks; and
torchrun's agents cache the store address for a whole generation anyway. Object storage is
the one thing every rank, on a cluster and locally, already shares. No separate pod exists.

Whole-gang restart: a rank that loses its peers fails within the process-group timeout
(steps/lib/distributed.py), its pod fails and Argo retries it; a rank whose store is gone
fails at its next rendezvous call. Every retried rank finds the newest live generation and
resumes from the newest valid checkpoint (the training step does that on its own).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

from ckptflow import env
from ckptflow.contract import RdzvArgs, parse
from ckptflow.core import jsonfile
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.rdzv")

FOLDER = "rendezvous"
NONCE_KEY = "ckptflow/rdzv-nonce"
RDZV_TIMEOUT_EXIT = 6  # no live generation within --join-timeout-s (Argo retries the pod)
HOST_LOST_EXIT = 7  # the generation's store stopped answering (rank 0's pod lost)
WATCH_PERIOD_S = 5.0  # how often a rank probes its generation's store
MAX_RECORD = 1024  # bytes of one generation file
PROBE_S = 5.0  # how long one probe of a published store may take (a silent host: all of it)
POLL_S = 1.0  # pause between reads of the rendezvous folder


@dataclass(frozen=True)
class Generation:
    """Where one start of rank 0 serves the store."""

    number: int
    host: str
    port: int
    nonce: str

    @property
    def name(self) -> str:
        return f"{FOLDER}/gen-{self.number:06d}.json"


def _number(name: str) -> int | None:
    if name.startswith("gen-") and name.endswith(".json") and name[4:-5].isdigit():
        return int(name[4:-5])
    return None


def newest(storage: Storage) -> Generation | None:
    """The newest valid generation file (a damaged one is skipped with a warning)."""
    numbers = sorted(n for n in map(_number, storage.listdir(FOLDER)) if n is not None)
    for number in reversed(numbers[-16:]):  # bounded: a few damaged files, then give up
        rel = f"{FOLDER}/gen-{number:06d}.json"
        try:
            doc = jsonfile.read(storage, rel, max_bytes=MAX_RECORD)
            gen = Generation(
                int(doc["generation"]), str(doc["host"]), int(doc["port"]), str(doc["nonce"])
            )
            if gen.number != number or not 0 < gen.port < 65536 or len(gen.host) > 255:
                raise ValueError("fields disagree with the name or are out of range")
            return gen
        except FileNotFoundError:
            continue
        except (jsonfile.BadJsonFile, ValueError, KeyError, TypeError) as exc:
            log.warning("%s damaged, skipped: %s", storage.url(rel), exc)
    return None


def host_store(storage: Storage, host: str, port: int):
    """Open the store (rank 0), then publish it as the next generation; (store, generation)."""
    from torch.distributed import TCPStore

    before = newest(storage)
    gen = Generation((before.number if before else 0) + 1, host, port, uuid.uuid4().hex)
    try:
        store = TCPStore(
            host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
    except (RuntimeError, OSError) as exc:  # usually a port taken by another run's store
        raise SystemExit(f"ckptflow.steps.rdzv: cannot listen on port {port}: {exc}") from exc
    store.set(NONCE_KEY, gen.nonce)  # before publishing: a reader that finds it, finds this
    doc = {"generation": gen.number, "host": host, "port": port, "nonce": gen.nonce}
    storage.write(gen.name, json.dumps({**doc, "at": time.time()}).encode())
    log.info("generation %d: hosting the rendezvous store at %s:%d", gen.number, host, port)
    return store, gen


def live(gen: Generation) -> bool:
    """Whether `gen`'s store answers with its nonce (not a dead host, not someone else's)."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore(gen.host, gen.port, is_master=False, timeout=timedelta(seconds=PROBE_S))
        return store.get(NONCE_KEY).decode() == gen.nonce
    except (RuntimeError, OSError, UnicodeDecodeError):  # torch raises DistError subclasses
        return False


def find_store(storage: Storage, timeout_s: float, clock=time.monotonic) -> Generation:
    """The newest live generation, polling until one is or `timeout_s` passes (SystemExit)."""
    deadline, said = clock() + timeout_s, None
    while True:
        gen = newest(storage)
        if gen is not None and live(gen):
            log.info(
                "generation %d: joining the rendezvous at %s:%d", gen.number, gen.host, gen.port
            )
            return gen
        if gen is not None and gen != said:
            log.info("generation %d at %s:%d is not live yet or stale: waiting", gen.number, gen.host, gen.port)  # fmt: skip
            said = gen
        if clock() >= deadline:
            where = f"newest: generation {gen.number} at {gen.host}:{gen.port}" if gen else "none"
            log.error(
                "no live rendezvous under %s within %.0f s (%s): rank 0 never published "
                "one, or its pod is gone; exiting %d for a retry",
                storage.url(FOLDER), timeout_s, where, RDZV_TIMEOUT_EXIT,
            )  # fmt: skip
            raise SystemExit(RDZV_TIMEOUT_EXIT)
        time.sleep(POLL_S)


def run_torchrun(
    argv: list[str],
    gen: Generation,
    *,
    watch_host_s: float = 0.0,
    probe=live,
    period_s: float = WATCH_PERIOD_S,
) -> int:
    """torchrun with `gen` as its rendezvous, SIGTERM/SIGINT passed on; its exit code.

    With `watch_host_s` (a rank that does not host the store), the store is probed every
    `period_s`: one that has not answered for `watch_host_s` is a lost rendezvous host, and
    torchrun is killed (HOST_LOST_EXIT, one line). Without this, a survivor's agent waits on
    its connection to a silently lost host until TCP gives up (about 15 min of retransmissions):
    its workers' collectives time out, but the agent's next store call never returns."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--rdzv-endpoint={gen.host}:{gen.port}"]
    # in this process group, so a runner or kubelet that stops the pod stops torchrun too
    child = subprocess.Popen([*cmd, *argv])
    for sig in (signal.SIGTERM, signal.SIGINT):  # a preemption: the ranks save and leave
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    return supervise(child, gen, watch_host_s=watch_host_s, probe=probe, period_s=period_s)


def supervise(child, gen: Generation, *, watch_host_s: float, probe, period_s: float) -> int:
    """Wait for torchrun (`child`), watching `gen`'s store as `run_torchrun` says."""
    if not watch_host_s:
        return child.wait()
    answered = time.monotonic()
    while True:
        try:
            return child.wait(timeout=period_s)
        except subprocess.TimeoutExpired:
            pass
        if probe(gen):
            answered = time.monotonic()
        elif time.monotonic() - answered >= watch_host_s:
            log.error(
                "generation %d: the rendezvous host %s:%d has not answered for %.0f s (its pod "
                "lost): stopping torchrun, exiting %d so every rank comes back",
                gen.number, gen.host, gen.port, time.monotonic() - answered, HOST_LOST_EXIT,
            )  # fmt: skip
            kill_tree(child.pid)
            child.wait()
            return HOST_LOST_EXIT


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process under it (the agent and its workers), deepest first."""
    for p in [*_descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _descendants(pid: int, depth: int = 0) -> list[int]:
    """The processes under `pid` (Linux /proc children lists), deepest first; bounded."""
    found: list[int] = []
    if depth > 8:
        return found
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                for child in map(int, fh.read().split()):
                    found += [*_descendants(child, depth + 1), child]
    return found


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(this step's arguments, torchrun's), split at the first `--`."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def main(argv: list[str] | None = None) -> int:
    """Host (rank 0) or find the live rendezvous, then run torchrun there."""
    ours, torchrun = split(sys.argv[1:] if argv is None else list(argv))
    cfg = parse(RdzvArgs, ours, description=__doc__.split("\n")[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [rdzv] %(message)s")
    if not torchrun:
        print("ckptflow.steps.rdzv: give torchrun's arguments after --", file=sys.stderr)
        return 2
    storage = env.open_storage(cfg.run_root)
    if cfg.node_rank == 0:
        host = cfg.host or env.pod_ip() or socket.gethostbyname(socket.gethostname())
        store, gen = host_store(storage, host, cfg.port)
        try:
            return run_torchrun(torchrun, gen)
        finally:
            del store  # the store ends with this generation's torchrun
    gen = find_store(storage, cfg.join_timeout_s)
    return run_torchrun(torchrun, gen, watch_host_s=cfg.host_lost_s)


if __name__ == "__main__":
    sys.exit(main())
