"""The fan-out after a local save commits (issue 35): every rank's root gets what its rank needs
to load the step alone, then its PIECE (ckptflow/core/tier.py).

The local save is one global DCP-planned save in which each rank writes its own items into its
own root `rank-<r>` and rank 0 writes the manifest, root marker and COMMIT into its own. After
the commit, on the local Checkpointer's save thread and background gloo group (never the
training's), the ranks:

1. take rank 0's root marker, manifest and COMMIT (one broadcast);
2. each work out what they need to load the step with the same world size: DCP's own load
   plan of this rank's (staged) state against the manifest, so exactly the items a load of
   this rank reads (its own shards, the shared non-sharded items: scheduler, step, data
   position, replicated tensors; another rank's RNG entry never), plus every object its own
   parts reference (so the pieces together cover the manifest: the drain needs that);
3. agree who holds each object some rank lacks (the lowest rank that has it whole) and get
   them from it, one broadcast per sending rank; each object is checked against its key
   (xxh3-128 of the bytes) before it is written;
4. write marker, manifest and COMMIT where missing, check the piece (sizes) and write the
   PIECE last.

Every rank makes the same collectives whatever fails on it (a failure is carried to the end
and raised there, for that rank alone), so a rank whose disk fails never leaves the others
waiting in a collective. Collectives use the group's global ranks (the group is every rank).
"""

from __future__ import annotations

import json

import numpy as np
import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint import commit, dcp_metadata
from ckptflow.steps.checkpoint.save_job import SaveJob
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import create_default_local_load_plan

from ckptflow.core import codec, layout, tier
from ckptflow.core import manifest as mf
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage


class FanOutError(CheckpointError):
    """This rank's piece of a local step could not be completed (the message says why)."""


def _gather(obj, group, world: int) -> list:
    """Every rank's `obj` (a process alone: its own)."""
    if group is None or world == 1:
        return [obj]
    out: list = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def _rank0_files(storage: Storage, job: SaveJob) -> dict[str, bytes]:
    """Rank 0: the files every rank's root gets of this step (marker, manifest, COMMIT);
    `job` is rank 0's (its save id names the manifest)."""
    sd = layout.step_dir(job.step)
    rels = (
        layout.ROOT_MARKER,
        f"{sd}/{layout.manifest_name(job.save_id)}",
        layout.commit_path(job.step),
    )
    return {rel: storage.read(rel) for rel in rels}


def needed_objects(m: dict, state_dict: dict) -> dict[str, int]:
    """Object key -> stored size of every object a load of `state_dict` from manifest `m`
    reads (DCP's default load plan of this state against the manifest's metadata)."""
    flat = flatten_state_dict(state_dict)[0]
    md = dcp_metadata.metadata_from_manifest(m, set(flat))
    plan = create_default_local_load_plan(flat, md, strict=False)
    out: dict[str, int] = {}
    for ri in plan.items:
        idx = ri.storage_index
        offset = None if idx.offset is None else list(idx.offset)
        rec = m["items"][mf.item_key(idx.fqn, offset, m["format_version"])]
        for p in rec["parts"]:
            for ref in (p, p.get("base")):
                if ref is not None:
                    out[ref["object"]] = m["objects"][ref["object"]]["size"]
    return out


def _sizes(storage: Storage, keys) -> dict[str, int | None]:
    """The stored size of each object in this root (None: absent), a stat each."""
    out: dict[str, int | None] = {}
    for k in sorted(keys):
        try:
            out[k] = storage.size(layout.object_path(k))
        except FileNotFoundError:
            out[k] = None
    return out


class FanOut:
    """The fan-out of one committed local save on one rank (`run`, a collective call)."""

    def __init__(self, storage: Storage, job: SaveJob, rank: int, world: int, group):
        self.st, self.job, self.rank, self.world, self.group = storage, job, rank, world, group
        self.problem: str | None = None

    def _fail(self, what: str, exc: BaseException) -> None:
        if self.problem is None:
            self.problem = f"{what}: {type(exc).__name__}: {exc}"

    def run(self, state_dict: dict) -> tier.Piece:
        """This rank's piece of the step, written (FanOutError when it could not be)."""
        files = self._step_files()
        needs, m = self._needs(files, state_dict)
        have = self._exchange(needs)
        if self.problem is None:
            try:
                return self._finish(files, needs, m, have)
            except (CheckpointError, OSError, ValueError) as exc:
                self._fail("writing the piece", exc)
        raise FanOutError(
            f"local step {self.job.step}: the piece of rank {self.rank} in {self.st.uri} was "
            f"not completed ({self.problem}); this rank restores the step from elsewhere"
        )

    def _step_files(self) -> dict[str, bytes] | None:
        """Rank 0's marker, manifest and COMMIT bytes, on every rank (None: rank 0 failed)."""
        files = None
        if self.rank == 0:
            try:
                files = _rank0_files(self.st, self.job)
            except (CheckpointError, OSError) as exc:
                self._fail("reading rank 0's step files", exc)
        if self.group is not None and self.world > 1:
            box = [files]
            dist.broadcast_object_list(box, src=0, group=self.group)
            files = box[0]
        if files is None and self.problem is None:
            self.problem = "rank 0 could not read its marker, manifest or COMMIT"
        return files

    def _needs(self, files, state_dict) -> tuple[dict[str, int], dict | None]:
        """(objects this rank's piece lists, the manifest); ({}, None) after a failure."""
        if files is None:
            return {}, None
        try:
            m = mf.parse(files[self._manifest_rel(files)])
            needs = needed_objects(m, state_dict)
            needs.update(commit.own_objects(self.job))
            return needs, m
        except (mf.ManifestError, KeyError, ValueError, RuntimeError) as exc:
            self._fail("planning what this rank needs", exc)
            return {}, None

    def _exchange(self, needs: dict[str, int]) -> dict[str, int]:
        """Get the objects of `needs` this root lacks from a rank that has them; the sizes
        this root has (or now holds) of `needs`. Collective: every rank calls it."""
        found = _sizes(self.st, needs) if needs else {}
        missing = {k: n for k, n in needs.items() if found.get(k) != n}
        wanted = {}
        for other in _gather(missing, self.group, self.world):
            wanted.update(other)
        held = _sizes(self.st, wanted) if wanted else {}
        offers = sorted(k for k, n in wanted.items() if held.get(k) == n)
        sender: dict[str, int] = {}
        for r, keys in enumerate(_gather(offers, self.group, self.world)):
            for k in keys:
                sender.setdefault(k, r)
        for src in range(self.world):
            keys = sorted(k for k, r in sender.items() if r == src)
            if keys:
                self._transfer(src, keys, wanted, missing, found)
        lost = sorted(set(missing) - set(sender))
        if lost and self.problem is None:
            self.problem = f"{len(lost)} object(s) no rank holds ({', '.join(lost[:3])})"
        return found

    def _transfer(self, src: int, keys: list[str], sizes, missing, found) -> None:
        """One broadcast of the objects `keys` from rank `src` (their bytes in key order)."""
        total = sum(sizes[k] for k in keys)
        buf = torch.zeros(total, dtype=torch.uint8)
        if self.rank == src:
            view, at = buf.numpy(), 0
            try:
                for k in keys:
                    blob = self.st.read(layout.object_path(k))
                    view[at : at + len(blob)] = np.frombuffer(blob, np.uint8)[: sizes[k]]
                    at += sizes[k]
            except (CheckpointError, OSError, ValueError) as exc:  # zeros: receivers refuse
                self._fail(f"reading objects for rank(s) that lack them (sender {src})", exc)
        if self.group is not None and self.world > 1:
            dist.broadcast(buf, src=src, group=self.group)
        if self.rank == src:
            return
        view, at = buf.numpy(), 0
        for k in keys:
            part = view[at : at + sizes[k]]
            at += sizes[k]
            if k not in missing:
                continue
            if codec.digest(part) != k:  # damaged at the sender or on the way
                if self.problem is None:
                    self.problem = f"object {k} from rank {src} does not match its key"
                continue
            try:
                self.st.write(layout.object_path(k), part.tobytes())
                found[k] = sizes[k]
            except (CheckpointError, OSError) as exc:
                self._fail(f"writing object {k}", exc)

    def _finish(self, files, needs, m, have) -> tier.Piece:
        """Marker, manifest and COMMIT where missing (rank 0 has them), the piece checked,
        then the PIECE last."""
        for rel, blob in files.items():
            if self.rank != 0 and not self._same(rel, blob):
                self.st.write(rel, blob, atomic=True)
        self.st.flush()  # every file durable before the PIECE says the piece is complete
        short = sorted(k for k, n in needs.items() if have.get(k) != n)
        if short:
            raise FanOutError(f"{len(short)} object(s) still missing ({', '.join(short[:3])})")
        name = self._manifest_rel(files).rsplit("/", 1)[1]
        piece = tier.new_piece(self.rank, m["world_size"], self.job.step, name, needs)
        problem = tier.verify_piece(self.st, piece, check_hash=False)
        if problem is not None:
            raise FanOutError(problem)
        tier.write_piece(self.st, piece)
        return tier.read_piece(self.st, piece.step, piece.rank)

    def _manifest_rel(self, files: dict[str, bytes]) -> str:
        """The manifest among rank 0's files (its save id is rank 0's: each rank's job has
        an id of its own, only the coordinator's names the manifest)."""
        prefix = f"{layout.step_dir(self.job.step)}/manifest-"
        (rel,) = [r for r in files if r.startswith(prefix)]
        return rel

    def _same(self, rel: str, blob: bytes) -> bool:
        try:
            return self.st.read(rel, limit=len(blob) + 1) == blob
        except FileNotFoundError:
            return False


def fan_out(storage: Storage, job: SaveJob, state_dict: dict, rank: int, world: int, group):
    """This rank's piece of committed local save `job` (collective; see the module docstring)."""
    return FanOut(storage, job, rank, world, group).run(state_dict)


def step_bytes(piece: tier.Piece, storage: Storage) -> int:
    """What one local step of this rank costs the volume: its objects and its manifest."""
    try:
        manifest = storage.size(f"{layout.step_dir(piece.step)}/{piece.manifest}")
    except (FileNotFoundError, OSError):
        manifest = 0
    return piece.bytes + manifest + len(json.dumps(piece.objects))
