"""The full training state as one nested dict for the Checkpointer (model, optimizer, scheduler,
data position, step, every rank's RNG under a rank-qualified key `rng/rank{r}/...`), and the
resume that loads it back from the newest valid checkpoint.
"""

from __future__ import annotations

import logging

import torch
from ckptflow.steps.checkpoint.tier.restore import Restored, restore
from ckptflow.steps.lib.data import ShardedLoader
from ckptflow.steps.lib.distributed import DistInfo
from ckptflow.steps.lib.rng import rng_state, set_rng_state
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

log = logging.getLogger("ckptflow.training")


def train_state(model, optimizer, scheduler, loader: ShardedLoader, step: int) -> dict:
    """Everything a resume needs, except RNG (see `rng_entry`): nested dict for ck.save/ck.load."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        "scheduler": scheduler.state_dict(),
        "data": loader.state_dict(),
        "step": step,
    }


def rng_entry(rank: int, device: torch.device) -> dict:
    """This rank's RNG states under its rank-qualified key: {"rng": {"rank{r}": {...}}}."""
    return {"rng": {f"rank{rank}": rng_state(device)}}


def apply_train_state(state: dict, model, optimizer, scheduler, loader: ShardedLoader) -> int:
    """Push a loaded training state into the live objects; returns its step."""
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    scheduler.load_state_dict(state["scheduler"])
    loader.load_state_dict(state["data"])
    return int(state["step"])


def resume(
    ck, model, optimizer, scheduler, loader, dinfo: DistInfo, lineage=None, tier=None
) -> int:
    """Load the newest valid checkpoint (model, optimizer, scheduler, data, RNG); its step or 0
    (see `restore_training`)."""
    return (
        restore_training(ck, (model, optimizer, scheduler, loader), dinfo, lineage, tier).step or 0
    )


def restore_training(ck, objs, dinfo: DistInfo, lineage=None, tier=None) -> Restored:
    """Load the newest checkpoint the gang can assemble into the live objects (model,
    optimizer, scheduler, data, RNG) and say where it came from (`Restored`: step, None for
    none; source; the gang's bytes read from object storage).

    With `tier` (a restore.TierSource: the local tier's folder and peers) the local tier's
    order comes first: own local copy, a peer's replica, then object storage (see
    ckptflow.steps.checkpoint.tier.restore). The Checkpointer falls back past a corrupt newest
    checkpoint; that is logged and tagged. RNG states are loaded in a second, small load from
    the same source, because which ranks saved one depends on the world size of that
    checkpoint; ranks beyond it keep their seeded RNG.
    """
    if tier is None and not ck.committed_steps():
        return Restored(None, "")
    model, optimizer, scheduler, loader = objs
    state = train_state(model, optimizer, scheduler, loader, 0)
    found = restore(ck, state, tier)
    if found.step is None:
        return found
    try:
        step = found.step
        last = ck.last_load if found.source == "store" else None
        fell = [s for s, _ in last.fell_back_from] if last else []
        apply_train_state(state, model, optimizer, scheduler, loader)
        saved_world = int(found.loader.manifest(step).get("world_size", 1))
        rng = rng_entry(dinfo.rank, dinfo.device) if dinfo.rank < saved_world else {}
        found.load(rng)
        if rng:
            set_rng_state(rng["rng"][f"rank{dinfo.rank}"], dinfo.device)
        found.measure()  # (a collective: after both loads)
    finally:
        found.close()
    log.info(
        "resumed from step %d (saved by %d ranks, now %d) from %s: %d bytes from object storage",
        step, saved_world, dinfo.world_size, found.source, found.store_bytes,
    )  # fmt: skip
    if fell and dinfo.is_main:
        log.warning("newest checkpoint(s) %s are corrupt: resumed from step %d instead", fell, step)
    if lineage is not None:
        tags = {
            "ckptflow.resumed_from_step": step,
            "ckptflow.resume_world_size": saved_world,
            "ckptflow.resume_source": found.source,
            "ckptflow.resume_store_bytes": found.store_bytes,
        }
        if fell:
            tags["ckptflow.resume_fell_back_from"] = ",".join(map(str, fell))
        if found.skipped:  # damaged or partial local copies (this rank's), each naming its file
            tags["ckptflow.resume_skipped_local"] = "; ".join(found.skipped)[:4000]
        lineage.set_tags(tags)
        if dinfo.is_main:  # one point per recovery: MLflow's history counts them by source
            metrics = {"resume_store_bytes": found.store_bytes, f"resume_from_{found.source}": 1}
            lineage.log_metrics(metrics, step)
    return found


def init_from(ck, objs, uri: str, what: str, dinfo: DistInfo, lineage=None) -> int:
    """Fill a fresh run from `uri` (`Checkpointer.load(source=...)`): the model's weights, or
    (`what="full"`) the whole training state; keys the source lacks keep their fresh values.
    Floating tensors are converted to the model's dtypes (a bf16 export into an fp32 run).
    Logs and tags what was loaded and what was initialised fresh; the step to start from."""
    model, optimizer, scheduler, loader = objs
    if what == "full":
        state = train_state(model, optimizer, scheduler, loader, 0)
        ck.load(state, source=uri, cast=True)
        step = apply_train_state(state, model, optimizer, scheduler, loader)
    else:
        state = {"model": get_model_state_dict(model)}
        ck.load(state, source=uri, cast=True)
        set_model_state_dict(model, state["model"])
        step = 0
    rep = ck.last_init
    if dinfo.is_main:
        for line in rep.lines():
            log.info("%s", line)
    if lineage is not None:
        lineage.set_tags(
            {
                "ckptflow.init_from": rep.source,
                "ckptflow.init_from_kind": rep.kind,
                "ckptflow.init_state": what,
                "ckptflow.init_loaded": len(rep.loaded),
                "ckptflow.init_fresh": ",".join(rep.fresh)[:4000],
                "ckptflow.init_unused": ",".join(rep.unused)[:4000],
            }
        )
    return step
