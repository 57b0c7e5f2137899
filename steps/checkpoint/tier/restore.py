"""The restore order of the local tier (issue 35): own local copy, then a peer's replica, then
object storage, the same choice on every rank.

    found = restore(ck, state, TierSource(local_dir, run_key, directory))
    found.step, found.source ("local" | "peer" | "store"; "" when nothing was found)
    found.load(rng_state)        # a second load of the same step from the same source
    found.measure(); found.close()  # the gang's bytes from object storage (a collective)

1. Every rank lists the pieces under its <local_dir>/<run_key>/ (its own and the replicas it
   holds: ckptflow.core.tier.list_pieces), checks each cheaply (marker, manifest, COMMIT,
   every object's size) and reports a damaged or partial one naming the file; one
   all_gather_object gives every rank all ranks' lists (bounded and validated: gathered
   objects are input too) and rank 0's view of the durable root's newest committed step
   (from its listing: no manifest is read from object storage unless the gang loads there).
2. Candidates, newest first: the saves (step S, manifest) for which every saved rank
   0..W-1 (W the current world size: a piece of another world size is never used) has a
   complete piece of THAT save on some rank and S >= the durable latest (a tie goes to the
   local step: it is closer). Pieces of two saves of one step number (an abandoned
   timeline's, kept by a peer or a node that came back, and the new one's) are never
   loaded together: that state no save ever had.
3. For a candidate each rank hashes its own piece (tier.verify_piece) before use; a damaged
   or missing one is fetched from a holder (peers.fetch, hashing on arrival; the next holder
   when one fails). The ranks agree (an all-reduce) that every rank has its piece, then load
   with a Checkpointer on the piece root (cooperative=False: the load reads only this rank's
   root) and agree again that every load succeeded. A failure on ANY rank moves the whole
   gang to the next candidate, then to object storage (Checkpointer.load: the newest valid
   durable step), which refills the whole state: never a state half from one source.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from ckptflow.steps.checkpoint import events
from ckptflow.steps.checkpoint.checkpointer import Checkpointer

from ckptflow.core import rootreader, tier
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.tier.restore")

SOURCES = ("local", "peer", "store")
MAX_LISTED = 4096  # pieces one rank may report (keep x ranks replicated to it, with room)


@dataclass(frozen=True)
class TierSource:
    """Where this rank's local tier is: <local_dir>/<run_key>/, and the gang's peer servers
    (peers.PeerDirectory; None without replicas: no fetch). `fetch(entry, saved_rank, step,
    dest_root) -> bytes` is peers.fetch (tests inject one); `storage`: local_dir's Storage."""

    local_dir: str
    run_key: str
    directory: object | None = None
    fetch: Callable | None = None
    storage: Storage | None = None

    def root(self, rank: int) -> str:
        return tier.piece_root(self.local_dir, self.run_key, rank)


@dataclass
class Restored:
    """What a restore loaded: the step (None: nothing anywhere), its source, the gang's bytes
    read from object storage, the local copies skipped (each naming its file), and the
    Checkpointer that reads the same step from the same source (`load`)."""

    step: int | None
    source: str
    store_bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    loader: Checkpointer | None = None
    own: bool = False  # `loader` is a piece's, closed by `close`
    meter: tuple = field(default=(None, 0, None), repr=False)  # (ck's Storage, start, group)

    def load(self, state: dict) -> None:
        """Fill `state` from the same step and source (the RNG's second, small load)."""
        if self.loader is None or self.step is None:
            raise CheckpointError("nothing was restored: no second load from it")
        self.loader.load(state, step=self.step)

    def measure(self) -> int:
        """The gang's bytes read from object storage since the restore began (a collective:
        every rank calls it once its loads are done), into `store_bytes`."""
        storage, start, group = self.meter
        if storage is not None:
            read = storage.meter.bytes - start
            self.store_bytes = _all_reduce(read, dist.ReduceOp.SUM, group)
        return self.store_bytes

    def close(self) -> None:
        if self.own and self.loader is not None:
            self.loader.close()


def gang_group(ck: Checkpointer):
    """A gloo group for the restore's small collectives (gathered objects, flags) and the
    peers' start: the durable Checkpointer's (the default group when it is gloo; with nccl
    its own gloo group, made now by every rank: no CUDA tensor for a gathered object)."""
    return ck._group(background=False)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce(value: int, op, group) -> int:
    if not _distributed():
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=op, group=group)
    return int(t.item())


def _all_gather(obj, group) -> list:
    if not _distributed():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


# -- 1. what this rank holds -----------------------------------------------------------------
def held_pieces(
    src: TierSource, rank: int, world: int, skipped: list[str], durable: int | None = None
) -> list[tier.Piece]:
    """The pieces under this rank's <local_dir>/<run_key>/ of world size `world`, not older
    than the durable step `durable` (an older one is never used: not even checked), that pass
    the cheap check (every file there, objects by size); each problem goes to `skipped`
    (and the log) naming the file. A step folder of this rank's own root without its PIECE
    is a partial copy (a save cut short): reported too."""
    base = src.storage or Storage(src.local_dir)
    try:
        pieces = tier.list_pieces(src.local_dir, src.run_key, base)
    except (CheckpointError, OSError, ValueError) as exc:
        _skip(skipped, f"local tier {src.local_dir} unreadable: {exc}")
        return []
    out = []
    for p in pieces:
        if p.world_size != world:
            continue  # another world size: object storage reshards, a piece cannot
        if durable is not None and p.step < durable:
            continue
        problem = tier.verify_piece(Storage(p.root), p, check_hash=False)
        if problem:
            _skip(skipped, problem)
        else:
            out.append(p)
    complete = {p.step for p in pieces if p.rank == rank}
    _partial(base, src, rank, complete, skipped, durable)
    return out


def _partial(
    base: Storage, src: TierSource, rank: int, complete: set, skipped: list, durable
) -> None:
    """Report this rank's own step folders (not older than `durable`) that hold no PIECE
    (never loaded)."""
    rel = src.root(rank)[len(src.local_dir.rstrip("/")) + 1 :]
    own = base.child(rel)
    try:
        steps = rootreader.step_names(own)
    except (CheckpointError, OSError):
        return
    for step in sorted(s for s in set(steps) - complete if durable is None or s >= durable):
        _skip(skipped, f"{own.url(tier.piece_path(step, rank))}: absent (a partial local copy)")


def _safely(fn, default, skipped: list[str], *args):
    """`fn(*args)`, or `default` when it fails in any way (an I/O error of the local volume,
    a bug): the local tier's problem on one rank must become that rank's missing piece, which
    the gang agrees on, never an exception on one rank while the others wait in the next
    collective (and never a failed restore: the store is still there)."""
    try:
        return fn(*args)
    except Exception as exc:
        _skip(skipped, f"local tier on this rank: {type(exc).__name__}: {exc}")
        return default


def _skip(skipped: list[str], problem: str) -> None:
    log.warning("local tier: skipping %s", problem)
    skipped.append(problem)


# -- 2. what the gang can assemble -----------------------------------------------------------
def _listing(pieces: list[tier.Piece]) -> list[list]:
    return [[p.rank, p.step, p.manifest] for p in pieces[:MAX_LISTED]]


def holders(gathered: list, world: int) -> dict[tuple[int, int, str], list[int]]:
    """(saved rank, step, manifest name) -> the ranks holding that piece, from every rank's
    gathered listing (malformed entries are dropped: a gathered object is input)."""
    out: dict[tuple[int, int, str], list[int]] = {}
    for holder, doc in enumerate(gathered):
        listed = doc.get("pieces") if isinstance(doc, dict) else None
        if not isinstance(listed, list):
            continue
        for item in listed[:MAX_LISTED]:
            if not (isinstance(item, list) and len(item) == 3):
                continue
            r, s, m = item
            if not (_int(r) and _int(s) and r < world and _manifest(m)):
                continue
            if holder not in out.get((r, s, m), []):
                out.setdefault((r, s, m), []).append(holder)
    return out


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62


def _manifest(m) -> bool:
    return isinstance(m, str) and tier.MANIFEST_RE.match(m) is not None


def candidates(held: dict, world: int, durable: int | None) -> list[tuple[int, str]]:
    """The saves (step, manifest name) every saved rank 0..world-1 has a piece of, not
    older than `durable`, newest first (one step's saves in a fixed order: every rank
    tries them alike)."""
    saves = {(s, m) for (_, s, m) in held}
    whole = [(s, m) for s, m in saves if all((r, s, m) in held for r in range(world))]
    return sorted((c for c in whole if durable is None or c[0] >= durable), reverse=True)


# -- 3. assemble and load --------------------------------------------------------------------
def _own_piece(
    src: TierSource, rank: int, save: tuple[int, str], holders_of: list[int], skipped: list
) -> str | None:
    """Make this rank's piece of `save` (step, manifest name) complete in its own root:
    "local" when its copy is of that save and hashes right, "peer" when fetched from a
    holder, None when neither."""
    step, manifest = save
    if problem := tier.link_problem(src.local_dir, src.run_key, rank):
        _skip(skipped, problem)  # never read nor fetched into through a planted link
        return None
    root = Storage(src.root(rank))
    try:
        piece = tier.read_piece(root, step, rank)
    except (CheckpointError, OSError) as exc:
        _skip(skipped, str(exc))
        piece = None
    if piece is not None and piece.manifest != manifest:
        piece = None  # another save of this step number: not the gang's
    if piece is not None:
        problem = tier.verify_piece(root, piece)  # every object hashed before use
        if problem is None:
            return "local"
        _skip(skipped, problem)
    entries = getattr(src.directory, "entries", None)
    if not entries or src.fetch is None:
        return None
    for holder in holders_of:
        if holder == rank or holder >= len(entries):
            continue
        try:
            got = src.fetch(entries[holder], rank, step, src.root(rank))
            fetched = tier.read_piece(root, step, rank)
            if fetched is None or fetched.manifest != manifest:  # the holder's changed since
                raise CheckpointError(f"not the piece of {manifest}: another save of step {step}")
        except Exception as exc:  # unreachable, absent there, damaged: the next holder
            log.warning(
                "piece of rank %d step %d not fetched from rank %d: %s: %s",
                rank, step, holder, type(exc).__name__, exc,
            )  # fmt: skip
            continue
        log.info(
            "fetched the piece of rank %d step %d from rank %d: %d bytes", rank, step, holder, got
        )
        return "peer"
    return None


def _load_piece(src: TierSource, rank: int, state: dict, step: int, group) -> Checkpointer | None:
    """Load `state` from this rank's piece root (over the restore's gloo `group`: no group
    made per attempt); the Checkpointer, or None on failure (logged naming the file: the
    caller's all-reduce takes the gang elsewhere)."""
    pck = None
    try:
        pck = Checkpointer(src.root(rank), cooperative=False, process_group=group)
        pck.load(state, step=step)
        return pck
    except Exception as exc:  # a missing object, a checksum: the gang falls back together
        log.warning(
            "local step %d not loaded on rank %d: %s: %s", step, rank, type(exc).__name__, exc
        )
        if pck is not None:
            pck.close()
        return None


def restore(ck: Checkpointer, state: dict, src: TierSource | None) -> Restored:
    """Fill `state` from the newest step the gang can assemble (see the module doc); every
    rank calls it (collective). Restored.step is None when there is nothing anywhere."""
    before = ck.storage.meter.bytes
    skipped: list[str] = []
    group = gang_group(ck)
    if src is None:  # no local tier: the existing path, with no collective of its own
        return _from_store(ck, state, False, (ck.storage, before, group), skipped)
    rank, world = ck.rank, ck.world_size
    # the durable root's newest committed step from its listing: its manifest (many MiB for a
    # large model) is read only when the gang loads from the store
    committed = ck.committed_steps()
    durable = committed[-1] if committed else None
    pieces = _safely(held_pieces, [], skipped, src, rank, world, skipped, durable)
    gathered = _all_gather({"pieces": _listing(pieces), "durable": durable}, group)
    first = gathered[0] if isinstance(gathered[0], dict) else {}
    durable = first.get("durable") if _int(first.get("durable")) else None
    held = holders(gathered, world)
    tried = False
    for step, manifest in candidates(held, world, durable):
        mine = held.get((rank, step, manifest), [])
        how = _safely(_own_piece, None, skipped, src, rank, (step, manifest), mine, skipped)
        if _all_reduce(int(how is None), dist.ReduceOp.MAX, group):
            log.warning("local step %d: a rank has no sound piece of it; next candidate", step)
            continue
        tried = True
        pck = _load_piece(src, rank, state, step, group)
        if _all_reduce(int(pck is None), dist.ReduceOp.MAX, group):
            if pck is not None:
                pck.close()
            log.warning("local step %d: a rank failed to load it; next candidate", step)
            continue
        peer = _all_reduce(int(how == "peer"), dist.ReduceOp.MAX, group)
        source = "peer" if peer else "local"
        if pck.last_load is not None:  # the durable root's log: a resume happened, from here
            events.loaded(ck.storage, rank, replace(pck.last_load, requested=None))
        log.info("restored step %d from the local tier (%s)", step, source)
        meter = (ck.storage, before, group)
        return Restored(step, source, 0, skipped, pck, own=True, meter=meter)
    return _from_store(ck, state, tried, (ck.storage, before, group), skipped)


def _from_store(ck, state, tried: bool, meter: tuple, skipped) -> Restored:
    """The durable root's newest valid step (the existing path), or nothing."""
    if not ck.committed_steps():
        if tried:  # pieces were (partly) loaded into `state` and nothing can refill it
            raise CheckpointError(
                f"the local tier's steps failed to load and {ck.root} holds no checkpoint: "
                "the state is not restored; remove the damaged local tier to start over"
            )
        return Restored(None, "", 0, skipped)
    step = ck.load(state)
    return Restored(step, "store", 0, skipped, ck, meter=meter)
