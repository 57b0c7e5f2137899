"""DCP folders in and out: the allow-list unpickler refuses planted code, hostile metadata is
refused naming the file, an imported DCP checkpoint loads bitwise (resharded 1 -> 2 FSDP2
ranks), and an export is read by stock torch.distributed.checkpoint.load."""

from __future__ import annotations

import builtins
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.interop import (
    ForeignFormatError,
    export_checkpoint,
    import_checkpoint,
    open_source,
)
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

from tests.steps import distworkers as dw
from tests.steps.interop_helpers import EXTRA, dcp_folder, trained_state


class Planted:
    """Unpickled by plain pickle, this creates `path` (it could as well run os.system)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


class PlantedSystem:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture(scope="module")
def dcp_src(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp")
    ref = dcp_folder(str(d / "src"))
    return str(d / "src"), ref


def _rewrite(src: str, dst, edit) -> str:
    """A copy of the DCP folder `src` whose metadata `edit` changed (our own trusted file)."""
    dst.mkdir()
    for name in os.listdir(src):
        (dst / name).write_bytes(Path(src, name).read_bytes())
    with open(dst / ".metadata", "rb") as f:
        meta = pickle.load(f)
    edit(meta)
    (dst / ".metadata").write_bytes(pickle.dumps(meta))
    return str(dst)


@pytest.mark.parametrize("payload", [Planted, PlantedSystem])
def test_planted_code_in_metadata_is_refused_and_never_runs(tmp_path, dcp_src, payload):
    sanity = tmp_path / "sanity"
    pickle.loads(pickle.dumps(payload(str(sanity))))  # plain pickle runs it
    assert sanity.exists()
    marker = tmp_path / "created-by-the-payload"
    top = tmp_path / "top"
    top.mkdir()
    (top / ".metadata").write_bytes(pickle.dumps(payload(str(marker))))

    def nested(meta):  # a real Metadata, the payload deep inside it
        meta.storage_meta.checkpoint_id = payload(str(marker))

    inner = _rewrite(dcp_src[0], tmp_path / "inner", nested)
    for folder in (str(top), inner):
        with pytest.raises(ForeignFormatError, match="refused: it names"):
            import_checkpoint(folder, str(tmp_path / "root"))
        assert not marker.exists()
    assert not (tmp_path / "root").exists() or not os.listdir(tmp_path / "root")


def _first_tensor(meta):
    return next(k for k, v in meta.state_dict_metadata.items() if hasattr(v, "chunks"))


def _bad_path(meta):
    for info in meta.storage_data.values():
        info.relative_path = "../elsewhere.distcp"


def _beyond(meta):
    for info in meta.storage_data.values():
        info.offset += 1 << 30


def _transform(meta):
    for info in meta.storage_data.values():
        info.transform_descriptors = ["zstd"]


def _overlap(meta):
    sm = meta.state_dict_metadata[_first_tensor(meta)]
    sm.chunks.append(ChunkStorageMetadata(sm.chunks[0].offsets, sm.chunks[0].sizes))


def _huge(meta):
    sm = meta.state_dict_metadata[_first_tensor(meta)]
    sm.size = torch.Size([1 << 40, 1 << 40])


def _swap(meta):  # a tensor's record points at another tensor's bytes
    keys = [k for k in meta.storage_data if k.offset is not None]
    a, b = meta.storage_data[keys[0]], meta.storage_data[keys[1]]
    meta.storage_data[keys[0]], meta.storage_data[keys[1]] = b, a


def _unstored(meta):
    meta.storage_data = {k: v for k, v in meta.storage_data.items() if k.offset is None}


def _oversized(meta):
    for info in meta.storage_data.values():
        info.length = 1 << 45


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_bad_path, "not a plain file name"),
        (_beyond, "outside the file"),
        (_transform, "transforms"),
        (_overlap, "overlap"),
        (_huge, "larger than"),
        (_swap, "the metadata declares"),
        (_unstored, "has no stored data"),
        (_oversized, "expected an integer"),
    ],
)
def test_hostile_metadata_fields_are_refused_naming_the_file(tmp_path, dcp_src, edit, message):
    folder = _rewrite(dcp_src[0], tmp_path / "bad", edit)
    with pytest.raises(ForeignFormatError, match=message) as ei:
        import_checkpoint(folder, str(tmp_path / "root"))
    assert folder in str(ei.value)


def test_unknown_dtype_and_truncated_pickle_are_refused(tmp_path, dcp_src):
    def c128(meta):
        meta.state_dict_metadata[_first_tensor(meta)].properties.dtype = torch.complex128

    folder = _rewrite(dcp_src[0], tmp_path / "c128", c128)
    with pytest.raises(ForeignFormatError, match="torch.complex128"):
        open_source(folder)
    blob = Path(folder, ".metadata").read_bytes()
    (tmp_path / "c128" / ".metadata").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ForeignFormatError, match="not a DCP metadata pickle"):
        open_source(folder)


def test_import_loads_bitwise_resharded_to_two_fsdp_ranks(tmp_path, dcp_src):
    src, ref = dcp_src
    root = str(tmp_path / "ckpt")
    rep = import_checkpoint(src, root, step=3)
    assert rep.kind == "dcp" and rep.step == 3 and rep.values >= 4
    ck = Checkpointer(root)
    assert ck.committed_steps() == [3] and ck.verify(3)["objects"] > 0
    assert ck.manifest(3)["metadata"]["imported_from"]["kind"] == "dcp"
    out = str(tmp_path / "out.pt")
    dw.spawn(2, dw.load_worker, root, out)
    res = torch.load(out)
    assert set(res["state"]) == set(ref)
    for k, v in ref.items():
        assert res["state"][k].dtype == v.dtype and torch.equal(res["state"][k], v), k
    assert res["extra"] == EXTRA


def test_dcp_to_ckptflow_to_dcp_is_read_by_stock_dcp_load(tmp_path, dcp_src):
    src, _ = dcp_src
    root = str(tmp_path / "ckpt")
    import_checkpoint(src, root)
    rep = export_checkpoint(root, str(tmp_path / "out"), fmt="dcp", shard_bytes=300)
    assert len(rep.files) > 2  # sharded by the size limit
    original, _ = trained_state()
    target = _zeroed(original)
    dcp.load(target, checkpoint_id=str(tmp_path / "out"), no_dist=True)
    _assert_same(target, original)


def _zeroed(obj):
    if isinstance(obj, torch.Tensor):
        return torch.zeros_like(obj)
    if isinstance(obj, dict):
        return {k: _zeroed(v) for k, v in obj.items()}
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        return [_zeroed(x) for x in obj]  # DCP walks a list of dicts (param_groups)
    return None


def _assert_same(a, b, path=""):
    if isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(b, dict):
        assert set(a) == set(b), path
        for k in b:
            _assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(b, list) and b and isinstance(b[0], dict):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}.{i}")
    else:
        assert a == b, path
