"""A fine-tune's root derived from a parent root (`Checkpointer.inherit`): whether this root
may be derived from that parent step, and where the parent's parts end, so this root's parts
are cut at the same offsets and deduplicate against them."""

from __future__ import annotations

from ckptflow.core import rootreader
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage


def check_derivable(storage: Storage, root: str, ref: dict) -> None:
    """Refuse a root that holds checkpoints of its own, or was derived from another parent:
    deduplicating against a second parent would reference objects its marker does not name."""
    existing = rootreader.read_parent(storage)
    if existing is None and rootreader.committed_steps(storage):
        raise CheckpointError(
            f"{root} already holds checkpoints not derived from {ref['uri']} step "
            f"{ref['step']}; use a new root for this fine-tune"
        )
    if existing is not None and (existing.get("uri"), existing.get("step")) != (
        ref["uri"],
        ref["step"],
    ):
        raise CheckpointError(
            f"{root} was created from {existing.get('uri')} step {existing.get('step')}, "
            f"not {ref['uri']} step {ref['step']}; use a new root for this fine-tune"
        )


def part_bounds(m: dict) -> dict[str, list[int]]:
    """fqn -> sorted global byte offsets where a manifest's parts of that tensor start and end,
    for tensors stored in chunks of whole rows (dim-0 shards, as FSDP2 saves them)."""
    out: dict[str, set] = {}
    for it in m["items"].values():
        t = m["tensors"].get(it["fqn"])
        if it.get("offset") is None or t is None:
            continue
        size, offs, sizes = t["size"], it["offset"], it["sizes"]
        if any(offs[1:]) or sizes[1:] != size[1:]:
            continue
        n = sum(p["raw_size"] for p in it["parts"])
        start = offs[0] * (n // sizes[0]) if offs and sizes[0] else 0
        bounds = out.setdefault(it["fqn"], set())
        for p in it["parts"]:
            bounds |= {start + p["raw_offset"], start + p["raw_offset"] + p["raw_size"]}
    return {k: sorted(v) for k, v in out.items()}
