"""`LocalTier`: each rank's saves to its node-local volume (issue 35, the "Save" of the design).

A local save is a normal ckptflow save (the Checkpointer: same staging, DCP global plan, format,
checksums and commit rules) of the gang's state in which each rank writes into its own root
<local_dir>/<run_key>/rank-<rank> (ckptflow/core/tier.py). It is async like a durable save:
`save` stalls for the host snapshot (and for the local save before it, as a durable save waits
for its own), the write, commit, fan-out (fanout.py: every rank's root gets what it needs to
load the step alone, then its PIECE) and retention (local_retention.py) run on the local
Checkpointer's save thread over its own gloo group. Saves are always full (no deltas: a piece
must load without another step) and compressed as the durable root's resolved choice
(`compress_like`), so a drain uploads the local objects as a durable save would have stored them.

The local tier never stops training: a failed local save costs one warning and the next local
step tries again; the durable tier is never skipped. Retention keeps room for the next save
beside the steps it keeps (a save writes a whole step before the older one may go), so a volume
too small for one step besides the one being written (known after the first save: the step's
bytes against local_size_mib, or the free space) costs one warning line and turns the local
tier off on every rank alike (an agreed decision: a rank
saving alone would wait forever in the save's collectives); its steps are deleted (an emptyDir
over its size limit gets the pod evicted).
"""

from __future__ import annotations

import logging
import os
import uuid

import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.results import SaveHandle
from ckptflow.steps.checkpoint.save_job import SaveJob
from ckptflow.steps.checkpoint.tier import fanout, local_retention

from ckptflow.core import adaptive, layout, tier
from ckptflow.core.storage import Storage
from ckptflow.core.storage_errors import StorageError

log = logging.getLogger("ckptflow.tier")

NO_LIMIT = 1 << 30  # "fits" of a rank that has no say in the size check (its fan-out failed)


def compress_like(durable: Checkpointer) -> bool | str:
    """The compression a durable save of `durable` resolves to: its forced choice, or for
    `auto` on a store billed by the byte (auto:always) True, else `auto` (chosen per part)."""
    if durable.compress != "auto":
        return bool(durable.compress)
    policy = adaptive.policy_for(durable.storage.location(), durable.level)
    return True if adaptive.mode("auto", policy) == "auto:always" else "auto"


def _disk_full(exc: BaseException) -> bool:
    """Whether a failure (or one behind it) is a full disk or an exceeded quota."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, StorageError) and exc.kind in ("disk-full", "quota"):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class LocalTier:
    """This rank's local tier (one per rank; `save` is a collective call, like a save)."""

    def __init__(
        self,
        local_dir: str,
        run_key: str,
        rank: int,
        world: int,
        keep: int = 2,
        size_mib: int = 0,
        compress: bool | str = "auto",
        *,
        level: int = 1,
        copies: int = 1,
        process_group=None,
    ):
        self.local_dir, self.run_key = local_dir, run_key
        self.root = tier.piece_root(local_dir, run_key, rank)
        self.rank, self.world = rank, world
        self.keep, self.size_mib, self.copies = max(keep, 1), size_mib, max(copies, 1)
        self.enabled = True
        self.on_piece = None  # on_piece(step, piece) after each PIECE (peers.Replicator)
        self.on_keep = None  # on_keep(n): the steps retention keeps now (peers' replica keep)
        self.last_piece: tier.Piece | None = None
        self.failures = 0
        self.last_failure = ""  # the last failed local save's error, one line
        self._busy: dict[int, SaveHandle] = {}  # steps a drain still reads: retention keeps
        self._handle: SaveHandle | None = None
        self.ck = Checkpointer(
            self.root,
            compress=compress,
            compression_level=level,
            cooperative=False,
            process_group=process_group,
            storage=Storage(self.root),
            on_commit=self._committed,
            manifests="step",  # the fan-out, PIECE and drain name one manifest (tier.py)
        )
        self.storage = self.ck.storage
        # The save group now (a collective: every rank builds its LocalTier at the same
        # point), not in the first local save's stall: made there it cost 2.1 s under load.
        group = self.ck._group(background=True)
        # A rank that cannot write its root would fail the gang's first save from inside its
        # collectives (rank 0 before them: the others would wait out the timeout): the ranks
        # agree now, and the tier is off on all of them when one cannot write.
        problem = self._unwritable()
        if self._agree_min(0 if problem else 1, group) < 1:
            self._turn_off(problem or "another rank cannot write its local root (its log says why)")

    def _unwritable(self) -> str | None:
        """Why this rank cannot write its root (None: it can): not a local folder, a link
        planted in the run's folder (tier.link_problem: writes and deletes would land in
        another run's folder or a user's files), else a probe file written, removed."""
        if self.storage.protocol not in ("file", "local"):
            return f"local_dir {self.local_dir} is not a local folder (a node-local volume's path)"
        if problem := tier.link_problem(self.local_dir, self.run_key, self.rank):
            return problem
        # named as an atomic write's temporary file: one a crash leaves is ignored by readers
        probe = f".probe.{uuid.uuid4().hex[:12]}.tmp"
        try:
            os.makedirs(self.storage.path(), exist_ok=True)
            self.storage.write(probe, b"probe")
            self.storage.delete([probe])
        except (OSError, StorageError) as exc:
            return f"{self.root} is not writable ({exc})"
        return None

    # -- saves ---------------------------------------------------------------------------------
    def save(self, step: int, state_dict: dict, metadata: dict | None = None) -> SaveHandle | None:
        """Start the async local save of `step` (collective); its handle (done once this
        rank's PIECE is written), or None when the tier is off. Never raises a save's failure:
        the previous local save's, if any, is a warning (and a full disk turns the tier off)."""
        self.settle()
        if not self.enabled:
            return None
        try:
            self._handle = self.ck.save(step, state_dict, block=False, metadata=metadata)
        except Exception as exc:  # refused before anything was written (every rank alike)
            self._failed(step, exc)
            return None
        return self._handle

    def prepare(self, state_dict: dict) -> None:
        """Allocate the snapshot buffers in the background (Checkpointer.prepare)."""
        if self.enabled:
            self.ck.prepare(state_dict)

    def settle(self) -> None:
        """Wait for the local save in flight; its failure is a warning (every rank sees the
        same: a save fails on every rank alike), a full disk turns the tier off."""
        handle, self._handle = self._handle, None
        try:
            self.ck._wait_inflight()  # the save in flight, and its failure (raised once)
        except Exception as exc:
            self._failed(handle.stats.step if handle else -1, exc)

    def forget_after(self, step: int) -> list[int]:
        """Delete this rank's local steps above `step`, the step training resumes from: they
        are of a timeline the gang abandoned (a later save of the same number would find it
        committed). The steps deleted (none when the tier is off: its root is cleared, or
        not the tier's to touch)."""
        if not self.enabled:
            return []
        gone = [s for s in layout_steps(self.storage) if s > step]
        for s in gone:
            local_retention.remove_step(self.storage, s, self.rank)
        if gone:
            local_retention.sweep(self.storage, self.rank)
            log.info("local tier: steps %s above the resumed step %d deleted", gone, step)
        return gone

    def busy(self, step: int, handle: SaveHandle) -> None:
        """Keep `step` from retention while `handle` (a drain reading it) runs."""
        self._busy = {s: h for s, h in self._busy.items() if not h.done()}
        self._busy[step] = handle

    def close(self) -> None:
        """Wait for the save in flight (a failure: a warning) and release the Checkpointer."""
        self.settle()
        self.ck.close()

    def _failed(self, step: int, exc: BaseException) -> None:
        self.failures += 1
        self.last_failure = f"{type(exc).__name__}: {exc}"
        if _disk_full(exc) and self.enabled:
            self._turn_off(f"the local volume is full ({exc})")
            return
        log.warning(
            "local save of step %d failed (%s: %s); training and the durable tier go on, "
            "the next local step tries again",
            step,
            type(exc).__name__,
            exc,
        )

    # -- on the save thread, once a local save committed ---------------------------------------
    def _committed(self, job: SaveJob, state_dict: dict, group) -> None:
        """Fan-out and PIECE, the agreed size check, retention, then replication."""
        piece, error = None, None
        try:
            piece = fanout.fan_out(self.storage, job, state_dict, self.rank, self.world, group)
        except fanout.FanOutError as exc:
            error = exc
        fits, size = NO_LIMIT, 0
        if piece is not None:
            size = fanout.step_bytes(piece, self.storage)
            budget = local_retention.budget(self.local_dir, self.root, self.size_mib)
            fits = local_retention.fit(budget, size, self.copies)
        fits = self._agree_min(fits, group)
        if fits < 2:  # a step kept and the next one being written: else an emptyDir overflows
            self._turn_off(
                f"the local volume cannot hold one step while it writes the next ({size} "
                f"bytes a step x {self.copies} cop{'y' if self.copies == 1 else 'ies'}, "
                f"local_size_mib={self.size_mib or 'free space'})"
            )
            return
        if error is not None:
            raise error
        self.last_piece = piece
        busy = {s for s, h in self._busy.items() if not h.done()}
        keep = min(self.keep, fits - 1)
        local_retention.retain(self.storage, self.rank, keep, busy)
        if self.on_keep is not None:  # the replicas this volume holds for peers: as many
            self.on_keep(keep)
        if self.on_piece is not None:
            self.on_piece(piece.step, piece)

    def _agree_min(self, value: int, group) -> int:
        if group is None or self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        return int(t.item())

    def _turn_off(self, why: str) -> None:
        """One warning; the tier is off from now on; this rank's steps are deleted."""
        self.enabled = False
        log.warning(
            "local tier off: %s; training and the durable checkpoints go on (give the rank "
            "pods a larger or writable local volume: platform.local_volume_size, "
            "pretrain.local_dir; or set pretrain.local_every=0)",
            why,
        )
        if self._not_ours():
            return  # not a local folder of the tier's own: nothing there is the tier's to delete
        try:
            for step in sorted(layout_steps(self.storage)):
                local_retention.remove_step(self.storage, step, self.rank)
            local_retention.remove_unnamed_objects(self.storage, set())
        except (OSError, StorageError) as exc:  # a root it cannot list: nothing of it to keep
            log.info("local tier: %s not cleared (%s)", self.root, exc)

    def _not_ours(self) -> bool:
        """Whether the root is not the tier's own local folder (never cleared then)."""
        if self.storage.protocol not in ("file", "local"):
            return True
        return tier.link_problem(self.local_dir, self.run_key, self.rank) is not None


def layout_steps(storage: Storage) -> list[int]:
    """Every step folder of a rank root."""
    return sorted(n for n in (layout.parse_step_dir(x) for x in storage.listdir()) if n is not None)
