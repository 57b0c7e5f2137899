"""Multi-rank helpers for tests: spawn gloo process groups and run FSDP2 save/load workers."""

from __future__ import annotations

import os
import socket
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adopt_env(environ: dict[str, str]) -> None:
    """Make this process's environment `environ`, the launching test's. A fork server's
    children inherit the environment the server started with, whatever the test that happened
    to start it had set then (test_finetune's MLFLOW_TRACKING_URI sent a later test's MLflow
    runs to its database), not the launching test's, as torchrun's ranks would."""
    os.environ.clear()
    os.environ.update(environ)


def rank_env(rank: int, world: int, port: int) -> None:
    """The environment torchrun gives a rank on one host, and one intra-op thread per rank."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)


def exit_with(main, argv: list[str]) -> None:
    """A step's main(argv) as the whole life of a forked process: it exits with main's exit
    code, or 1 after printing the traceback of what main raised."""
    try:
        code = main(argv)
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


def run_all(procs, timeout: float) -> list[int]:
    """Start the processes, wait up to `timeout` s for each (killing it then); exit codes."""
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


def _entry(rank: int, world: int, port: int, fn, args, errq) -> None:
    rank_env(rank, world, port)
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        dist.barrier()
    except BaseException:
        errq.put((rank, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def spawn(world: int, fn, *args) -> None:
    """Run fn(rank, world, *args) on `world` gloo ranks; raise with the first rank's traceback."""
    ctx = mp.get_context("spawn")
    errq = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world, port, fn, args, errq)) for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    if not errq.empty():
        rank, tb = errq.get()
        raise AssertionError(f"rank {rank} failed:\n{tb}")
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise AssertionError(f"ranks exited with {bad}")


class Net(nn.Module):
    """Uneven shapes on purpose: shards of 13/7/5 rows do not split evenly over 2, 3 or 4 ranks."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 13)
        self.l1 = nn.Linear(13, 7)
        self.l2 = nn.Linear(7, 5)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(self.emb(x)))).sum()


def build(shard: bool, seed: int):
    """The Net (FSDP2-sharded when `shard`) and an AdamW with initialised state."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = Net()
    if shard:
        for m in (model.emb, model.l1, model.l2):
            fully_shard(m)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train(model, opt, steps: int) -> None:
    g = torch.Generator().manual_seed(123)
    for _ in range(steps):
        x = torch.randint(0, 11, (4, 3), generator=g)
        opt.zero_grad()
        model(x).backward()
        opt.step()


def full_state(model, opt) -> dict:
    """Full (unsharded) model + optimizer state as plain CPU tensors, on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False)
    msd, osd = get_state_dict(model, opt, options=opts)
    flat = {f"model.{k}": v.clone() for k, v in msd.items()}
    if "state" in osd:  # nested optimizer state dict
        osd = {f"state.{fqn}.{k}": v for fqn, st in osd["state"].items() for k, v in st.items()}
    for k, v in osd.items():
        if k.startswith("state."):
            flat[f"optim.{k}"] = torch.as_tensor(v).clone()
    return flat


def sharded_state(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def extra_template() -> dict:
    """The shape of the non-tensor `extra` state the tests save (values are placeholders)."""
    return {"step": 0, "sched": {"last_epoch": 0, "lrs": None}, "data": None}


def save_worker(rank, world, root, ref_path, steps, extra):
    from ckptflow.steps.checkpoint import Checkpointer

    model, opt = build(True, seed=0)
    train(model, opt, steps)
    ck = Checkpointer(root)
    ck.save(
        steps,
        {**sharded_state(model, opt), "extra": extra, f"rng/rank{rank}": torch.get_rng_state()},
    )
    ref = full_state(model, opt)
    if rank == 0:
        torch.save(ref, ref_path)


def load_worker(rank, world, root, out_path):
    from ckptflow.steps.checkpoint import Checkpointer
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model, opt = build(True, seed=99)
    train(model, opt, 1)  # different values, and optimizer state allocated
    sd = {**sharded_state(model, opt), "extra": extra_template()}
    ck = Checkpointer(root)
    step = ck.load(sd)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    got = full_state(model, opt)
    if rank == 0:
        torch.save(
            {
                "step": step,
                "state": got,
                "extra": sd["extra"],
                "bytes_read": ck.last_load.bytes_read,
            },
            out_path,
        )


def coop_load_worker(rank, world, root, out_path, cooperative):
    """Every rank loads the whole (replicated) state; report bytes read from storage. A
    cooperative run loads twice: by same-host memory copies, then over the gloo broadcast."""
    from ckptflow.steps.checkpoint import Checkpointer

    rows = []
    for mode in [cooperative, "broadcast"] if cooperative is True else [cooperative]:
        sd = {f"layer{i}": torch.zeros(64 * (i + 1), 64) for i in range(8)}
        sd["step"] = None
        ck = Checkpointer(root, cooperative=mode)
        ck.load(sd)
        rows.append(
            {
                "mode": mode,
                "read": ck.last_load.bytes_read,
                "received": ck.last_load.bytes_received,
                "local": ck.last_load.bytes_received_local,
                "sum": float(sum(v.double().sum() for k, v in sd.items() if k != "step")),
                "step": sd["step"],
            }
        )
    info = [None] * world
    dist.all_gather_object(info, rows)
    if rank == 0:
        torch.save(info, out_path)


def coop_ref_worker(rank, world, root, out_path):
    """Every rank loads the whole state of `{root}.ref.pt` cooperatively; report bytes read
    from storage and whether the load is exact."""
    from ckptflow.steps.checkpoint import Checkpointer

    ref = torch.load(f"{root}.ref.pt")
    sd = {k: torch.zeros_like(v) for k, v in ref.items()}
    ck = Checkpointer(root)
    ck.load(sd)
    row = {
        "read": ck.last_load.bytes_read,
        "ok": all(torch.equal(sd[k], v) for k, v in ref.items()),
    }
    info = [None] * world
    dist.all_gather_object(info, row)
    if rank == 0:
        torch.save(info, out_path)


def coop_reshard_worker(rank, world, root, out_path, threads):
    """Load whole saved tensors as row shards (DTensors over a CPU mesh) cooperatively: every
    stored chunk is needed by both ranks, each for other rows (temporary buffers); report
    what each rank got and how many buffers it held at once."""
    from ckptflow.steps.checkpoint import Checkpointer
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    ref = torch.load(f"{root}.ref.pt")
    sd = {k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(0)]) for k, v in ref.items()}
    sd["whole"] = torch.zeros(32, 8)  # replicated: filled directly
    sd["step"] = None
    ck = Checkpointer(root, threads=threads)
    ck.load(sd)
    got = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in sd.items()}
    info = [None] * world
    dist.all_gather_object(
        info,
        {
            "ok": all(torch.equal(got[k], ref[k].chunk(world)[rank]) for k in ref),
            "whole": float(got["whole"].sum()),
            "step": sd["step"],
            "held": ck.last_load.chunks_held_peak,
            "read": ck.last_load.bytes_read,
            "local": ck.last_load.bytes_received_local,
        },
    )
    if rank == 0:
        torch.save(info, out_path)


def coop_fallback_worker(rank, world, root, out_path):
    """A cooperative load of the newest step, one of whose objects is corrupt: every rank
    falls back to the step before (none waits forever for a part its owner could not read),
    by same-host memory copies and then over the gloo broadcast."""
    from ckptflow.steps.checkpoint import Checkpointer

    rows = []
    for mode in (True, "broadcast"):
        sd = {f"layer{i}": torch.zeros(64 * (i + 1), 64) for i in range(8)}
        sd["step"] = None
        ck = Checkpointer(root, cooperative=mode)
        step = ck.load(sd)
        rows.append(
            {
                "step": step,
                "value": sd["step"],
                "fell": ck.last_load.fell_back_from,
                "local": ck.last_load.bytes_received_local,
                "sum": float(sum(v.double().sum() for k, v in sd.items() if k != "step")),
            }
        )
    info = [None] * world
    dist.all_gather_object(info, rows)
    if rank == 0:
        torch.save(info, out_path)


def coop_readahead_worker(rank, world, root, out_path, gate_s):
    """A broadcast cooperative load (one read thread) in which rank 1's first object read
    takes `gate_s` seconds; report when each rank's object reads completed (wall clock, the
    ranks share this host's) and when rank 1's slow read began returning."""
    import time

    import fsspec.implementations.local as fsl
    from ckptflow.steps.checkpoint import Checkpointer

    from ckptflow.core.storage import Storage

    done, gate = [], {}

    class Timed(fsl.LocalFileSystem):
        cachable = False  # an instance of its own, not fsspec's shared local filesystem

        def _open(self, path, mode="rb", **kw):
            if "objects/" in str(path) and "r" in mode:
                if rank == 1 and not gate:
                    time.sleep(gate_s)
                    gate["end"] = time.time()
                done.append(time.time())
            return super()._open(path, mode, **kw)

    ref = torch.load(f"{root}.ref.pt")
    sd = {k: torch.zeros_like(v) for k, v in ref.items()}
    storage = Storage(root, fs=Timed())
    ck = Checkpointer(root, storage=storage, cooperative="broadcast", threads=1)
    ck.load(sd)
    row = {
        "opened": done,
        "gate": gate.get("end"),
        "ok": all(torch.equal(sd[k], v) for k, v in ref.items()),
    }
    info = [None] * world
    dist.all_gather_object(info, row)
    if rank == 0:
        torch.save(info, out_path)
