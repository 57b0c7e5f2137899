"""Our DCP StorageWriter: every rank encodes and uploads its own parts, in parallel threads.

Each write item (a tensor chunk or a non-tensor value) is split into parts of at most
`part_bytes`; each part is deduplicated against the previous checkpoint (same raw hash), or
stored as a delta against the in-memory base, or encoded in full; the stored bytes go to a
content-addressed object. The coordinator then writes the manifest and, last, claims the
commit marker with an exclusive create: no rename anywhere.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
from ckptflow.steps.checkpoint import commit
from ckptflow.steps.checkpoint.durability import Durability
from ckptflow.steps.checkpoint.packing import Packer, group_of
from ckptflow.steps.checkpoint.safe_value import UnsafeValueError, encode_value
from ckptflow.steps.checkpoint.save_intent import Heartbeat, clear_stray_archived
from ckptflow.steps.checkpoint.save_job import (
    BasePart,
    SaveJob,
    local_cuts,
    part_ranges,
    raw_view,
)
from ckptflow.steps.checkpoint.save_manifest import build_manifest, write_rank_manifest
from ckptflow.steps.checkpoint.write_behind import WriteBehind
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from ckptflow.core import adaptive, codec, deltas, intent, jsonfile, layout
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError
from ckptflow.core.uris import OBJECT_STORES

log = logging.getLogger("ckptflow.checkpoint")


class SafeSavePlanner(DefaultSavePlanner):
    """DCP's default planner, but non-tensor values use the safe encoding, never torch.save."""

    def transform_object(self, write_item, object):
        if write_item.type == WriteItemType.BYTE_IO:
            try:
                return io.BytesIO(encode_value(object))
            except UnsafeValueError as exc:
                raise CheckpointError(f"cannot save {write_item.index.fqn!r}: {exc}") from exc
        return object

    def create_global_plan(self, all_plans):
        """DCP's global plan (every rank's items and their metadata: acyclic) built with the
        cyclic collector paused: its young collections freed nothing and aged every rank's
        entries toward the oldest generation, setting off full-heap collections (issue 36)."""
        with jsonfile.collector_paused():
            return super().create_global_plan(all_plans)


class CkptStorageWriter(StorageWriter):
    """Writes one step under a ckptflow root; see the module docstring."""

    def __init__(self, job: SaveJob):
        super().__init__()
        self.job = job
        self.is_coordinator = False
        self._lock = threading.Lock()
        self._heartbeat: Heartbeat | None = None
        self._behind: WriteBehind | None = None

    def reset(self, checkpoint_id=None) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True

    def storage_meta(self):
        return None

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        self.is_coordinator = is_coordinator
        # (per-rank manifests: DCP runs alone on each rank; rank_save.start calls start)
        if is_coordinator and not self.job.rank_manifests:
            self.start()

    def start(self) -> None:
        """The coordinator's start of a save: refuse a committed step, write the intent."""
        st, step = self.job.storage, self.job.step
        if st.exists(layout.commit_path(step)):
            raise CheckpointError(
                f"step {step} is already committed under {st.uri}; checkpoints are immutable: "
                "save under a new step number (or delete it with `ckptflow ckpt gc`)"
            )
        clear_stray_archived(st, step)
        # GC reads the intent to tell a live save: it must never be torn (atomic writes)
        rel, blob = intent.write_intent(st, step, self.job.save_id, self.job.world_size)
        self._heartbeat = Heartbeat(st, rel, blob)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    # -- data ----------------------------------------------------------------------------------
    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        job = self.job
        # Object stores are latency-bound: more uploads in flight than CPU threads. (Locally,
        # twice as many writer threads as cores: 0.96-0.98 of the wall time, +17% CPU; local
        # writes overlap the encoding instead, behind it.)
        workers = job.threads * (4 if job.storage.protocol in OBJECT_STORES else 1)
        # Local objects are written behind the encoding (write_behind.py); an object store's
        # uploads already overlap it, with more of them in flight than threads.
        local = job.storage.protocol == "file"
        self._behind = WriteBehind(workers) if local else None
        if job.policy is not None:
            job.policy.workers = workers  # what `auto` weighs: writers sharing the storage
            job.policy.overlapped = local
        self._syncs = Durability(job)
        self._packer = Packer(self._write_object)
        failed = True
        try:
            results = self._write_items(plan, planner, workers)
            if self._behind is not None:
                self._behind.finish()  # every write ended (each submitted its sync)
            # Every object durable before the coordinator writes the manifest: each was synced
            # as soon as it was written (overlapping the encoding of others); wait for the last.
            self._syncs.finish()
            failed = False
        finally:
            if self._behind is not None:
                self._behind.close(failed)  # before the syncs: a write may still submit one
                self._behind = None
            self._syncs.close()
            # The packer holds this writer (its store): left in place, the cycle would keep
            # every save's writer, and the delta base it captured, alive until a full GC.
            self._packer = None
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _write_items(self, plan: SavePlan, planner: SavePlanner, workers: int) -> list:
        job = self.job
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-write") as pool:
            pending = []
            for item in plan.items:
                data = planner.resolve_data(item)
                raw, width = raw_view(data)
                offset = None if item.type == WriteItemType.BYTE_IO else list(item.index.offset)
                key = mf.item_key(item.index.fqn, offset)
                step_ = max(job.part_bytes - job.part_bytes % max(width, 1), width)
                cuts = local_cuts(job.cuts.get(item.index.fqn), item, len(raw))
                futs = [
                    pool.submit(self._store_part, key, i, raw[o:e], o, width)
                    for i, (o, e) in enumerate(part_ranges(len(raw), step_, cuts))
                ]
                rec = {"fqn": item.index.fqn, "offset": offset}
                if item.tensor_data is not None:
                    rec["sizes"] = list(item.tensor_data.chunk.sizes)
                pending.append((item, rec, futs))
            for _, rec, futs in pending:
                rec["parts"] = [f.result() for f in futs]
        self._packer.finish()  # the last pack: every packed part's record is complete now
        results = []
        for item, rec, _ in pending:
            stored = sum(mf.part_bytes(p) for p in rec["parts"])
            results.append(WriteResult(index=item.index, size_in_bytes=stored, storage_data=rec))
        return results

    def _store_part(
        self, item_key: str, index: int, raw: np.ndarray, offset: int, width: int
    ) -> dict:
        job = self.job
        raw_hash = codec.digest(raw)
        base = job.base.get((item_key, index))
        with self._lock:
            job.raw_bytes += len(raw)
        reused = job.prior.get(raw_hash)
        if reused is None and base is not None and base.record["raw_hash"] == raw_hash:
            reused = base.record
        if (
            reused is not None
            and reused["raw_size"] == len(raw)
            and reused["width"] == width
            and self._sound(reused)
        ):
            rec = dict(reused, raw_offset=offset, reused=True)
            with self._lock:
                job.reused_bytes += len(raw)
        else:
            if (item_key, index) in job.never_delta:
                base = None  # its deltas do not pay: stored full, no delta work
            if base is not None and not self._sound(base.record):
                base = None  # a delta against a damaged base object would be damaged too
            # (the rewrite of a damaged object under its own name repairs the older steps)
            like = reused if reused is not None and reused.get("base") is None else None
            rec = self._encode_and_write(raw, raw_hash, offset, width, base, like, item_key)
            if base is not None and rec["base"] is None:
                with self._lock:
                    job.never_delta.add((item_key, index))
        if (
            job.capture_base is not None
            and rec.get("base") is None
            and (item_key, index) not in job.never_delta  # no delta will need it
        ):
            self._capture(item_key, index, raw, rec)
        with self._lock:
            job.part_records.append(rec)
        return rec

    def _sound(self, rec: dict) -> bool:
        """True when every object a part record references holds what its name says (checked
        once per save): a save never references damaged or missing bytes it did not write."""
        refs = [rec] if rec.get("base") is None else [rec, rec["base"]]
        job = self.job
        for ref in refs:
            key = ref["object"]
            with self._lock:
                known = job.sound.get(key)
            if known is None:
                known = job.trust.sound([job.storage, *job.fallbacks], key, ref["stored_size"])
                with self._lock:
                    job.sound.setdefault(key, known)
            if not known:
                return False
        return True

    def _decision(self, size: int, delta: bool, like: dict | None) -> adaptive.Decision:
        """Whether the next part is compressed: forced, or chosen by the root's estimates. A
        delta is always compressed where compression is allowed: unchanged bits are zero
        bytes, and only compressed do they cost nothing (the reason for incremental saves).
        Bytes equal to an object found damaged are encoded as they were (the rewrite repairs
        it); a part too small to measure goes the way the estimates favour."""
        job = self.job
        if job.compress != "auto" or job.policy is None:
            return adaptive.Decision(bool(job.compress))
        if like is not None:
            return adaptive.Decision(like["planes"] != [["raw", like["raw_size"]]])
        if delta:
            return adaptive.Decision(True)
        if size < adaptive.MIN_PART:
            return adaptive.Decision(job.policy.favoured())
        return job.policy.decide()

    def _encode_and_write(
        self, raw, raw_hash, offset, width, base: BasePart | None, like=None, item_key=""
    ) -> dict:
        job = self.job
        t0 = time.thread_time()
        decision = self._decision(len(raw), base is not None, like)
        packed = decision.compress
        kind = None
        if packed and base is not None and len(base.raw) == len(raw):
            kind = deltas.choose_delta(raw, base.raw, width, job.level)
        payload = deltas.delta(kind, raw, base.raw, width) if kind else raw
        behind = self._behind is not None and len(raw) >= job.pack_bytes
        buffer = self._behind.slot() if behind else codec.GATHER  # free once written
        t_code = time.thread_time()
        enc = codec.encode(payload, width, job.level, packed, buffer=buffer)
        coding = time.thread_time() - t_code
        rec = {
            "raw_offset": offset,
            "raw_size": len(raw),
            "raw_hash": raw_hash,
            "width": width,
            "planes": enc.planes,
            "base": None,
            "reused": False,
        }
        if kind:
            b = base.record
            keep = ("object", "stored_size", "raw_size", "width", "planes", "span")
            rec["base"] = {k: b[k] for k in keep if k in b}
            rec["delta"] = kind  # format version 3 (older readers knew only XOR)
        if len(raw) < job.pack_bytes:  # object, stored_size and span: when its pack is stored
            self._packer.add(group_of(item_key), enc, rec)
            return rec
        # Stored raw whole, its bytes are the raw bytes: their hash is already known.
        t_hash = time.thread_time()
        key = raw_hash if enc.chunks[0] is payload and not kind else enc.digest()
        coding += time.thread_time() - t_hash
        rec["object"], rec["stored_size"] = key, enc.nbytes
        # (a delta's cost says nothing of what a full part costs either way)
        measured = job.policy is not None and base is None and len(raw) >= adaptive.MIN_PART
        cpu = time.thread_time() - t0  # the write's own time, its CPU too, is the storage's
        if self._write_object(key, enc, behind) and measured:
            # Stored raw, the part would have cost the thread all but its coding.
            job.policy.observe(packed, len(raw), cpu, enc.nbytes, raw_cpu=cpu - coding)
            if decision.sample:  # after the raw CPU it is priced against
                sample = adaptive.sample_cost(raw, width, job.level)
                job.policy.observe_sample(len(raw), *sample)
        return rec

    def _write_object(self, key: str, enc: codec.Encoded, behind: bool = False) -> bool:
        """Store one object unless it is there already, sound; True when bytes were written
        (`behind`: by an I/O thread, while this thread goes on: write_behind.py)."""
        job = self.job
        st, rel = job.storage, layout.object_path(key)
        with self._lock:
            if key in job.written:
                return False  # this save wrote it already (two equal parts)
        # A local object already there is kept when its bytes are what its name says (a
        # damaged one is rewritten): rewriting a sound file in place would briefly truncate
        # data that a committed step references.
        if st.protocol == "file" and job.trust.sound([st], key, enc.nbytes):
            # Refresh its age: GC's grace period then protects it until this save commits.
            os.utime(st.path(rel))
            wrote = False
        else:
            if behind:
                self._behind.submit(partial(self._store, rel, enc))
            else:
                self._store(rel, enc)
            wrote = True
            with self._lock:
                job.written_bytes += enc.nbytes
        with self._lock:
            job.sound[key] = True
            job.written.add(key)
        return wrote

    def _store(self, rel: str, enc: codec.Encoded) -> None:
        """Write one object. Local ones go with O_DIRECT where the filesystem allows (no
        page-cache copy); the sync threads then make each durable (started now, so the save
        ends when its last object is durable while the writer threads go on writing). Under
        `auto`, the root's storage meter counts the object busy from the write's start until
        it is durable (the fdatasync included: adaptive.StorageMeter)."""
        st = self.job.storage
        local = st.protocol == "file"
        meter = self.job.policy.meter if self.job.policy is not None else None
        if meter is not None:
            meter.begin()
        try:
            st.write(rel, enc.chunks, durable=not local, direct=local)
        except BaseException:
            if meter is not None:
                meter.end(0)
            raise
        if local:
            self._syncs.submit(rel, None if meter is None else partial(meter.end, enc.nbytes))
        elif meter is not None:
            meter.end(enc.nbytes)  # durable when the write returned

    def _capture(self, item_key: str, index: int, raw: np.ndarray, rec: dict) -> None:
        """Keep a host copy of a full part as the base of later deltas (buffers are reused)."""
        cap = self.job.capture_base
        old = self.job.base.get((item_key, index))
        buf = old.raw if old is not None and len(old.raw) == len(raw) else np.empty_like(raw)
        np.copyto(buf, raw)
        with self._lock:
            cap[(item_key, index)] = BasePart(buf, rec)

    # -- commit --------------------------------------------------------------------------------
    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        job = self.job
        if job.rank_manifests:  # this rank's own manifest (rank_save.py commits)
            write_rank_manifest(job, metadata, [r for rank in results for r in rank])
            return
        # Every rank's entries, built, serialized and parsed back: acyclic, so collections
        # during it only aged them into the oldest generation (a full collection nearly every
        # save at 32 ranks, issue 36); the collector runs again before the write.
        with jsonfile.collector_paused():
            manifest = build_manifest(job, metadata, [r for rank in results for r in rank])
            blob = mf.dumps(manifest)
            parsed = json.loads(blob)
        try:  # what no reader would accept is never committed
            mf.validate(parsed)
        except mf.ManifestError as exc:
            raise CheckpointError(
                f"step {job.step} under {job.storage.uri} was not committed: its manifest is "
                f"invalid ({exc}); this is a bug in ckptflow, please report it"
            ) from exc
        step_dir = layout.step_dir(job.step)
        name = layout.manifest_name(job.save_id)
        job.storage.write(f"{step_dir}/{name}", blob)
        job.commit = commit.record(job, name, codec.digest(blob))
        job.metadata["_manifest_xxh3"] = job.commit["manifest_xxh3"]
        if job.together:  # every rank checks its own objects, then rank 0 commits (commit.py)
            return
        sizes = {k: v["size"] for k, v in manifest["objects"].items()}
        commit.commit_alone(job, sizes, job.commit)
        self.close(failed=False)  # committed: no longer a live save (a failure: Checkpointer)

    def close(self, failed: bool) -> None:
        """Stop the intent's heartbeat: the save committed, or `failed` (then the intent is
        marked ended, so GC collects the leftover without waiting for the lease to run out)."""
        hb, self._heartbeat = self._heartbeat, None
        if hb is None:
            return
        hb.stop()
        if failed:
            hb.end()
