"""What each simulated rank hands rank 0 (benchmarks/scale_sim.py): the model's layout, each
rank's DCP save plan and our writer's write results, built directly; and a store whose object
listing answers from memory (the save's objects, without their bytes)."""

from __future__ import annotations

import hashlib
import math
import time

PART_BYTES, PACK_BYTES, PACK_SIZE = 64 << 20, 1 << 20, 4 << 20  # the Checkpointer's defaults


# -- the model ----------------------------------------------------------------------------------
def model_layout(layers: int = 93, hidden: int = 16384, vocab: int = 50304) -> list[tuple]:
    """(name, global shape) of a GPT-like model's parameters (~300B at the defaults)."""
    h = hidden
    out = [("embed.weight", (vocab, h)), ("pos_embed.weight", (8192, h))]
    for i in range(layers):
        p = f"layers.{i}."
        out += [
            (p + "ln1.weight", (h,)),
            (p + "ln1.bias", (h,)),
            (p + "attn.qkv.weight", (3 * h, h)),
            (p + "attn.qkv.bias", (3 * h,)),
            (p + "attn.proj.weight", (h, h)),
            (p + "attn.proj.bias", (h,)),
            (p + "ln2.weight", (h,)),
            (p + "ln2.bias", (h,)),
            (p + "mlp.fc1.weight", (4 * h, h)),
            (p + "mlp.fc1.bias", (4 * h,)),
            (p + "mlp.fc2.weight", (h, 4 * h)),
            (p + "mlp.fc2.bias", (h,)),
        ]
    return out + [("ln_f.weight", (h,)), ("ln_f.bias", (h,))]


def state_layout(layers: int) -> tuple[list[tuple], list[str], list[str]]:
    """(sharded fqn, global shape) of the state dict, its replicated 0-dim tensors, and its
    non-tensor values, as get_state_dict flattens them (model.*, optim.state.*, param groups)."""
    params = model_layout(layers)
    sharded = [(f"model.{n}", s) for n, s in params]
    for n, s in params:
        sharded += [(f"optim.state.{n}.exp_avg", s), (f"optim.state.{n}.exp_avg_sq", s)]
    scalars = [f"optim.state.{n}.step" for n, _ in params]
    values = [f"optim.param_groups.0.{k}" for k in ("lr", "betas", "eps", "weight_decay")]
    return sharded, scalars, values + ["train.step", "train.rng"]


def shard(rows: int, ranks: int, rank: int) -> tuple[int, int]:
    """(offset, rows) of `rank`'s dim-0 shard, as torch.chunk splits (FSDP2's Shard(0))."""
    per = -(-rows // ranks)
    start = min(rank * per, rows)
    return start, min(rows, start + per) - start


def dtensor_state(layout, ranks: int, rank: int) -> dict:
    """`rank`'s state dict as FSDP2 hands it to DCP: a DTensor Shard(0) per sharded tensor over
    a 1-D mesh of `ranks` (its local shard a zero-memory expanded view), the replicated 0-dim
    tensors and the values. Needs a process group of `ranks` with this rank (a fake one)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (ranks,))
    sharded, scalars, values = layout
    cell = torch.empty((), dtype=torch.float32)
    sd: dict = {}
    for fqn, shape in sharded:
        local = cell.expand(shard(shape[0], ranks, rank)[1], *shape[1:])  # no memory
        sd[fqn] = DTensor.from_local(
            local,
            mesh,
            [Shard(0)],
            run_check=False,
            shape=torch.Size(shape),
            stride=torch.empty(shape, device="meta").stride(),
        )
    sd.update({f: torch.zeros(()) for f in scalars})
    sd.update(dict.fromkeys(values, 0))
    return sd


# -- each rank's inputs -------------------------------------------------------------------------
def local_plan(ranks: int, rank: int, layout):
    """The SavePlan DCP's DefaultSavePlanner makes on `rank` for its shards (built directly:
    the same WriteItems, without 3,000 DTensors per simulated rank)."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    sharded, scalars, values = layout
    props = TensorProperties(dtype=torch.float32)
    items = []
    for fqn, shape in sharded:
        start, n = shard(shape[0], ranks, rank)
        offsets = torch.Size([start] + [0] * (len(shape) - 1))
        chunk = ChunkStorageMetadata(offsets=offsets, sizes=torch.Size([n, *shape[1:]]))
        items.append(
            WriteItem(
                index=MetadataIndex(fqn, offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk, props, torch.Size(shape)),
            )
        )
    zero = torch.Size([])
    for fqn in scalars:  # replicated on every rank: DCP's global plan keeps one copy
        chunk = ChunkStorageMetadata(offsets=zero, sizes=zero)
        items.append(
            WriteItem(
                index=MetadataIndex(fqn, zero),
                type=WriteItemType.TENSOR,
                tensor_data=TensorWriteData(chunk, props, zero),
            )
        )
    items += [WriteItem(index=MetadataIndex(v), type=WriteItemType.BYTE_IO) for v in values]
    planner_data = {fqn: (fqn,) for fqn, _ in sharded} | {f: (f,) for f in scalars + values}
    return SavePlan(items, planner_data=planner_data)


class _Keys:
    """Distinct 32-hex object names (content-addressed names are as long, and as distinct)."""

    def __init__(self, rank: int):
        self.rank, self.n = rank, 0

    def __call__(self) -> str:
        self.n += 1
        return hashlib.md5(f"{self.rank}/{self.n}".encode()).hexdigest()


def write_results(plan, rank: int) -> list:
    """The WriteResults our writer returns for `plan` (part records as CkptStorageWriter
    makes them: fp32 in four zstd planes, small parts packed per group)."""
    from ckptflow.steps.checkpoint.packing import group_of
    from ckptflow.steps.checkpoint.save_job import part_ranges
    from torch.distributed.checkpoint.storage import WriteResult

    from ckptflow.core import manifest as mf

    key = _Keys(rank)
    packs: dict[str, list] = {}  # group -> [key, size]
    out = []
    for item in plan.items:
        td = item.tensor_data
        n = 4 * math.prod(td.chunk.sizes) if td is not None else 64
        width = 4 if td is not None else 1
        offset = list(item.index.offset) if td is not None else None
        parts = []
        for o, e in part_ranges(n, PART_BYTES, []):
            size = e - o
            stored = (size * 83) // 100 if width == 4 else size
            q = stored // 4
            planes = [["zstd", q], ["zstd", q], ["raw", q], ["raw", stored - 3 * q]]
            rec = {
                "raw_offset": o,
                "raw_size": size,
                "raw_hash": key(),
                "width": width,
                "planes": planes if width == 4 else [["raw", size]],
                "base": None,
                "reused": False,
            }
            if size < PACK_BYTES:
                group = group_of(mf.item_key(item.index.fqn, offset))
                pack = packs.setdefault(group, [key(), 0])
                if pack[1] + stored > PACK_SIZE:  # stored: a new pack (the old one keeps its size)
                    pack = packs[group] = [key(), 0]
                rec.update(object=pack[0], span=[pack[1], stored])
                pack[1] += stored
                rec["_pack"] = pack
            else:
                rec.update(object=key(), stored_size=stored)
            parts.append(rec)
        rec = {"fqn": item.index.fqn, "offset": offset, "parts": parts}
        if td is not None:
            rec["sizes"] = list(td.chunk.sizes)
        out.append(rec)
    for rec in out:  # a pack's size is known when it is stored
        for p in rec["parts"]:
            pack = p.pop("_pack", None)
            if pack is not None:
                p["stored_size"] = pack[1]
    results = []
    for item, rec in zip(plan.items, out, strict=True):
        stored = sum(mf.part_bytes(p) for p in rec["parts"])
        results.append(WriteResult(index=item.index, size_in_bytes=stored, storage_data=rec))
    return results


# -- the store ----------------------------------------------------------------------------------
def sim_storage(uri: str, sizes: dict):
    """A memory:// root whose objects answer from `sizes` (key -> stored size), listed or
    looked at one by one: the save's objects are there without their bytes. Counts the
    requests an object store would have served: LIST pages (1,000 keys each) and HEADs."""
    from ckptflow.core import layout
    from ckptflow.core.storage import Entry, Storage

    by_folder: dict[str, list] = {}
    for k, size in sizes.items():
        by_folder.setdefault(layout.object_path(k).rsplit("/", 1)[0], []).append((k, size))

    class SimStorage(Storage):
        requests = 0

        def walk(self, rel: str = "", prefix: str = ""):
            rel = rel.strip("/")
            if rel.startswith(layout.OBJECTS):
                found = by_folder.get(rel, [])
                SimStorage.requests += max(1, -(-len(found) // 1000))
                return [Entry(f"{rel}/{k}", s, time.time()) for k, s in found]
            return super().walk(rel, prefix)

        def size(self, rel: str) -> int:
            if rel.startswith(layout.OBJECTS + "/"):
                SimStorage.requests += 1
                key = rel.rsplit("/", 1)[-1]
                if key not in sizes:
                    raise FileNotFoundError(rel)
                return sizes[key]
            return super().size(rel)

    return SimStorage(uri)
