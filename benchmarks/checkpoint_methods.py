"""The child side of benchmarks/checkpoint.py: one save or load phase of one method per process.

Each phase runs in its own process so that its peak RSS (VmHWM) is its own. The parent passes a
JSON spec as the only argument; the child prints one line `RESULT <json>`.

The state is an LLM-shaped state dict (GPT-like fp32 weights plus AdamW exp_avg/exp_avg_sq,
made by real AdamW steps), generated once by the parent (`make_state`) and read from a
safetensors file outside any timed region. A bf16 run casts every tensor to bf16.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time
import uuid
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import xxhash  # noqa: E402

from benchmarks import storage_link  # noqa: E402

GIB = float(1 << 30)
BLOCK = 8 << 20  # dd-like block size for the raw disk / raw S3 ceiling
RAW = ("raw", "raw-direct")  # methods that write random bytes, not the state
LR_INCREMENTAL = 1e-4
WARM_LR = 3e-4


# -- the state ---------------------------------------------------------------------------------
def gpt_params(total_bytes: int, layers: int = 8) -> dict[str, tuple]:
    """Shapes of a GPT-like model whose fp32 weights + 2 AdamW moments take ~total_bytes."""
    n = total_bytes // 12  # 4 bytes weight + 4 exp_avg + 4 exp_avg_sq per parameter
    d = max(64, int(math.sqrt(0.8 * n / (12 * layers))) // 64 * 64)
    shapes: dict[str, tuple] = {}
    for i in range(layers):
        p = f"h.{i}"
        shapes |= {
            f"{p}.ln_1.weight": (d,),
            f"{p}.ln_1.bias": (d,),
            f"{p}.attn.c_attn.weight": (3 * d, d),
            f"{p}.attn.c_attn.bias": (3 * d,),
            f"{p}.attn.c_proj.weight": (d, d),
            f"{p}.attn.c_proj.bias": (d,),
            f"{p}.ln_2.weight": (d,),
            f"{p}.ln_2.bias": (d,),
            f"{p}.mlp.c_fc.weight": (4 * d, d),
            f"{p}.mlp.c_fc.bias": (4 * d,),
            f"{p}.mlp.c_proj.weight": (d, 4 * d),
            f"{p}.mlp.c_proj.bias": (d,),
        }
    shapes |= {"ln_f.weight": (d,), "ln_f.bias": (d,)}
    used = sum(math.prod(s) for s in shapes.values())
    vocab = max(64, (n - used) // d)
    return {"wte.weight": (vocab, d), **shapes}


def _init(name: str, shape: tuple, g: torch.Generator) -> torch.Tensor:
    """Trained-looking values: N(0, 0.02) matrices, LayerNorm gains near 1, small biases."""
    t = torch.randn(shape, generator=g)
    if ".ln_" in name or name.startswith("ln_f"):
        return 1.0 + 0.05 * t if name.endswith("weight") else 0.02 * t
    return (0.002 if name.endswith("bias") else 0.02) * t


def grad_scale(name: str, shape: tuple) -> torch.Tensor:
    """Per-row gradient scale (log-normal around 1e-3), fixed per tensor name: real gradients
    are far from uniform across rows, and the moments' statistics depend on it."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    s = 1e-3 * torch.exp(0.5 * torch.randn(shape[0], generator=g))
    return s.reshape((shape[0],) + (1,) * (len(shape) - 1))


class Trainer:
    """AdamW over the state's own tensors (in place), with random gradients."""

    def __init__(self, sd: dict, names: list[str], lr: float, seed: int):
        self.names = names
        self.params = {n: torch.nn.Parameter(sd[f"model.{n}"], requires_grad=True) for n in names}
        self.opt = torch.optim.AdamW(list(self.params.values()), lr=lr, weight_decay=0.1)
        for n, p in self.params.items():
            self.opt.state[p] = {
                "step": sd[f"optim.{n}.step"],
                "exp_avg": sd[f"optim.{n}.exp_avg"],
                "exp_avg_sq": sd[f"optim.{n}.exp_avg_sq"],
            }
        self.g = torch.Generator().manual_seed(seed)
        self.scale = {n: grad_scale(n, tuple(p.shape)) for n, p in self.params.items()}

    def step(self, only: list[str] | None = None) -> None:
        for n, p in self.params.items():
            p.grad = None
            if only is None or n in only:
                p.grad = torch.randn(p.shape, generator=self.g) * self.scale[n]
        self.opt.step()


def make_state(total_bytes: int, path: str, warm_steps: int = 5, seed: int = 0) -> dict:
    """Generate the fp32 state into path: trained-looking weights and AdamW moments.

    The moments start at their stationary distribution for a run at step 1000 under the same
    random gradients (exp_avg ~ N(0, s^2 (1-b1)/(1+b1)), exp_avg_sq ~ s^2 (1 + 4.5% noise)),
    then `warm_steps` real AdamW steps run on them. (Running 1000 steps would take as long as
    the benchmark; starting from zero moments would leave exp_avg_sq in its ramp-up, where it
    doubles every few steps, which no checkpoint of a real run looks like.)
    """
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    shapes = gpt_params(total_bytes)
    sd = {}
    for n, shape in shapes.items():
        s = grad_scale(n, shape).expand(shape)
        sd[f"model.{n}"] = _init(n, shape, g)
        sd[f"optim.{n}.exp_avg"] = s * math.sqrt(0.1 / 1.9) * torch.randn(shape, generator=g)
        sd[f"optim.{n}.exp_avg_sq"] = s**2 * (1 + 0.045 * torch.randn(shape, generator=g)).abs()
        sd[f"optim.{n}.step"] = torch.tensor(1000.0)
    tr = Trainer(sd, list(shapes), lr=WARM_LR, seed=seed + 1)
    for _ in range(warm_steps):
        tr.step()
    sd = {k: v.detach().contiguous() for k, v in sd.items()}
    save_file(sd, path)
    return {"names": list(shapes), "shapes": {k: list(v) for k, v in shapes.items()}}


def load_state(work: str, dtype: str) -> tuple[dict, dict]:
    """(fp32 state, the state to save in `dtype`) read from the parent's state file into the
    process's own memory, as a training state lives (and aligned as torch allocates).

    load_file's tensors view a private mapping of the file: after a cold load dropped the
    page cache, a save read the whole state back from the disk through page faults, and
    the saves and async stalls timed that read."""
    from safetensors.torch import load_file

    sd32 = {k: v.clone() for k, v in load_file(os.path.join(work, "state.safetensors")).items()}
    return sd32, as_dtype(sd32, dtype)


def as_dtype(sd32: dict, dtype: str) -> dict:
    if dtype == "fp32":
        return dict(sd32)
    return {k: v.detach().to(torch.bfloat16) for k, v in sd32.items()}


def digests(sd: dict) -> dict:
    """xxh3-128 of every tensor's bytes: reads every byte (the load 'touch') and verifies."""
    return {k: xxhash.xxh3_128_hexdigest(_np_bytes(v)) for k, v in sd.items()}


def _np_bytes(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def nbytes(sd: dict) -> int:
    return sum(v.numel() * v.element_size() for v in sd.values())


def expectation(sd: dict) -> dict:
    return {
        "tensors": {k: [list(v.shape), str(v.dtype).split(".")[-1]] for k, v in sd.items()},
        "digests": digests(sd),
    }


def template(expect: dict) -> dict:
    """Zeros of the expected shapes and dtypes: the in-place destination of DCP and ckptflow."""
    return {k: torch.zeros(s, dtype=getattr(torch, d)) for k, (s, d) in expect["tensors"].items()}


# -- process facts -----------------------------------------------------------------------------
def clock() -> tuple[float, float]:
    """(wall, CPU) now: CPU is every thread of this process (user + system)."""
    return time.perf_counter(), time.process_time()


def since(t0: tuple[float, float], prefix: str) -> dict:
    wall, cpu = clock()
    return {f"{prefix}_s": wall - t0[0], f"{prefix}_cpu_s": cpu - t0[1]}


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: clear_refs 5), so a later VmHWM is this phase's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5\n")
        return True
    except OSError:
        return False


def pre_read(uri: str) -> None:
    """Read every file of a local checkpoint once, so a warm load finds it in the page cache."""
    if uri.startswith("s3://"):
        return
    paths = (
        [uri]
        if os.path.isfile(uri)
        else [os.path.join(d, f) for d, _, files in os.walk(uri) for f in files]
    )
    buf = bytearray(BLOCK)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def rss_gib(field: str = "VmHWM") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / GIB
    return float("nan")


def drop_caches() -> bool:
    """Flush and drop the page cache (root only) so the next read comes from the disk."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fs():
    from ckptflow.core.storage import filesystem_for

    return filesystem_for("s3://x")


def stored_bytes(uri: str) -> int:
    if uri.startswith("s3://"):
        return int(_fs().du(uri[5:], total=True))
    if os.path.isfile(uri):
        return os.path.getsize(uri)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(uri) for f in files)


# -- save phases -------------------------------------------------------------------------------
def _dcp_writer(uri: str, threads: int, zstd: bool):
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._extension import ZStandard

    ext = [ZStandard()] if zstd else None
    if uri.startswith("s3://"):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        from ckptflow import env

        # os.fsync is meaningless on S3 (DCP would fall back to a global os.sync()).
        return FsspecWriter(
            uri, sync_files=False, thread_count=threads, _extensions=ext, **env.s3_storage_options()
        )
    return FileSystemWriter(uri, thread_count=threads, _extensions=ext)


def _dcp_reader(uri: str):
    from torch.distributed.checkpoint import FileSystemReader

    if uri.startswith("s3://"):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        from ckptflow import env

        return FsspecReader(uri, **env.s3_storage_options())
    return FileSystemReader(uri)


def save_raw(spec: dict, sd: dict) -> dict:
    """dd-like: write nbytes(state) of random bytes sequentially in 8 MiB blocks, then fsync."""
    size = spec["raw_bytes"]
    block = np.random.default_rng(0).integers(0, 256, BLOCK, dtype=np.uint8)
    uri = spec["path"]
    t0 = clock()
    if uri.startswith("s3://"):
        from ckptflow.core.storage import Storage

        blob = np.resize(block, size).tobytes()
        t0 = clock()
        Storage(os.path.dirname(uri)).write(os.path.basename(uri), blob)
    else:
        fd = os.open(uri, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for off in range(0, size, BLOCK):
                os.write(fd, block[: min(BLOCK, size - off)])
            os.fsync(fd)
        finally:
            os.close(fd)
    return since(t0, "save")


def save_raw_direct(spec: dict, sd: dict) -> dict:
    """The disk's floor for a durable save of these bytes with the engine's own primitive:
    nbytes(state) of random bytes in 64 MiB files, written with O_DIRECT from aligned buffers
    by `threads` threads, each file fdatasynced, then the folder (no hashing, no format)."""
    from concurrent.futures import ThreadPoolExecutor

    from ckptflow.core import localio

    size, part = spec["raw_bytes"], 64 << 20
    block = localio.aligned_empty(min(part, size))
    block[:] = np.random.default_rng(0).integers(0, 256, len(block), dtype=np.uint8)
    folder = spec["path"]
    os.makedirs(folder, exist_ok=True)

    def one(i: int) -> None:
        path = f"{folder}/{i}"
        data = block[: min(part, size - i * part)]
        if not localio.write_direct(path, data):  # no O_DIRECT here: buffered + fdatasync
            with open(path, "wb") as f:
                f.write(data)
                os.fdatasync(f.fileno())

    t0 = clock()
    with ThreadPoolExecutor(spec["threads"]) as pool:
        list(pool.map(one, range(-(-size // part))))
    localio.fsync_dir(folder)
    return since(t0, "save") | {"no_load": True}


def save_torch(spec: dict, sd: dict) -> dict:
    uri = spec["path"]
    t0 = time.perf_counter()
    if uri.startswith("s3://"):
        with _fs().open(uri[5:], "wb") as f:
            torch.save(sd, f)
    else:
        with open(uri, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
    return {"save_s": time.perf_counter() - t0}


def save_safetensors(spec: dict, sd: dict) -> dict:
    from safetensors.torch import save, save_file

    uri = spec["path"]
    t0 = time.perf_counter()
    if uri.startswith("s3://"):
        _fs().pipe_file(uri[5:], save(sd))
    else:
        save_file(sd, uri)
        _fsync_file(uri)
    return {"save_s": time.perf_counter() - t0}


def save_dcp(spec: dict, sd: dict, zstd: bool = False) -> dict:
    import torch.distributed.checkpoint as dcp

    t0 = clock()
    dcp.save(sd, storage_writer=_dcp_writer(spec["path"], spec["threads"], zstd), no_dist=True)
    return since(t0, "save")


def save_dcp_async(spec: dict, sd: dict, sd32: dict, names: list[str], reuse: bool) -> dict:
    """Two DCP async_saves with an AdamW step between: default staging (no stager passed) or
    one DefaultStager (shared memory, async staging) reused by both. The stall is the time
    until training may touch its tensors again: until async_save returns and, with async
    staging, until staging completes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    cuda = torch.cuda.is_available()
    stager = DefaultStager(StagingOptions(cuda, True, True, cuda)) if reuse else None
    stalls, totals = [], []
    try:
        for i in range(2):
            if i:
                Trainer(sd32, names, lr=LR_INCREMENTAL, seed=7).step()
                sd = as_dtype(sd32, spec["dtype"])
            writer = _dcp_writer(f"{spec['path']}/{i}", spec["threads"], False)
            t0 = time.perf_counter()
            kw = {"async_stager": stager} if stager is not None else {}
            resp = dcp.async_save(sd, storage_writer=writer, no_dist=True, **kw)
            if hasattr(resp, "staging_completion"):
                resp.staging_completion.result()
                stalls.append(time.perf_counter() - t0)
                resp.upload_completion.result()
            else:
                stalls.append(time.perf_counter() - t0)
                resp.result()
            totals.append(time.perf_counter() - t0)
    finally:
        if stager is not None:
            stager.close()
    return {
        "save_s": totals[1],
        "stall_s": stalls[1],
        "first_stall_s": stalls[0],
        "expect_state": sd,
        "no_load": True,
    }


def _ck(spec: dict, **kw):
    from ckptflow.steps.checkpoint import Checkpointer

    return Checkpointer(spec["path"], threads=spec["threads"], **kw)


def compressed_share(manifest: dict) -> float | None:
    """The share of the raw bytes a save wrote (reused parts left out) that it stored
    compressed: what `compress="auto"` chose. None when it wrote nothing."""
    written = packed = 0
    for item in manifest["items"].values():
        for part in item["parts"]:
            if part.get("reused"):
                continue
            written += part["raw_size"]
            if part["planes"] != [["raw", part["raw_size"]]]:
                packed += part["raw_size"]
    return packed / written if written else None


def _ck_result(ck, step: int, stats, **extra) -> dict:
    m = ck.manifest(step)
    st = m["stats"]
    return {
        "save_s": stats.stall_s,  # a synchronous save: the caller waited for all of it
        "manifest": st,
        "compressed_share": compressed_share(m),
        "step": step,
        **extra,
    }


def save_ckptflow(spec: dict, sd: dict, **kw) -> dict:
    """A synchronous save with the defaults (`compress="auto"`), or with `kw` (compress=True:
    the codec's own ratio, what `auto` gives where storage is slow)."""
    ck = _ck(spec, **kw)
    t0 = clock()
    stats = ck.save(1, sd).wait()
    timed = since(t0, "save")
    ck.close()
    return _ck_result(ck, 1, stats) | timed


def save_ckptflow_async(spec: dict, sd: dict, sd32: dict, names: list[str]) -> dict:
    """Two async saves; the second (after an AdamW step, staging buffers reused) is measured.
    Before the first, `prepare(state)` as the training loop calls it after its first step (the
    snapshot buffers are allocated and pre-faulted in the background while training goes on)."""
    ck = _ck(spec)
    ck.prepare(sd)
    ck._stager.wait_prepared()  # as the training's next steps run meanwhile
    prepare_s = ck._stager.prepared_s
    t0 = time.perf_counter()
    first = ck.save(1, sd, block=False)
    first_stall = time.perf_counter() - t0
    first = first.wait()
    tr = Trainer(sd32, names, lr=LR_INCREMENTAL, seed=7)
    tr.step()
    sd = as_dtype(sd32, spec["dtype"])
    t0 = time.perf_counter()
    handle = ck.save(2, sd, block=False)
    stall = time.perf_counter() - t0
    stats = handle.wait()
    total = time.perf_counter() - t0
    ck.close()
    out = _ck_result(ck, 2, stats, first_stall_s=first_stall, stall_wall_s=stall)
    out |= {"save_s": total, "stall_s": stall, "expect_state": sd, "prepare_s": prepare_s}
    return out


def save_ckptflow_nohash(spec: dict, sd: dict) -> dict:
    """The same save with xxh3 replaced by a unique id (benchmark-only monkeypatch).

    Also times xxh3 itself over the state's raw bytes and over the stored bytes of a normal save
    (the two digests a save computes), single-threaded, as a direct measure of hashing cost.
    """
    from ckptflow.core import codec

    hashed = save_ckptflow({**spec, "path": spec["path"] + "-hashed"}, sd)
    real = codec.digest
    codec.digest = lambda data: uuid.uuid4().hex
    try:
        ck = _ck(spec)
        stats = ck.save(1, sd).wait()
        ck.close()
    finally:
        codec.digest = real
    t0 = time.perf_counter()
    for v in sd.values():
        real(_np_bytes(v))
    raw_hash_s = time.perf_counter() - t0
    stored = hashed["manifest"]["stored_bytes"]
    per_byte = raw_hash_s / max(nbytes(sd), 1)
    return {
        "save_s": stats.stall_s,
        "stall_s": stats.stall_s,
        "save_s_hashed": hashed["save_s"],
        "hash_s_raw": raw_hash_s,
        "hash_s_total_est": raw_hash_s + per_byte * stored,
        "manifest": hashed["manifest"],
        "cleanup": [spec["path"] + "-hashed"],
        "no_load": True,
    }


def save_ckptflow_incremental(spec: dict, sd: dict, sd32: dict, names: list[str]) -> dict:
    """Full save, 10 AdamW steps at lr 1e-4, delta save (full_every=11): new bytes vs full."""
    ck = _ck(spec, full_every=11)
    full = ck.save(0, sd).wait()
    before = {k: v.clone() for k, v in sd.items()}
    tr = Trainer(sd32, names, lr=LR_INCREMENTAL, seed=11)
    for _ in range(10):
        tr.step()
    sd = as_dtype(sd32, spec["dtype"])
    t0 = clock()
    delta = ck.save(10, sd).wait()
    timed = since(t0, "save")
    ck.close()
    full_st = ck.manifest(0)["stats"]
    out = _ck_result(ck, 10, delta, expect_state=sd) | timed
    out["entropy_floor"] = entropy_floor(before, sd) / full_st["stored_bytes"]
    out |= {"full_save_s": full.stall_s, "full_manifest": full_st, "kind": delta.kind}
    out["ratio_vs_full"] = out["manifest"]["new_bytes"] / full_st["stored_bytes"]
    return out


def _h0_bytes(plane: np.ndarray) -> float:
    """Order-0 entropy of a byte plane, in bytes: what no coder of independent bytes beats."""
    counts = np.bincount(plane, minlength=256).astype(np.float64)
    p = counts[counts > 0] / len(plane)
    return float(-(p * np.log2(p)).sum()) * len(plane) / 8


def entropy_floor(base: dict, new: dict) -> float:
    """Bytes of a delta at the order-0 entropy floor (see entropy_floor_parts)."""
    return entropy_floor_parts(base, new)[0]


def entropy_floor_parts(base: dict, new: dict) -> tuple[float, float]:
    """(floor, the part of it in the two low mantissa planes of 4-byte floats) in bytes.

    Per tensor the cheapest of the transforms a delta part may store (the tensor itself, XOR
    against the base, the zigzag integer difference), each byte plane at its order-0 entropy:
    no coder of independent bytes goes below it. The low mantissa planes of a dense AdamW state
    are noise (entropy ~1.000): no lossless delta of it goes below their part."""
    from ckptflow.core import codec

    total = low = 0.0
    for k, t in new.items():
        a, b = _np_bytes(t), _np_bytes(base[k])
        w = t.element_size() if t.is_floating_point() and t.numel() > 1 else 1
        kinds = [None, "xor"] + (["sub"] if w > 1 and codec.sub_ok(w, len(a)) else [])
        best = None
        for kind in kinds:
            x = a if kind is None else codec.delta(kind, a, b, w)
            planes = [_h0_bytes(np.ascontiguousarray(x[j::w])) for j in range(w)]
            if best is None or sum(planes) < sum(best):
                best = planes
        total += sum(best)
        low += best[0] + best[1] if w == 4 else 0.0
    return total, low


def save_ckptflow_frozen(spec: dict, sd: dict, sd32: dict, names: list[str]) -> dict:
    """Full save; train only the last tensors holding ~5% of the state; save again."""
    ck = _ck(spec)
    ck.save(1, sd).wait()
    total, budget, trainable = nbytes(sd32), 0, []
    for n in reversed(names):  # the last layers, like a fine-tune of the top of the model
        if budget >= 0.05 * total:
            break
        trainable.append(n)
        budget += 3 * sd32[f"model.{n}"].numel() * 4
    tr = Trainer(sd32, names, lr=LR_INCREMENTAL, seed=13)
    tr.step(only=trainable)
    sd = as_dtype(sd32, spec["dtype"])
    stats = ck.save(2, sd).wait()
    ck.close()
    full_st = ck.manifest(1)["stats"]
    out = _ck_result(ck, 2, stats, expect_state=sd, changed_fraction=budget / total)
    out["full_manifest"] = full_st
    out["ratio_vs_full"] = out["manifest"]["new_bytes"] / full_st["stored_bytes"]
    return out


SAVERS = {
    "raw": save_raw,
    "raw-direct": save_raw_direct,
    "torch.save": save_torch,
    "safetensors": save_safetensors,
    "dcp": save_dcp,
    "dcp-zstd": lambda spec, sd: save_dcp(spec, sd, zstd=True),
    "ckptflow-sync": save_ckptflow,
    "ckptflow-compressed": lambda spec, sd: save_ckptflow(spec, sd, compress=True),
    "ckptflow-coop2": save_ckptflow,
    "ckptflow-nohash": save_ckptflow_nohash,
}
TRAINING_SAVERS = {
    "dcp-async": lambda spec, sd, sd32, names: save_dcp_async(spec, sd, sd32, names, False),
    "dcp-async-reused": lambda spec, sd, sd32, names: save_dcp_async(spec, sd, sd32, names, True),
    "ckptflow-async": save_ckptflow_async,
    "ckptflow-incremental": save_ckptflow_incremental,
    "ckptflow-frozen95": save_ckptflow_frozen,
}


def run_save(spec: dict) -> dict:
    meta = read_json(os.path.join(spec["work"], "meta.json"))
    if spec["method"] in RAW:
        sd32, sd = {}, {}
    else:
        sd32, sd = load_state(spec["work"], spec["dtype"])
    base_rss = rss_gib("VmRSS")
    warm_up(spec, load=False)
    m = spec["method"]
    if m in TRAINING_SAVERS:
        out = TRAINING_SAVERS[m](spec, sd, sd32, meta["names"])
    else:
        out = SAVERS[m](spec, sd)
    final = out.pop("expect_state", sd)
    if sd:
        with open(spec["expect"], "w") as f:
            json.dump(expectation(final), f)
    out["raw_bytes"] = nbytes(final) if sd else spec["raw_bytes"]
    out["stored_bytes"] = stored_bytes(spec["path"])
    out["rss_base_gib"], out["rss_peak_gib"] = base_rss, rss_gib()
    return out


def remove(uri: str) -> None:
    """Delete a file or folder, local or on S3 (missing is fine)."""
    import shutil

    if uri.startswith("s3://"):
        fs = _fs()
        if fs.exists(uri[5:]):
            fs.rm(uri[5:], recursive=True)
    elif os.path.isdir(uri):
        shutil.rmtree(uri)
    elif os.path.exists(uri):
        os.remove(uri)


def warm_up(spec: dict, load: bool) -> None:
    """Save (and load) a tiny state with the same method first, so imports, lazy set-up and
    code pages are not billed to the measured call; every method gets the same treatment."""
    if spec["method"] in RAW:
        return
    tiny = as_dtype({"warm.a": torch.randn(4096), "warm.b": torch.randn(64, 64)}, spec["dtype"])
    wspec = spec | {"path": spec["path"] + "-warmup", "step": 1}
    try:
        m = spec["method"]
        SAVERS.get(m, save_dcp if m.startswith("dcp") else save_ckptflow)(wspec, tiny)
        if load:
            exp = expectation(tiny)
            got = LOADERS.get(m, load_ckptflow)(wspec, exp, template(exp))
            assert digests(got) == digests(tiny), "warm-up round trip differs"
    finally:
        remove(wspec["path"])
        remove(wspec["path"] + "-hashed")


# -- load phases -------------------------------------------------------------------------------
def load_raw(spec: dict, expect: dict, dst) -> dict:
    uri, buf = spec["path"], np.empty(BLOCK, dtype=np.uint8)
    if uri.startswith("s3://"):
        n = len(_fs().cat_file(uri[5:]))
    else:
        n = 0
        with open(uri, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    spec["_bytes_read"] = n
    return {}


def _read_blob(uri: str):
    return io.BytesIO(_fs().cat_file(uri[5:])) if uri.startswith("s3://") else uri


def load_torch(spec: dict, expect: dict, dst) -> dict:
    return torch.load(_read_blob(spec["path"]), weights_only=True)


def load_safetensors(spec: dict, expect: dict, dst) -> dict:
    from safetensors.torch import load, load_file

    uri = spec["path"]
    return load(_fs().cat_file(uri[5:])) if uri.startswith("s3://") else load_file(uri)


def load_dcp(spec: dict, expect: dict, dst) -> dict:
    import torch.distributed.checkpoint as dcp

    dcp.load(dst, storage_reader=_dcp_reader(spec["path"]), no_dist=True)
    return dst


def load_ckptflow(spec: dict, expect: dict, dst) -> dict:
    ck = _ck(spec)
    ck.load(dst, spec["step"])
    spec["_bytes_read"] = ck.last_load.bytes_read
    return dst


LOADERS = {
    "raw": load_raw,
    "torch.save": load_torch,
    "safetensors": load_safetensors,
    "dcp": load_dcp,
    "dcp-zstd": load_dcp,
}


def _cache(spec: dict) -> bool:
    """Warm (every file read once) or cold (page cache dropped; also for "link"); True when it
    is cold."""
    if spec.get("cache") == "warm":
        pre_read(spec["path"])
        return False
    return drop_caches()


def _link(spec: dict):
    """For cache "link": this process's disk reads capped at spec["link_mib_s"] (a storage link
    of its own, as each rank's host has on a cluster: storage_link.py); else nothing."""
    if spec.get("cache") != "link":
        return contextlib.nullcontext()
    name = f"ckptflow-bench-{os.getpid()}"
    return storage_link.capped(name, spec["path"], spec["link_mib_s"])


def run_load(spec: dict) -> dict:
    """One timed load: into zeros allocated (and touched) before timing, then an xxh3 of every
    tensor; extra peak RSS = the peak during the load above the RSS before it."""
    if spec["method"] == "ckptflow-coop2":
        return run_coop_rank(spec)
    raw = spec["method"] == "raw"
    expect = {} if raw else read_json(spec["expect"])
    load = LOADERS.get(spec["method"], load_ckptflow)
    warm_up(spec, load=True)
    dst = None if raw else template(expect)
    cold = _cache(spec)
    with _link(spec):
        reset_peak_rss()
        base = rss_gib("VmRSS")
        t0 = clock()
        sd = load(spec, expect, dst)
        got = {} if raw else digests(sd)  # touches every byte of every tensor, for every method
        timed = since(t0, "load")
    bad = sorted(k for k in expect.get("digests", {}) if got.get(k) != expect["digests"][k])
    if bad or set(got) != set(expect.get("digests", {})):
        raise SystemExit(f"{spec['method']}: loaded state differs from the saved one: {bad[:5]}")
    return timed | {
        "cold": cold,
        "bytes_read": spec.get("_bytes_read"),
        "rss_peak_gib": rss_gib(),
        "rss_extra_gib": rss_gib() - base,
    }


def run_coop_rank(spec: dict) -> dict:
    """One of M gloo ranks that all load the whole (replicated) state cooperatively."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=spec["rank"], world_size=spec["world"])
    cold = None
    try:
        expect = read_json(spec["expect"])
        import ckptflow.steps.checkpoint.checkpointer  # noqa: F401  (imported before the cache is dropped)

        ck = _ck(spec, cooperative=spec.get("cooperative", True))
        sd = template(expect)
        if spec["rank"] == 0:
            cold = _cache(spec)
        with _link(spec):  # each rank its own link
            dist.barrier()
            reset_peak_rss()
            base = rss_gib("VmRSS")
            t0 = clock()
            ck.load(sd, spec["step"])
            got = digests(sd)
            timed = since(t0, "load")
        if got != expect["digests"]:
            raise SystemExit(f"rank {spec['rank']}: loaded state differs from the saved one")
        ck.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return timed | {
        "cold": cold,
        "bytes_read": ck.last_load.bytes_read,
        "bytes_received": ck.last_load.bytes_received,
        "bytes_local": ck.last_load.bytes_received_local,
        "rss_peak_gib": rss_gib(),
        "rss_extra_gib": rss_gib() - base,
    }


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    torch.set_num_threads(spec.get("torch_threads") or torch.get_num_threads())
    out = run_save(spec) if spec["phase"] == "save" else run_load(spec)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
