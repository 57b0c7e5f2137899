"""The Checkpointer's load path: `load` and what it runs (one step's load, the ranks' agreement
on a step's manifest, the record of what was loaded).

Split from checkpointer.py (the house's small modules): `LoadPath` is a base class of
`Checkpointer` and works on its state (`storage`, `root`, `rank`, `world_size`, `threads`,
`cooperative`, `_distributed`, `_prior`, `_inherited`, `last_load`, `last_init`) and its
methods `_wait_inflight`, `_group`, `committed_steps` and `latest`; it is not used alone.
Loading verifies every byte it reads and, when no step is named, falls back from a corrupt
newest checkpoint to the newest valid one.
"""

from __future__ import annotations

import logging
import time

import torch.distributed.checkpoint as dcp
from ckptflow.steps.checkpoint import compat, coop, events, rank_load
from ckptflow.steps.checkpoint.dcp_errors import unwrap
from ckptflow.steps.checkpoint.reader import CkptStorageReader, SafeLoadPlanner
from ckptflow.steps.checkpoint.results import LoadInfo
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException

from ckptflow.core import candidates, layout, locator, rootreader, slim
from ckptflow.core.errors import (
    CheckpointError,
    CorruptCheckpoint,
    NotCommitted,
    StateDictMismatch,
)
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.checkpoint")


class LoadPath:
    """`Checkpointer.load` and its helpers (a base class of Checkpointer, see the module doc)."""

    def load(
        self, state_dict: dict, step: int | None = None, *, cast: bool = False, source=None
    ) -> int:
        """Fill `state_dict` in place from `step` (None: newest valid, falling back past corrupt
        ones). Tensors must have the saved dtypes unless `cast`: then they are converted.

        `source`: load from that URI instead of this root (a ckptflow root or step, a DCP
        folder, a torch.save file, Hugging Face safetensors): keys it lacks keep their values,
        and `last_init` reports what was loaded and what was left fresh (interop.init)."""
        if step is not None:
            compat.check_step(step)
        self._wait_inflight()
        if source is not None:
            from ckptflow.steps.checkpoint.interop.init import load_from

            self.last_init = load_from(self, state_dict, source, step=step, cast=cast)
            return self.last_init.step
        t0 = time.perf_counter()
        if step is not None:
            reader = self._load_step(state_dict, step, cast)
            return self._loaded(step, step, [], reader, t0)
        # newest first, re-resolved when saves or deleters change the root under the read
        cands = candidates.Candidates(self.root, self.committed_steps)
        while (s := cands.next()) is not None:
            try:
                reader = self._load_step(state_dict, s, cast)
            except (CorruptCheckpoint, NotCommitted) as exc:
                what = cands.failed(s, exc)
                if what == "damaged":
                    log.warning(
                        "checkpoint step %d is corrupt (%s); falling back to an older one", s, exc
                    )
                else:  # deleted or moved under the read (GC, retention, archive): not damage
                    log.info("step %d changed while it was read (%s); re-resolving", s, what)
                continue
            return self._loaded(s, None, cands.fell_back, reader, t0)
        if not cands.fell_back:
            raise CheckpointError(f"no committed checkpoint under {self.root}: nothing to load")
        raise CorruptCheckpoint(
            f"no valid checkpoint under {self.root}; all candidates are corrupt: "
            + "; ".join(r for _, r in cands.fell_back),
            [],
        )

    def _loaded(self, s: int, step, fell_back: list, reader, t0: float) -> int:
        """Record (last_load, the event log) that step `s` was loaded."""
        self.last_load = LoadInfo(
            s,
            step,
            fell_back,
            reader.stats.bytes_read,
            reader.stats.bytes_received,
            time.perf_counter() - t0,
            reader.stats.chunks_held_peak,
            getattr(reader.exchange, "bytes_local", 0),
        )
        if fell_back:
            log.warning(
                "loaded step %d after skipping corrupt steps %s", s, [f for f, _ in fell_back]
            )
        events.loaded(self.storage, self.rank, self.last_load)
        return s

    def _load_step(self, state_dict: dict, step: int, cast: bool) -> CkptStorageReader:
        # Only the entries this rank loads are validated and planned with: every rank's, on
        # every rank, grew with ranks x tensors (issue 36).
        only = set(flatten_state_dict(state_dict)[0])
        group = self._group(background=False)
        located = locator.locate(self.storage, step)  # an archived step reads its archive root
        m = self._agreed_manifest(located, step, only, group)
        alone = False  # loading apart from the other ranks (no exchange, no agreement)
        if m.get("rank_view") is not None:  # format 5 at the saved world size (rank_load.py)
            try:
                compat.check_compatible(state_dict, m, self.root, step, cast=cast)
                return self._read(state_dict, step, located, m, only, None, True)
            except (StateDictMismatch, rank_load.NotCovered) as exc:
                log.info(
                    "step %d: rank %d's own manifest does not cover its state (%s); loading "
                    "from every rank's manifests",
                    step,
                    self.rank,
                    str(exc).splitlines()[0],
                )
            m, alone = rootreader.read_manifest(located, step, only=only), True
        try:
            compat.check_compatible(state_dict, m, self.root, step, cast=cast)
        except StateDictMismatch as exc:
            if m.get("slimmed"):
                raise slim.slimmed_error(self.storage, step, m, exc) from None
            raise
        exchange = (
            coop.Exchange(
                group,
                self.rank,
                self.world_size,
                self.threads,
                coop.nccl_group(self.world_size),
                local=self.cooperative is True,
                items=list(m["items"].values()),
            )
            if (self.cooperative and self._distributed and self.world_size > 1 and not alone)
            else None
        )
        return self._read(state_dict, step, located, m, only, exchange, alone, group)

    def _read(self, state_dict, step, located, m, only, exchange, alone, group=None):
        """DCP's load of `state_dict` from manifest `m` (`alone`: planned by this rank alone,
        no collective: a rank's own view of a format-5 step, or its fallback from one)."""
        reader = CkptStorageReader(
            located,
            m,
            threads=self.threads,
            exchange=exchange,
            fallbacks=locator.parent_stores(self.storage),
            only=only,
        )
        try:
            dcp.load(
                state_dict,
                storage_reader=reader,
                planner=rank_load.CoveredLoadPlanner() if m.get("rank_view") else SafeLoadPlanner(),
                process_group=group,
                # A cooperative load plans per rank (a load's global plan is the local ones)
                # and agrees on failures in its own exchange: DCP's plan gather and scatter
                # over the group would only add two collectives and the coordinator's wait.
                no_dist=not self._distributed or exchange is not None or alone,
            )
        except CheckpointException as exc:
            raise unwrap(exc) from exc
        # Objects of an archived step are not in this root: never deduplicate against them.
        # (the items this rank loaded: the ones validated)
        self._prior = {
            p["raw_hash"]: p
            for it in reader.storage_data.values()
            for p in it["parts"]
            if p["base"] is None
        }
        # Only the latest valid step is never collected: deduplicating against an older one
        # could reference objects that a concurrent GC is deleting.
        # (the newest committed step's manifest was just read and validated: it is the latest
        # valid one, without reading its manifest a second time)
        committed = self.committed_steps()
        newest = committed[-1] if committed else None
        if located is not self.storage or (step != newest and step != self.latest()):
            self._prior = {}
        self._prior = {**self._inherited, **self._prior}
        return reader

    def _agreed_manifest(self, located: Storage, step: int, only: set, group) -> dict:
        """The step's manifest, checked for the entries `only` (this rank's); ranks agree on
        whether it is sound (each checked other entries): were one rank to fall back to an
        older step alone, the ranks would load different steps, or wait on each other."""
        try:
            m, error = self._read_manifest(located, step, only), None
        except (CorruptCheckpoint, NotCommitted) as exc:
            m, error = None, exc
        together = self._distributed and self.world_size > 1  # (the all-reduce runs first)
        if together and coop.any_rank(error is not None, group) and error is None:
            url = located.url(layout.step_dir(step))
            raise CorruptCheckpoint(
                f"{url}: another rank found this step's manifest unsound (its log says why)",
                [url],
            )
        if error is not None:
            raise error
        return m

    def _read_manifest(self, located: Storage, step: int, only: set) -> dict:
        """This rank's own view of a format-5 step saved at this world size (rank_load.py),
        else the step's manifest (a format-5 one merged from every rank's)."""
        view = rank_load.read_view(located, step, self.rank, self.world_size, only)
        if view is not None:
            return view
        return rootreader.read_manifest(located, step, only=only)
