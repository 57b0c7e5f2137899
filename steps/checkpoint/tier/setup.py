"""The local tier of a training step, built from its arguments (issue 35): this rank's LocalTier
and what the training loop asks of it.

    source, side = ...                                    # TierSource and peers.start's Peers
    parts = start_tier(ck, TierSettings.from_args(cfg), side)   # None when local_every is 0
    loop = CheckpointedLoop(..., tier=parts)              # local saves, drains, replicas
    parts.close(); side.close()

The run's folder under local_dir is `tier.run_key(ck.root)` (the durable root's URI): a retried
pod of the same run finds its pieces, another run's are never its own. With peers (`side`,
B's peers.Peers) every PIECE this rank writes is handed to `side.replicate` (it returns at
once; the copy runs in the replicator's thread).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.tier.local_save import LocalTier, compress_like

from ckptflow.core import tier

log = logging.getLogger("ckptflow.tier")


@dataclass(frozen=True)
class TierSettings:
    """The local tier's step arguments (PretrainArgs' fields of the same names)."""

    local_every: int = 0
    local_dir: str = "/ckpt-local"
    local_keep: int = 2
    local_size_mib: int = 0
    replicas: int = 0

    @classmethod
    def from_args(cls, cfg) -> TierSettings:
        """From a step's arguments; a step without the fields (fine-tune) has the tier off."""
        return cls(
            local_every=getattr(cfg, "local_every", 0),
            local_dir=getattr(cfg, "local_dir", cls.local_dir),
            local_keep=getattr(cfg, "local_keep", cls.local_keep),
            local_size_mib=getattr(cfg, "local_size_mib", 0),
            replicas=getattr(cfg, "replicas", 0),
        )


@dataclass
class TierParts:
    """What a step holds of the local tier while it trains."""

    every: int
    local: LocalTier

    def due(self, step: int) -> bool:
        """Whether `step` is a local step (and the tier still on)."""
        return self.local.enabled and step % self.every == 0

    def close(self) -> None:
        """Wait for the local save in flight (its PIECE handed to the replicator)."""
        self.local.close()


def start_tier(ck: Checkpointer, settings: TierSettings, side=None) -> TierParts | None:
    """This rank's local tier beside durable Checkpointer `ck` (no collective); None when
    `local_every` is 0. `side`: the started peers (peers.start), None without replicas."""
    if settings.local_every <= 0:
        return None
    local = LocalTier(
        settings.local_dir,
        tier.run_key(ck.root),
        ck.rank,
        ck.world_size,
        keep=settings.local_keep,
        size_mib=settings.local_size_mib,
        compress=compress_like(ck),
        level=ck.level,
        copies=1 + (settings.replicas if side is not None else 0),
    )
    if side is not None:
        local.on_piece = side.replicate
        local.on_keep = lambda n: setattr(side.link, "keep", n)  # replicas: fewer likewise
    log.info(
        "local tier: every %d steps into %s (keep %d, replicas %s)",
        settings.local_every,
        local.root,
        settings.local_keep,
        settings.replicas if side is not None else 0,
    )
    return TierParts(settings.local_every, local)
