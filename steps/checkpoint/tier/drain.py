"""The drain of a local step into the durable root (issue 35): a step that is both a local and a
durable checkpoint is serialized once, into the local tier; its durable copy is made from there.

Once the local save of step S is committed (the local save's handle, waited for in the
background), each rank uploads from its own rank root (the local piece: core/tier.py) the
objects the durable root lacks, each read once and checked against its key (xxh3-128 of its
bytes) before it goes up; rank 0 then writes the manifest (the local one with the durable root's
id and a save id of its own) and the step commits with the durable root's rules (commit.py:
each rank checks its own objects, rank 0 claims COMMIT exclusively), under the intent and
heartbeat every save keeps for GC (save_intent.py), the root marker claimed on a first save.
Objects are content-addressed: the same key is the same bytes, so an object the durable root
has already (an earlier step's) is never uploaded again, and the step loads with the normal
reader and equals a direct durable save of the same state.

Which rank uploads an object: the lowest rank whose piece lists it (one all-reduce over the
manifest's object keys), so the small shared items every piece holds go up once, and every
object of the manifest is in some piece or the drain fails (a step missing objects never
commits). The drain runs on the durable Checkpointer's save thread and background group
(`Checkpointer.run_as_save`): training never waits for it; the Checkpointer's next save, load
or close waits for it to end.

FALLBACK CONTRACT (the caller, steps/lib/loop.py): a drain either commits step S in the durable
root or fails as a whole, on every rank alike, with one DrainError naming the cause (the local
save failed, a piece is incomplete, a local object is damaged, the object store is down, ...),
leaving no COMMIT (its intent marked ended, so GC collects what it uploaded). The durable tier
must then not be skipped: the caller makes a normal durable save (`Checkpointer.save`) of step
S if it still holds that state, else of the next step it reaches. A drain finding S already
committed in the durable root does nothing and succeeds (stats with no bytes).
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint import commit, events
from ckptflow.steps.checkpoint.results import SaveHandle, SaveStats
from ckptflow.steps.checkpoint.reuse import TRUST
from ckptflow.steps.checkpoint.save_intent import Heartbeat, clear_stray_archived
from ckptflow.steps.checkpoint.save_job import SaveJob

from ckptflow import env
from ckptflow.core import codec, intent, layout, locator, rootreader, tier
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage
from ckptflow.core.uris import OBJECT_STORES

log = logging.getLogger("ckptflow.checkpoint")

KIND = "drain"  # SaveStats.kind of a drain
MAX_WORKERS = 16  # uploads in flight per rank: each holds one object (<= part size) in memory


class DrainError(CheckpointError):
    """A drain failed (every rank raises it alike); nothing was committed in the durable root:
    the caller saves the step, or the next, the normal way (module docstring)."""


def drain(ck, local: Storage | str, step: int, *, local_save=None) -> SaveHandle:
    """Drain local step `step` from this rank's piece root `local` into `ck`'s root (`ck`: the
    durable Checkpointer; a collective call, every rank in the same order). `local_save`: the
    local save's handle (`wait()` raises its failure), waited for in the background first; it
    must end once this rank's PIECE is written. Returns a handle like a durable async save's:
    `done()`, `wait()` -> SaveStats (kind "drain", bytes_written = bytes this rank uploaded,
    bytes_reused = bytes of its objects the durable root had, bytes_raw = stored bytes of the
    objects it answered for) or raises DrainError: then save durably (module docstring)."""
    local_st = local if isinstance(local, Storage) else env.open_storage(local)
    stats = SaveStats(step=step, kind=KIND)
    job = _Drain(ck, local_st, step, local_save, stats)
    t0 = time.perf_counter()
    future = ck.run_as_save(stats, job.run)
    stats.stall_s = time.perf_counter() - t0
    return SaveHandle(stats, future)


def _agree(problem: str | None, group, world: int) -> list:
    """Every rank's `problem` (None: none), gathered over `group` (a process alone: its own)."""
    if group is None or world == 1:
        return [problem]
    out: list = [None] * world
    dist.all_gather_object(out, problem, group=group)
    return out


def _first_problem(problems: list, what: str) -> str | None:
    """The first rank's problem, naming its rank, or None."""
    for r, p in enumerate(problems):
        if p is not None:
            return f"{what} (rank {r}): {p}"
    return None


def _why(exc: BaseException) -> str:
    """A failure in one line: ckptflow's own say what and where; any other has its type
    named (an OSError's text alone can be a bare path)."""
    return str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"


def _piece_parts(m: dict, objects: dict) -> list[dict]:
    """The part records of every item whose parts the piece's `objects` hold, those items
    validated (the manifest was read checking none: a rank checks only what it uses)."""
    fqns = {
        it["fqn"]
        for it in m["items"].values()
        if any(isinstance(p, dict) and p.get("object") in objects for p in it["parts"])
    }
    mf.validate(m, only=fqns)
    return [p for it in m["items"].values() if it["fqn"] in fqns for p in it["parts"]]


class _Drain:
    """One drain on one rank (`run` on the durable Checkpointer's save thread)."""

    def __init__(self, ck, local: Storage, step: int, local_save, stats: SaveStats):
        self.ck, self.local, self.step = ck, local, step
        self.local_save, self.stats = local_save, stats
        self.rank, self.world = ck.rank, ck.world_size
        self.durable: Storage = ck.storage
        self.job = SaveJob(
            storage=self.durable,
            step=step,
            save_id=uuid.uuid4().hex[:16],
            root_id="",
            world_size=self.world,
            together=True,
        )
        self.heartbeat: Heartbeat | None = None
        self.piece: tier.Piece | None = None
        self.manifest_xxh3 = ""
        self.parts: list[dict] = []  # the part records of the items of this rank's piece

    def fail(self, why: str) -> DrainError:
        return DrainError(
            f"drain of local step {self.step} ({self.local.uri}) into {self.durable.uri} "
            f"failed: {why}; nothing was committed there: save step {self.step}, or the "
            "next one, to the durable root the normal way"
        )

    def run(self, group) -> None:
        t0 = time.perf_counter()
        try:
            self._run(group)
        except BaseException as exc:
            self._end_intent(failed=True)
            events.saved(self.durable, self.rank, self.stats, exc)
            if isinstance(exc, Exception) and not isinstance(exc, DrainError):
                raise self.fail(_why(exc)) from exc
            raise
        self._end_intent(failed=False)
        self.stats.background_s = time.perf_counter() - t0
        if self.stats.bytes_raw or self.stats.bytes_reused or self.stats.bytes_written:
            events.saved(self.durable, self.rank, self.stats)

    def _run(self, group) -> None:
        # 1. the local step committed and this rank's piece complete; rank 0: the durable side
        problem, local_m = self._local_side()
        committed = False
        if self.rank == 0 and problem is None:
            committed, problem = self._durable_side()
        digest = None if local_m is None else self.manifest_xxh3
        found = _agree((problem, committed, digest), group, self.world)
        bad = _first_problem([p for p, _, _ in found], "not ready")
        if bad is None and len({d for _, _, d in found}) != 1:
            bad = "the ranks' local manifests of this step differ (pieces of different saves)"
        if bad is not None:
            raise self.fail(bad)
        if found[0][1]:
            log.info(
                "step %d is already committed in %s: nothing to drain", self.step, self.durable.uri
            )
            return
        # 2. who answers for each object: the lowest rank whose piece lists it
        keys = sorted(local_m["objects"])
        mine = self._holders(keys, group)
        sizes = {k: local_m["objects"][k]["size"] for k in mine}
        # 3. upload what the durable root lacks, each object verified first
        problem = None
        try:
            self._upload(sizes)
        except Exception as exc:  # every rank must hear of it
            problem = _why(exc)
        uploads = _agree((problem, self.stats.bytes_written), group, self.world)
        bad = _first_problem([p for p, _ in uploads], "upload failed")
        if bad is not None:
            raise self.fail(bad)
        # 4. rank 0 writes the manifest; every rank checks its objects; rank 0 claims COMMIT
        problem = None
        if self.rank == 0:
            try:
                self._write_manifest(local_m, sum(n for _, n in uploads))
            except Exception as exc:
                problem = _why(exc)
        bad = _first_problem(_agree(problem, group, self.world), "manifest not written")
        if bad is not None:
            raise self.fail(bad)
        self.job.part_records = [
            {"object": k, "stored_size": n, "base": None} for k, n in sizes.items()
        ]
        commit.commit_together(self.job, self.rank, self.world, group)
        # later saves of this root deduplicate against the drained step, as after its own save
        self.ck.adopt(self.parts)
        log.info(
            "drained step %d into %s: %d bytes uploaded by rank %d, %d there already",
            self.step,
            self.durable.uri,
            self.stats.bytes_written,
            self.rank,
            self.stats.bytes_reused,
        )

    def _local_side(self) -> tuple[str | None, dict | None]:
        """(problem, the local manifest): the local save ended well and this rank's piece of
        the step is complete (sizes; each object's hash is checked as it is uploaded)."""
        try:
            if self.local_save is not None:
                self.local_save.wait()
        except Exception as exc:
            return f"the local save did not complete ({type(exc).__name__}: {exc})", None
        try:
            piece = tier.read_piece(self.local, self.step, self.rank)
            if piece is None:
                url = self.local.url(tier.piece_path(self.step, self.rank))
                return f"{url} is missing (the local piece is not complete)", None
            if piece.world_size != self.world:
                return f"the piece is of world size {piece.world_size}, not {self.world}", None
            problem = tier.verify_piece(self.local, piece, check_hash=False)
            if problem is not None:
                return problem, None
            m = rootreader.read_manifest(self.local, self.step, only=set())
            self.parts = _piece_parts(m, piece.objects)
            self.manifest_xxh3 = rootreader.read_commit(self.local, self.step)["manifest_xxh3"]
        except (mf.ManifestError, TypeError, KeyError) as exc:  # (a hostile manifest's parts)
            url = self.local.url(layout.step_dir(self.step))
            return f"{url}: the local manifest is malformed ({exc})", None
        except Exception as exc:  # a problem like any other: the ranks must agree on it
            return _why(exc), None
        self.piece = piece
        return None, m

    def _durable_side(self) -> tuple[bool, str | None]:
        """Rank 0: (already committed, problem). Otherwise the root marker claimed on a first
        save, stray debris cleared and the save's intent written with its heartbeat, as the
        writer's coordinator does (writer.set_up_storage_writer)."""
        st = self.durable
        try:
            if st.exists(layout.commit_path(self.step)):
                return True, None
            # (a fine-tune's root names its parent, as Checkpointer._run's first save does)
            self.job.root_id = rootreader.ensure_root(st, getattr(self.ck, "_parent", None))
            clear_stray_archived(st, self.step)
            rel, blob = intent.write_intent(st, self.step, self.job.save_id, self.world)
            self.heartbeat = Heartbeat(st, rel, blob)
        except Exception as exc:  # the object store down, a foreign root: agreed, then raised
            return False, _why(exc)
        return False, None

    def _holders(self, keys: list[str], group) -> list[str]:
        """The keys this rank answers for: those whose lowest listing rank is this one. A key
        no piece lists fails the drain (the step would commit without it)."""
        have = torch.tensor(
            [self.rank if k in self.piece.objects else self.world for k in keys],
            dtype=torch.int32,
        )
        if group is not None and self.world > 1 and len(keys):
            dist.all_reduce(have, op=dist.ReduceOp.MIN, group=group)
        orphans = [k for k, r in zip(keys, have.tolist(), strict=True) if r >= self.world]
        if orphans:
            raise self.fail(
                f"{len(orphans)} object(s) of the manifest are in no rank's piece "
                f"({', '.join(orphans[:3])})"
            )
        return [k for k, r in zip(keys, have.tolist(), strict=True) if r == self.rank]

    def _upload(self, sizes: dict[str, int]) -> None:
        """Upload the objects of `sizes` the durable root lacks, or holds damaged (rewritten
        under their own name, which repairs them); each is read once from the local root and
        checked against its key first. An object there is trusted as the writer trusts one it
        reuses (reuse.py: read once per process, then its fingerprint), a borrowed one where
        a reader finds it (the parent roots)."""
        st = self.durable
        stores = [st, *locator.parent_stores(st)]
        workers = self.ck.threads * (4 if st.protocol in OBJECT_STORES else 1)
        workers = min(workers, MAX_WORKERS, max(len(sizes), 1))
        with ThreadPoolExecutor(workers, "ckpt-drain") as pool:
            keys = sorted(sizes)
            found = pool.map(lambda k: TRUST.sound(stores, k, sizes[k]), keys)
            sound = dict(zip(keys, found, strict=True))
            todo = [k for k in keys if not sound[k]]
            self.stats.bytes_raw = sum(sizes.values())
            self.stats.bytes_reused = sum(sizes[k] for k in keys if sound[k])
            self.stats.bytes_written = sum(pool.map(lambda k: self._copy(k, sizes[k]), todo))

    def _copy(self, key: str, size: int) -> int:
        """One object from the local root to the durable one, verified; its size."""
        rel = layout.object_path(key)
        blob = self.local.read(rel, limit=size + 1)
        if len(blob) != size or codec.digest(blob) != key:
            raise CheckpointError(
                f"{self.local.url(rel)}: the local object is damaged (its bytes do not match "
                "its key); not uploaded"
            )
        self.durable.write(rel, blob, direct=True)  # locally: no page-cache copy (as the writer)
        return size

    def _write_manifest(self, local_m: dict, uploaded: int) -> None:
        """Rank 0: the local manifest as this root's (its id, this drain's save id, the bytes
        new to it), validated as the writer's is, and the commit marker's record."""
        m = dict(local_m, root_id=self.job.root_id, save_id=self.job.save_id)
        m["stats"] = dict(local_m["stats"], new_bytes=uploaded)
        blob = mf.dumps(m)
        mf.parse(blob)  # what no reader would accept is never committed (as writer.finish)
        name = layout.manifest_name(self.job.save_id)
        self.durable.write(f"{layout.step_dir(self.step)}/{name}", blob)
        self.job.commit = commit.record(self.job, name, codec.digest(blob))

    def _end_intent(self, failed: bool) -> None:
        hb, self.heartbeat = self.heartbeat, None
        if hb is None:
            return
        hb.stop()
        if failed:
            hb.end()
