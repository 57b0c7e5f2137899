"""Checkpoints made elsewhere (and ckptflow's own), behind one small interface: the tensors and
values a source declares, and reads of them one at a time, so importers and exporters never
need the whole model in memory at once.

`open_source(uri)` tells the kind apart by what is there: a DCP folder (`.metadata`), a
Hugging Face folder (`model.safetensors[.index.json]`) or file (`*.safetensors`), a torch.save
file, a ckptflow root or one of its `step-XXXXXXXX` folders.
"""

from __future__ import annotations

import io
import posixpath

import torch
from ckptflow.steps.checkpoint import safe_value
from ckptflow.steps.checkpoint.interop import dcp_pickle, structure
from ckptflow.steps.checkpoint.interop import safetensors_io as sft
from ckptflow.steps.checkpoint.interop.base import (
    MAX_HEADER,
    MAX_TENSORS,
    MAX_TORCH_FILE,
    MAX_VALUE,
    ForeignFormatError,
    TensorInfo,
    check_dtype,
    check_shape,
    fail,
    file_size,
    read_json,
    read_range,
)
from torch.distributed.checkpoint._nested_dict import flatten_state_dict

from ckptflow import env
from ckptflow.core import layout, rootreader
from ckptflow.core.storage import Storage

MAX_DEPTH = 64  # path length of a DCP planner-data entry
TORCH_SAVE_OVERHEAD = 1 << 20  # a torch.save'd chunk: its bytes plus a small zip and pickle


class Source:
    """A checkpoint to read: `tensors` (fqn -> TensorInfo), `values` (fqns of non-tensors)."""

    kind = "?"

    def __init__(self, uri: str):
        self.uri = uri
        self.tensors: dict[str, TensorInfo] = {}
        self.values: list[str] = []
        self.step: int | None = None
        self.model_config: dict | None = None
        self.paths: dict[str, tuple] = {}  # fqn -> its path in the nested state dict, if known
        self.structure: list | None = None  # its containers as they were (interop.structure)
        self.location: Storage | None = None  # the folder, file or root it lies in

    def chunks(self, fqn: str) -> list[tuple[tuple, tuple]]:
        """The stored pieces of a tensor as (offsets, sizes): one whole piece unless DCP."""
        shape = self.tensors[fqn].shape
        return [((0,) * len(shape), shape)]

    def read_chunk(self, fqn: str, offsets: tuple) -> torch.Tensor:
        raise NotImplementedError

    def read_value(self, fqn: str):
        raise NotImplementedError

    def read_tensor(self, fqn: str) -> torch.Tensor:
        """The whole tensor (its chunks assembled)."""
        pieces = self.chunks(fqn)
        if len(pieces) == 1:
            return self.read_chunk(fqn, pieces[0][0])
        info = self.tensors[fqn]
        out = torch.empty(info.shape, dtype=info.dtype)
        for offs, sizes in pieces:
            dst = out
            for d, (o, n) in enumerate(zip(offs, sizes, strict=True)):
                dst = dst.narrow(d, o, n)
            dst.copy_(self.read_chunk(fqn, offs))
        return out

    def read_many(self, names: list[str]) -> dict:
        """Several tensors and values by name (a ckptflow source reads them in one load)."""
        return {n: self.read_tensor(n) if n in self.tensors else self.read_value(n) for n in names}

    def describe(self) -> str:
        return f"{self.kind} checkpoint {self.uri} ({len(self.tensors)} tensors, {len(self.values)} values)"


def _paths(planner_data, fqns: set) -> dict[str, tuple]:
    """DCP's planner data (fqn -> path in the nested state dict), where it is plain: a path
    that is not a short tuple of names is ignored (the entry is then kept flat)."""
    if not isinstance(planner_data, dict):
        return {}
    out = {}
    for fqn, path in planner_data.items():
        if (
            fqn in fqns
            and isinstance(path, (tuple, list))
            and 0 < len(path) <= MAX_DEPTH
            and all(_path_part(p) for p in path)
        ):
            out[fqn] = tuple(path)
    return out


def _path_part(p) -> bool:
    """A dict key (a name) or a list index (DCP walks lists that hold tensors)."""
    if isinstance(p, int) and not isinstance(p, bool):
        return 0 <= p <= MAX_TENSORS
    return isinstance(p, str) and 0 < len(p) <= 4096


def _lists(obj):
    """Dicts built from list indices (keys exactly 0..n-1, ints) turned back into lists."""
    if not isinstance(obj, dict):
        return obj
    obj = {k: _lists(v) for k, v in obj.items()}
    keys = list(obj)
    if keys and all(type(k) is int for k in keys) and sorted(keys) == list(range(len(keys))):
        return [obj[i] for i in range(len(keys))]
    return obj


def nest(flat: dict, paths: dict[str, tuple]) -> dict:
    """A flat fqn -> leaf dict as the nested state dict its paths describe; an entry without a
    path, or whose path runs into another entry, stays flat under its fqn."""
    out: dict = {}
    for fqn, v in flat.items():
        path = paths.get(fqn)
        d = out
        for p in (path or ())[:-1]:
            nxt = d.setdefault(p, {})
            if not isinstance(nxt, dict):
                path = None
                break
            d = nxt
        if path and path[-1] not in d:
            d[path[-1]] = v
        elif fqn in out:
            fail(fqn, "two entries are both named this")
        else:
            out[fqn] = v
    return {k: _lists(v) for k, v in out.items()}


def _checked_tensor(t, where: str, info: TensorInfo, sizes: tuple) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != info.dtype or tuple(t.shape) != sizes:
        got = f"{type(t).__name__} {getattr(t, 'dtype', '')} {list(getattr(t, 'shape', []))}"
        fail(where, f"holds {got}, the metadata declares {info.dtype} {list(sizes)}")
    return t


class DcpSource(Source):
    """A torch.distributed.checkpoint folder: `.metadata` (read by the allow-list unpickler)
    and `*.distcp` files (chunks saved with torch.save, loaded weights_only)."""

    kind = "dcp"

    def __init__(self, st: Storage):
        super().__init__(st.url())
        self.st = st
        where = st.url(".metadata")
        if file_size(st, ".metadata") > MAX_HEADER:
            fail(where, f"larger than {MAX_HEADER} bytes")
        meta = dcp_pickle.load_metadata(st.read(".metadata"), where)
        tensors, values, self.storage = dcp_pickle.check_metadata(meta, where)
        self.tensors = {k: info for k, (info, _) in tensors.items()}
        self._chunks = {k: chunks for k, (_, chunks) in tensors.items()}
        self.values = sorted(values)
        self._sizes: dict[str, int] = {}
        self.paths = _paths(meta.planner_data, set(self.tensors) | values)

    def chunks(self, fqn):
        return self._chunks[fqn]

    def _blob(self, fqn: str, offsets, limit: int) -> tuple[bytes, str]:
        rel, off, length = self.storage[(fqn, offsets)]
        where = f"{self.st.url(rel)} ({fqn!r:.200})"
        if rel not in self._sizes:
            self._sizes[rel] = file_size(self.st, rel)
        if off + length > self._sizes[rel] or length > limit:
            fail(where, f"bytes {off}+{length} lie outside the file or exceed {limit}")
        return read_range(self.st, rel, off, off + length), where

    def _load(self, blob: bytes, where: str):
        try:  # weights_only: torch's own allow-list unpickler, never arbitrary code
            return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except Exception as exc:
            fail(where, f"cannot be loaded weights-only ({type(exc).__name__}: {str(exc)[:160]})")

    def read_chunk(self, fqn, offsets):
        info = self.tensors[fqn]
        sizes = dict(self._chunks[fqn])[tuple(offsets)]
        nbytes = TensorInfo(info.dtype, sizes).nbytes
        blob, where = self._blob(fqn, tuple(offsets), nbytes + TORCH_SAVE_OVERHEAD)
        t = _checked_tensor(self._load(blob, where), where, info, sizes)
        return t.contiguous()

    def read_value(self, fqn):
        blob, where = self._blob(fqn, None, MAX_VALUE)
        return self._load(blob, where)


def _flatten(obj, where: str) -> tuple[dict, dict]:
    """A torch.save'd state dict as (fqn -> leaf, fqn -> path), named exactly as DCP names
    the entries of a state dict it loads into (its own flatten_state_dict)."""
    if not isinstance(obj, dict):
        fail(where, f"holds a {type(obj).__name__}, not a state dict (a dict of tensors)")
    try:
        flat, paths = flatten_state_dict(obj)
    except RecursionError:
        fail(where, "nested too deeply")
    except ValueError as exc:  # two entries with one name ("a.b" and a -> b)
        fail(where, str(exc)[:200])
    if len(flat) > MAX_TENSORS:
        fail(where, f"{len(flat)} entries: more than {MAX_TENSORS}")
    return flat, {k: tuple(v) for k, v in paths.items()}


def _odd_tensor(t: torch.Tensor) -> str | None:
    """What makes a tensor one ckptflow cannot store as it is (None: a plain dense tensor)."""
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return (
            f"a {type(t).__name__}: save plain tensors (a DTensor's full_tensor(), or "
            "get_state_dict with full_state_dict=True)"
        )
    if t.is_nested:
        return "a nested tensor: save its components (t.unbind()) as plain tensors"
    if t.layout != torch.strided:
        return f"a {str(t.layout).removeprefix('torch.')} tensor: save it dense (t.to_dense())"
    return None


def _check_leaf(v, where: str) -> None:
    """A leaf of a torch.save file: a plain dense tensor, or a value the engine's safe value
    encoding stores (tensors inside a value are checked alike). Without this a sparse or
    nested tensor crashed the import with torch's own RuntimeError (issue 37 defect 10)."""
    stack = [(v, 0)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, torch.Tensor):
            odd = _odd_tensor(x)
            if odd:
                fail(where, f"is {odd}")
        elif isinstance(x, (list, tuple)) and depth < MAX_DEPTH:
            stack.extend((y, depth + 1) for y in x)
        elif isinstance(x, dict) and depth < MAX_DEPTH:
            stack.extend((y, depth + 1) for y in (*x.keys(), *x.values()))
    if not isinstance(v, torch.Tensor):
        try:
            safe_value.encode_value(v)
        except (safe_value.UnsafeValueError, RecursionError) as exc:
            fail(where, f"cannot be stored: {str(exc)[:200]}")


class TorchSource(Source):
    """One torch.save file, loaded weights_only (torch's allow-list unpickler): a plain or
    nested state dict. Local files are memory-mapped, not read into memory."""

    kind = "torch"

    def __init__(self, st: Storage, rel: str):
        super().__init__(st.url(rel))
        size = file_size(st, rel)
        if size > MAX_TORCH_FILE:
            fail(self.uri, f"{size} bytes: larger than {MAX_TORCH_FILE} for a torch.save file")
        try:
            if st.protocol == "file":
                obj = torch.load(st.path(rel), map_location="cpu", weights_only=True, mmap=True)
            else:
                obj = torch.load(io.BytesIO(st.read(rel)), map_location="cpu", weights_only=True)
        except Exception as exc:
            fail(
                self.uri,
                f"not a weights-only torch.save file ({type(exc).__name__}: {str(exc)[:200]}); "
                "save a state dict (model.state_dict()), not a pickled module",
            )
        flat, self.paths = _flatten(obj, self.uri)
        self.structure = structure.record(obj, self.paths, self.uri)
        self._flat = flat
        for k, v in flat.items():
            if isinstance(v, torch.nn.Parameter):
                v = flat[k] = v.detach()
            _check_leaf(v, f"{self.uri}: {k!r:.200}")
            if isinstance(v, torch.Tensor):
                dtype = check_dtype(v.dtype, f"{self.uri}: {k!r:.200}")
                self.tensors[k] = TensorInfo(dtype, check_shape(list(v.shape), self.uri, dtype))
            else:
                self.values.append(k)

    def read_chunk(self, fqn, offsets):
        return self._flat[fqn].contiguous()

    def read_value(self, fqn):
        return self._flat[fqn]


class SafetensorsSource(Source):
    """Hugging Face safetensors: one file, or a folder (sharded with its index, or one
    model.safetensors); config.json beside it is read as the model config."""

    kind = "hf"

    def __init__(self, st: Storage, rel: str | None = None):
        super().__init__(st.url(rel or ""))
        if rel is not None:
            f = sft.open_file(st, rel)
            self.files, self.wmap = {rel: f}, dict.fromkeys(f.tensors, rel)
        else:
            self.files, self.wmap = sft.open_folder(st)
        for name, rel_ in sorted(self.wmap.items()):
            self.tensors[name] = self.files[rel_].tensors[name]
        folder = st if rel is None else st.child(posixpath.dirname(rel)) if "/" in rel else st
        if folder.exists("config.json"):
            cfg = read_json(folder, "config.json", 1 << 20, max_depth=16)
            self.model_config = cfg if isinstance(cfg, dict) else None

    def read_chunk(self, fqn, offsets):
        return self.files[self.wmap[fqn]].read(fqn)


class CkptflowSource(Source):
    """A committed step of a ckptflow root (every byte verified as it is read)."""

    kind = "ckptflow"

    def __init__(self, st: Storage, step: int | None, process_group=None):
        from ckptflow.steps.checkpoint import Checkpointer

        super().__init__(st.url())
        self.ck = Checkpointer(st.uri, storage=st, process_group=process_group)
        self.step = self.ck.latest() if step is None else step
        if self.step is None:
            raise ForeignFormatError(f"no valid committed checkpoint under {st.url()}")
        m = self.ck.manifest(self.step)
        self.manifest = m
        from ckptflow.steps.checkpoint import dcp_metadata

        for fqn, t in m["tensors"].items():
            self.tensors[fqn] = TensorInfo(dcp_metadata.DTYPES[t["dtype"]], tuple(t["size"]))
        self.values = sorted(m["values"])
        self.paths = {k: tuple(v) for k, v in (m.get("planner_data") or {}).items()}
        self.model_config = (m.get("metadata") or {}).get("model_config")
        self.structure = (m.get("metadata") or {}).get(structure.KEY)
        self.uri = st.url(layout.step_dir(self.step))

    def read_many(self, names):
        state = {}
        for n in names:
            info = self.tensors.get(n)
            state[n] = None if info is None else torch.empty(info.shape, dtype=info.dtype)
        self.ck.load(state, step=self.step)
        return state

    def read_chunk(self, fqn, offsets):
        return self.read_many([fqn])[fqn]

    def read_value(self, fqn):
        return self.read_many([fqn])[fqn]

    def close(self):
        self.ck.close()


def open_source(
    uri: str, step: int | None = None, storage: Storage | None = None, process_group=None
) -> Source:
    """The checkpoint at `uri`, whichever kind it is (ForeignFormatError naming what was found
    when it is none we read). `process_group`: the group a ckptflow source loads over."""
    st = storage or env.open_storage(uri)
    src = _open(st, step, process_group)
    if src is not None and src.location is None:
        src.location = st
    return src if src is not None else _none_read(st)


def _open(st: Storage, step: int | None, process_group) -> Source | None:
    """The source at `st`. A ckptflow root comes first: stray foreign files in a root (an
    export into it, made before such exports were refused) must never hide its committed
    steps from a reader (issue 37 defect 4)."""
    if st.is_file():
        parent, name = posixpath.split(st.path())
        folder = st.peer(parent if st.protocol == "file" else f"{st.protocol}://{parent}")
        if name.endswith(".safetensors"):
            return SafetensorsSource(folder, name)
        return TorchSource(folder, name)
    if st.exists(layout.ROOT_MARKER) or rootreader.committed_steps(st):
        return CkptflowSource(st, step, process_group)
    name = posixpath.basename(st.path())
    parent = posixpath.dirname(st.path())
    if layout.parse_step_dir(name) is not None and step in (None, layout.parse_step_dir(name)):
        up = st.peer(parent if st.protocol == "file" else f"{st.protocol}://{parent}")
        if up.exists(layout.ROOT_MARKER) or rootreader.committed_steps(up):
            src = CkptflowSource(up, layout.parse_step_dir(name), process_group)
            src.location = up  # the whole root: an export must stay out of all of it
            return src
    if st.exists(".metadata"):
        return DcpSource(st)
    if st.exists(sft.INDEX) or st.exists(sft.SINGLE):
        return SafetensorsSource(st)
    return None


def _none_read(st: Storage):
    found = ", ".join(sorted(st.listdir())[:8]) if st.exists("") else "nothing"
    raise ForeignFormatError(
        f"{st.url()} is no checkpoint ckptflow reads (found: {found}); give a DCP folder "
        "(.metadata), a torch.save file, safetensors (a file, or a folder with "
        f"{sft.SINGLE} or {sft.INDEX}) or a ckptflow root"
    )
