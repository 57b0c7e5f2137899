"""The training loop's saves with the local tier on (issue 35): which save a step gets.

- a local step (a multiple of local_every) that is not durable: a local save (LocalTier: async,
  never raises; its replication to peers follows its PIECE, peers.Replicator);
- a durable step (a multiple of ckpt_every, the last step, a preemption's) that is also local:
  the local save, then a DRAIN of it into the durable root (E's tier/drain.py, `drain_local`):
  the state is serialized once;
- a durable step otherwise, or when the local save could not start, or when a drain failed
  before: a normal durable save (the durable tier is never skipped).

A drain that fails (DrainError, raised on every rank alike) is a warning; the durable copy is
then owed: the next durable save is a normal one (`owed`), and a run that ends or leaves with
it still owed saves its last step the normal way. The loop waits for the saves in flight
before each durable save when the tier is on (the durable Checkpointer's save waits for them
anyway), so every rank knows of a failed drain at the same step.
"""

from __future__ import annotations

import logging

from ckptflow.steps.checkpoint.results import SaveHandle
from ckptflow.steps.checkpoint.tier.drain import DrainError, drain

log = logging.getLogger("ckptflow.training")


def drain_local(ck, local, step: int, local_handle: SaveHandle) -> SaveHandle:
    """E's drain of local step `step` (this rank's root `local.storage`) into `ck`'s root
    (tier/drain.py: `drain(ck, local, step, local_save=...)`); retention keeps the step while
    the drain reads it."""
    handle = drain(ck, local.storage, step, local_save=local_handle)
    local.busy(step, handle)
    return handle


class TierSaves:
    """The saves of a loop whose step has a local tier (setup.TierParts)."""

    def __init__(self, parts, ck):
        self.parts, self.ck = parts, ck
        self.owed = False  # a drain failed: the next durable save is a normal one
        self.local_stalls: list[float] = []  # stall of each local save (for the benchmarks)

    def due(self, step: int) -> bool:
        return self.parts.due(step)

    def covers(self, ckpt_every: int) -> bool:
        """Whether every durable step on the cadence is a local one too (then drained: the
        durable Checkpointer stages only for a fallback or an off-cadence last step)."""
        return ckpt_every % self.parts.every == 0

    def prepare(self, state: dict) -> None:
        self.parts.local.prepare(state)

    def local(self, step: int, state: dict, metadata: dict) -> SaveHandle | None:
        """A local save of `step` (None: the tier is off or the save could not start)."""
        handle = self.parts.local.save(step, state, metadata)
        if handle is not None:
            self.local_stalls.append(handle.stats.stall_s)
        return handle

    def durable(self, step: int, state: dict, metadata: dict, block: bool) -> SaveHandle:
        """The durable save of `step`: a drain of its local save when the step is local too,
        else (or when a durable copy is owed) a normal save."""
        if not self.owed and self.due(step):
            local = self.local(step, state, metadata)
            if local is not None:
                handle = drain_local(self.ck, self.parts.local, step, local)
                if not block:
                    return handle
                try:  # a sync save: its fallback now (every rank sees the same failure)
                    handle.wait()
                    return handle
                except DrainError as exc:
                    self.failed(step, exc)
        self.owed = False
        return self.ck.save(step, state, block=block, metadata=metadata)

    def failed(self, step: int, exc: BaseException) -> bool:
        """Whether a save's failure is a drain's (a warning, the durable copy owed)."""
        if not isinstance(exc, DrainError):
            return False
        self.owed = True
        log.warning(
            "the drain of step %d failed (%s); the next durable save is a normal one", step, exc
        )
        return True
