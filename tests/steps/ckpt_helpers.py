"""Helpers shared by checkpoint tests: state dicts, instrumented filesystems, file surgery."""

from __future__ import annotations

import json

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

from ckptflow.core import codec, layout
from ckptflow.core.storage import Storage


def make_state(seed: int = 0, n: int = 4096) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "w": torch.randn(n // 64, 64, generator=g) * 0.02,
            "b": torch.randn(n // 64, generator=g).bfloat16(),
            "ids": torch.randint(0, 1000, (37,), generator=g),
        },
        "step": 11,
        "sched": {"lr": 0.001, "history": [1.5, 2.5], "name": "cosine"},
        "rng": torch.get_rng_state(),
        "blob": b"\x00\x01raw bytes",
        "pos": (3, 17),
    }


def zeros_like_state(state: dict) -> dict:
    """A target with the same structure: tensors zeroed, values replaced by placeholders."""

    def z(v):
        if isinstance(v, torch.Tensor):
            return torch.zeros_like(v)
        if isinstance(v, dict):
            return {k: z(x) for k, x in v.items()}
        return None

    return z(state)


def assert_same(a, b, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    else:
        assert a == b, (path, a, b)


class RecordingFS(LocalFileSystem):
    """A local filesystem that records writes and refuses renames/moves (inject via Storage(fs=))."""

    cachable = False

    def __init__(self, *a, **kw):
        super().__init__(*a, auto_mkdir=True, **kw)
        self.events: list[tuple[str, str]] = []

    def pipe_file(self, path, value, **kw):
        self.events.append(("write", path))
        return super().pipe_file(path, value, **kw)

    def mv(self, *a, **kw):
        raise AssertionError("a checkpoint must never rename or move")

    rename = move = mv


def recording_storage(root: str) -> tuple[Storage, RecordingFS]:
    fs = RecordingFS()
    st = Storage(f"file://{root}", fs=fs)
    st.protocol = "memoryish"  # route writes through fs.pipe_file so they are recorded
    return st, fs


def object_files(storage: Storage) -> list[str]:
    return [e.path for e in storage.walk(layout.OBJECTS)]


def rewrite_manifest(storage: Storage, step: int, mutate) -> None:
    """Apply `mutate(manifest)` and re-commit consistently (a crafted but self-consistent checkpoint)."""
    commit = json.loads(storage.read(layout.commit_path(step)))
    rel = f"{layout.step_dir(step)}/{commit['manifest']}"
    m = json.loads(storage.read(rel))
    mutate(m)
    blob = json.dumps(m).encode()
    storage.write(rel, blob)
    commit["manifest_xxh3"] = codec.digest(blob)
    storage.write(layout.commit_path(step), json.dumps(commit).encode())


def memory_root(name: str) -> str:
    fsspec.filesystem("memory").store.clear()
    return f"memory://{name}"
