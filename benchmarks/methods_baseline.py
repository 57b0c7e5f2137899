"""The methods ckptflow is measured against, one save and one load per method: the disk's own
ceilings (raw: dd-like; raw-direct: O_DIRECT, the floor), torch.save, safetensors, and DCP
(FileSystemWriter, sync and async_save with its default or a reused stager)."""

from __future__ import annotations

import io
import os
import time

import numpy as np
import torch

from benchmarks import llm_state, probes


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
    block = np.random.default_rng(0).integers(0, 256, probes.BLOCK, dtype=np.uint8)
    uri = spec["path"]
    t0 = probes.clock()
    if uri.startswith("s3://"):
        from ckptflow.core.storage import Storage

        blob = np.resize(block, size).tobytes()
        t0 = probes.clock()
        Storage(os.path.dirname(uri)).write(os.path.basename(uri), blob)
    else:
        fd = os.open(uri, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for off in range(0, size, probes.BLOCK):
                os.write(fd, block[: min(probes.BLOCK, size - off)])
            os.fsync(fd)
        finally:
            os.close(fd)
    return probes.since(t0, "save")


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

    t0 = probes.clock()
    with ThreadPoolExecutor(spec["threads"]) as pool:
        list(pool.map(one, range(-(-size // part))))
    localio.fsync_dir(folder)
    return probes.since(t0, "save") | {"no_load": True}


def save_torch(spec: dict, sd: dict) -> dict:
    uri = spec["path"]
    t0 = time.perf_counter()
    if uri.startswith("s3://"):
        with probes.s3fs().open(uri[5:], "wb") as f:
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
        probes.s3fs().pipe_file(uri[5:], save(sd))
    else:
        save_file(sd, uri)
        probes.fsync_file(uri)
    return {"save_s": time.perf_counter() - t0}


def save_dcp(spec: dict, sd: dict, zstd: bool = False) -> dict:
    import torch.distributed.checkpoint as dcp

    t0 = probes.clock()
    dcp.save(sd, storage_writer=_dcp_writer(spec["path"], spec["threads"], zstd), no_dist=True)
    return probes.since(t0, "save")


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
                llm_state.Trainer(sd32, names, lr=llm_state.LR_INCREMENTAL, seed=7).step()
                sd = llm_state.as_dtype(sd32, spec["dtype"])
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


def load_raw(spec: dict, expect: dict, dst) -> dict:
    uri, buf = spec["path"], np.empty(probes.BLOCK, dtype=np.uint8)
    if uri.startswith("s3://"):
        n = len(probes.s3fs().cat_file(uri[5:]))
    else:
        n = 0
        with open(uri, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    spec["_bytes_read"] = n
    return {}


def _read_blob(uri: str):
    return io.BytesIO(probes.s3fs().cat_file(uri[5:])) if uri.startswith("s3://") else uri


def load_torch(spec: dict, expect: dict, dst) -> dict:
    return torch.load(_read_blob(spec["path"]), weights_only=True)


def load_safetensors(spec: dict, expect: dict, dst) -> dict:
    from safetensors.torch import load, load_file

    uri = spec["path"]
    return load(probes.s3fs().cat_file(uri[5:])) if uri.startswith("s3://") else load_file(uri)


def load_dcp(spec: dict, expect: dict, dst) -> dict:
    import torch.distributed.checkpoint as dcp

    dcp.load(dst, storage_reader=_dcp_reader(spec["path"]), no_dist=True)
    return dst


SAVERS = {
    "raw": save_raw,
    "raw-direct": save_raw_direct,
    "torch.save": save_torch,
    "safetensors": save_safetensors,
    "dcp": save_dcp,
    "dcp-zstd": lambda spec, sd: save_dcp(spec, sd, zstd=True),
}
TRAINING_SAVERS = {  # (spec, state, fp32 state, parameter names): they train between saves
    "dcp-async": lambda spec, sd, sd32, names: save_dcp_async(spec, sd, sd32, names, False),
    "dcp-async-reused": lambda spec, sd, sd32, names: save_dcp_async(spec, sd, sd32, names, True),
}
LOADERS = {
    "raw": load_raw,
    "torch.save": load_torch,
    "safetensors": load_safetensors,
    "dcp": load_dcp,
    "dcp-zstd": load_dcp,
}
