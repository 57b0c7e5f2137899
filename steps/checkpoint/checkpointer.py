"""`Checkpointer`: the engine's public API (save, load, latest, verify, async and delta saves).

Saving is collective: every rank calls `save`; DCP plans which rank writes which chunk, our
writer stores the parts, and the coordinator commits. `block=False` stalls only for the host
snapshot; the write runs in a background thread over a dedicated gloo group, so it never
interleaves with the training's own collectives. Loading (`load`, in load_path.py, a base
class of Checkpointer) verifies every byte it reads and, when no step is named, falls back from
a corrupt newest checkpoint to the newest valid one.
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ckptflow.steps.checkpoint import (
    commit,
    compat,
    events,
    groups,
    parent_root,
    rank_load,
    rank_save,
)
from ckptflow.steps.checkpoint.dcp_errors import unwrap
from ckptflow.steps.checkpoint.load_path import LoadPath
from ckptflow.steps.checkpoint.results import LoadInfo, SaveHandle, SaveStats
from ckptflow.steps.checkpoint.save_job import SaveJob
from ckptflow.steps.checkpoint.single import quiet_single_process
from ckptflow.steps.checkpoint.staging import Stager, default_copy_threads
from ckptflow.steps.checkpoint.writer import CkptStorageWriter, SafeSavePlanner
from torch.distributed.checkpoint.api import CheckpointException

from ckptflow import env
from ckptflow.core import adaptive, locator, rootreader
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError, CorruptCheckpoint, NotCommitted
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.checkpoint")


class Checkpointer(LoadPath):
    """Sharded, compressed, checksummed checkpoints under one root URI (local, memory://, s3://)."""

    def __init__(
        self,
        root: str,
        *,
        full_every: int = 1,
        compression_level: int = 1,
        compress: bool | str = "auto",
        threads: int | None = None,
        part_mib: int = 64,
        pack_kib: int = 1024,
        process_group=None,
        storage: Storage | None = None,
        cooperative: bool | str = True,
        on_commit=None,
        manifests: str = "auto",
    ):
        compat.check_checkpointer_options(
            full_every=full_every,
            compression_level=compression_level,
            part_mib=part_mib,
            pack_kib=pack_kib,
            threads=threads,
            cooperative=cooperative,
            compress=compress,
            manifests=manifests,
        )
        # a root given as a URI is reached the way this deployment is wired (ckptflow.env)
        self.storage = storage or env.open_storage(root)
        self.root = self.storage.uri
        self.full_every = full_every
        self.level, self.compress = compression_level, compress
        self.threads = threads or min(8, max(2, adaptive.process_cores()))  # a pod's quota
        self.part_bytes = part_mib << 20
        self.pack_bytes = pack_kib << 10  # parts under this share objects (packing.py); 0: none
        self.cooperative = cooperative
        # on_commit(job, state_dict, group): run on the save thread once each save committed,
        # over the save's group (the local tier's fan-out and PIECE: tier/local_save.py); a
        # failure of it is the save's
        self.on_commit = on_commit
        # "step": one manifest per save (format 4); "rank": one per rank and a step index
        # (format 5, rank_save.py); "auto": per rank from rank_save.AUTO_FROM_RANKS ranks
        self.manifests = manifests
        self._distributed = dist.is_available() and dist.is_initialized()
        quiet_single_process()  # DCP's "torch.distributed is disabled" on every call
        self.rank = dist.get_rank() if self._distributed else 0
        self.world_size = dist.get_world_size() if self._distributed else 1
        # A gloo group of our own for background saves (they never share a communicator with
        # training), made at the first (collective) call that needs one: _group.
        self._pg = process_group
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-save")
        self._stager = Stager(copy_threads=min(self.threads, default_copy_threads()))
        self._inflight: SaveHandle | None = None
        self._prior: dict = {}
        self._parent: dict | None = None  # set by inherit(): the step this root borrows from
        self._inherited: dict = {}  # parts of that step (raw hash -> record), never forgotten
        self._cuts: dict = {}  # fqn -> byte offsets where its parts end (aligned with them)
        self._base: dict = {}
        self._base_step: int | None = None
        self._saves_since_full = 0
        self._never_delta: set = set()  # parts whose first delta did not pay (see SaveJob)
        self.last_save: SaveStats | None = None
        self.last_load: LoadInfo | None = None
        self.last_init = None  # what load(source=...) filled in (interop.InitReport)

    # -- catalog -------------------------------------------------------------------------------
    def committed_steps(self) -> list[int]:
        return rootreader.committed_steps(self.storage)

    def manifest(self, step: int) -> dict:
        return rootreader.read_manifest(locator.locate(self.storage, step), step)

    def latest(self) -> int | None:
        """The newest committed step whose commit marker and manifest are sound."""
        for step in reversed(self.committed_steps()):
            try:
                located = locator.locate(self.storage, step)
                # format 5 at this world size: the index and this rank's own manifest (the
                # merge would read every rank's on every rank)
                if rank_load.read_view(located, step, self.rank, self.world_size, set()) is None:
                    self.manifest(step)
                return step
            except NotCommitted:
                continue  # deleted since the listing (GC): not damage
            except CorruptCheckpoint as exc:
                log.warning("skipping step %d: %s", step, exc)
        return None

    def verify(self, step: int) -> dict:
        """Check every byte of a step against its manifest; raise CorruptCheckpoint naming files."""
        m = self.manifest(step)
        bad = locator.verify_objects(locator.locate(self.storage, step), m)
        if bad:
            raise CorruptCheckpoint(
                f"step {step} under {self.root} is corrupt: " + "; ".join(bad), bad
            )
        return {
            "step": step,
            "objects": len(m["objects"]),
            "stored_bytes": m["stats"]["stored_bytes"],
        }

    def needs(self, step: int) -> set[str]:
        """Object keys step `step` depends on (its own, deduplicated ones, its delta base's)."""
        return set(self.manifest(step)["objects"])

    # -- save ----------------------------------------------------------------------------------
    def save(
        self, step: int, state_dict: dict, *, block: bool = True, metadata: dict | None = None
    ) -> SaveHandle:
        """Save `state_dict` as `step` (collective). With block=False only the snapshot stalls."""
        compat.check_step(step)
        compat.check_savable(state_dict)
        t0 = time.perf_counter()
        wait_s = self._wait_inflight()
        job = self._new_job(step, metadata or {})
        stats = SaveStats(step=step, kind=job.kind, wait_s=wait_s)
        if block:
            self._run(job, state_dict, stats, self._group(background=False))
            stats.stall_s = time.perf_counter() - t0
            self.last_save = stats
            events.saved(self.storage, self.rank, stats)
            return SaveHandle(stats)
        staged = self._stager.stage(state_dict)
        stats.stall_s = time.perf_counter() - t0
        future = self._executor.submit(self._run, job, staged, stats, self._group(True))
        self._inflight = SaveHandle(stats, future)
        self.last_save = stats
        return self._inflight

    def prepare(self, state_dict: dict) -> None:
        """Get ready for async saves of `state_dict` (or one of its shapes): its host snapshot
        buffers are allocated and pre-faulted (pinned with CUDA) in the background now, so the
        first `save(block=False)` stalls only for its copy, as later ones do. Call it once the
        state is complete (after the first optimizer step); saves reuse the buffers."""
        self._stager.prepare(state_dict)

    def run_as_save(self, stats: SaveStats, work) -> Future:
        """Run `work(group)` as this root's next background save (a collective call): after
        the save in flight (waited for into `stats.wait_s`, its failure raised, as `save`
        does), on the save thread over the background group, so no later save, load or close
        starts before it ends. Its failure is the caller's to answer (the returned future;
        tier/drain.py falls back to a normal save): later calls wait for it, never raise it."""
        stats.wait_s = self._wait_inflight()
        future = self._executor.submit(work, self._group(background=True))
        ended: Future = Future()
        future.add_done_callback(lambda _: ended.set_result(None))
        self._inflight = SaveHandle(stats, ended)
        return future

    def adopt(self, parts: list[dict]) -> None:
        """Deduplicate later saves against `parts` (validated part records of a step committed
        in this root without this Checkpointer writing it: a drain, tier/drain.py), as after a
        save of its own (`_after_commit`); each is referenced only once found sound."""
        own = {p["raw_hash"]: p for p in parts if p["base"] is None}
        self._prior = {**self._inherited, **own}

    def _wait_inflight(self) -> float:
        if self._inflight is None:
            return 0.0
        t0 = time.perf_counter()
        handle, self._inflight = self._inflight, None
        handle.wait()  # a background failure surfaces here, never lost
        waited = time.perf_counter() - t0
        if waited > 0.01:
            log.info("waited %.2fs for the previous checkpoint to finish", waited)
        return waited

    def _new_job(self, step: int, metadata: dict) -> SaveJob:
        try:  # what the manifest reader would refuse must fail here, before any write
            mf.check_metadata(metadata)
        except mf.ManifestError as exc:
            raise CheckpointError(f"save of step {step}: {exc}; pass plain JSON values") from None
        delta = self._base and self._saves_since_full % self.full_every != 0
        job = SaveJob(
            storage=self.storage,
            step=step,
            save_id=uuid.uuid4().hex[:16],
            root_id="",
            world_size=self.world_size,
            level=self.level,
            compress=self.compress,
            policy=(
                adaptive.policy_for(self.storage.location(), self.level)
                if self.compress == "auto"
                else None
            ),
            threads=self.threads,
            part_bytes=self.part_bytes,
            pack_bytes=self.pack_bytes,
            metadata=dict(metadata),
            prior=self._prior,
            fallbacks=self._parent_stores(),
            cuts=self._cuts,
            never_delta=self._never_delta,
        )
        if delta:
            job.kind, job.base, job.base_step = "delta", self._base, self._base_step
        elif self.full_every > 1:
            job.capture_base = {}
        return job

    def _parent_stores(self) -> list[Storage]:
        """Where readers of this root find borrowed objects: from the root marker, or from the
        parent named by inherit() before the first save writes that marker."""
        stores = locator.parent_stores(self.storage)
        if stores or self._parent is None:
            return stores
        st = Storage(self._parent["uri"])
        return [locator.locate(st, self._parent["step"]), *locator.parent_stores(st)]

    def _group(self, background: bool):
        """The group our collectives run over: the one given, else the default group when
        this call blocks and that group is gloo (no group to make: a fresh Checkpointer's
        load made one, O(ranks) connections per rank), else our own gloo group, made now
        (every rank makes its calls in the same order; `background`: an async save's)."""
        if not self._distributed:
            return None
        if self._pg is None:
            if not background and dist.get_backend() == "gloo":
                return dist.group.WORLD
            self._pg = groups.own_gloo_group()  # with the training's timeout
        return self._pg

    def _run(self, job: SaveJob, state_dict: dict, stats: SaveStats, group) -> None:
        t0 = time.perf_counter()
        job.rank = self.rank
        job.rank_manifests = rank_save.choose(
            self.manifests, self.world_size, state_dict, self._rank_unsupported(job)
        )
        if self.rank == 0 and not job.rank_manifests:
            job.root_id = rootreader.ensure_root(self.storage, self._parent)
        job.together = True  # each rank checks its own objects, then rank 0 commits
        writer = CkptStorageWriter(job)
        try:
            if job.rank_manifests:  # every rank its own manifest, rank 0 the index
                rank_save.save(job, writer, state_dict, group, self._parent)
            else:
                dcp.save(
                    state_dict,
                    storage_writer=writer,
                    planner=SafeSavePlanner(),
                    process_group=group,
                    no_dist=not self._distributed,
                )
                commit.commit_together(job, self.rank, self.world_size, group)
        except BaseException as exc:
            writer.close(failed=True)  # a failed save is no longer live: GC may collect it
            events.saved(self.storage, self.rank, stats, exc)
            if isinstance(exc, CheckpointException):
                raise unwrap(exc) from exc
            raise
        writer.close(failed=False)
        self._after_commit(job)
        if self.on_commit is not None:
            self.on_commit(job, state_dict, group)
        stats.background_s = time.perf_counter() - t0
        stats.bytes_raw, stats.bytes_written, stats.bytes_reused = (
            job.raw_bytes,
            job.written_bytes,
            job.reused_bytes,
        )
        if stats.stall_s:  # an async save (a sync one is recorded once its stall is known)
            events.saved(self.storage, self.rank, stats)

    def _rank_unsupported(self, job: SaveJob) -> str | None:
        """What this save needs that per-rank manifests do not do yet (None: nothing). A delta
        needs nothing more: each rank's deltas are against its own last full save, held in its
        own memory, and its rank manifest names the base objects they reference."""
        if self.on_commit is not None:
            return "on_commit (the local tier's fan-out)"
        if self._parent is not None:
            return "a parent root (inherit)"
        return None

    def _after_commit(self, job: SaveJob) -> None:
        """Only committed data may be deduplicated against or used as a delta base."""
        own = {r["raw_hash"]: r for r in job.part_records if r["base"] is None}
        self._prior = {**self._inherited, **own}
        if job.capture_base is not None:
            self._base, self._base_step, self._saves_since_full = job.capture_base, job.step, 1
        else:
            self._saves_since_full += 1

    # -- parent roots (fine-tuning) ------------------------------------------------------------
    def inherit(self, parent: Checkpointer, step: int) -> None:
        """Deduplicate this root's saves against committed step `step` of another root.

        For a fine-tune saved under its own root: tensors still equal to the base's (frozen
        ones) are referenced, not stored again, even when the base was saved by another world
        size (parts are cut where the base's parts end). This root's marker names the parent,
        so every reader of this root finds those objects there. Call it on every rank before
        the first save (and again after a resume); the parent step must outlive this root
        (pin it).
        """
        m = parent.manifest(step)
        ref = {"uri": parent.storage.url(), "step": step, "root_id": m["root_id"]}
        parent_root.check_derivable(self.storage, self.root, ref)
        self._parent = ref
        # Delta parts are kept too: reusing one references its base object as well.
        self._inherited = {p["raw_hash"]: p for it in m["items"].values() for p in it["parts"]}
        self._prior = {**self._inherited, **self._prior}
        self._cuts = parent_root.part_bounds(m)

    def close(self) -> None:
        """Wait for the save in flight (raising its failure) and release the worker."""
        try:
            self._wait_inflight()
        finally:
            self._executor.shutdown(wait=True)
            self._stager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
