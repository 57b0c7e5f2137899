"""The export folder's contract (issue 37 defects 3-5, issue 38 point 7): a folder holds exactly
one checkpoint (an earlier export's files are replaced, and a crash midway never leaves a mix
that loads as the wrong step), a folder that is not an earlier export is never written into,
the root is never an export's target, a root with stray foreign files is still read as the
root, a tensor name safetensors reserves is refused, and `--format hf` is model-only unless
asked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.interop import export_checkpoint, import_checkpoint, open_source
from safetensors.torch import load_file, save_file

from ckptflow.cli import main
from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage

MARKER = "ckptflow-export.json"


def _weights(step: int, n: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {f"layer{i}.weight": torch.randn(8, 8, generator=g) for i in range(n)}


@pytest.fixture
def root(tmp_path) -> str:
    """A root with steps 1 and 2 (different weights, an optimizer part, a value)."""
    path = str(tmp_path / "ckpt")
    with Checkpointer(path) as ck:
        for step in (1, 2):
            state = {"model": _weights(step), "optim": {"m": torch.ones(4) * step}, "step": step}
            ck.save(step, state)
    return path


def hf_load(folder) -> dict[str, torch.Tensor]:
    """What transformers does: `model.safetensors` when it is there, else the index."""
    if os.path.exists(f"{folder}/model.safetensors"):
        return load_file(f"{folder}/model.safetensors")
    with open(f"{folder}/model.safetensors.index.json") as fh:
        index = json.load(fh)
    out = {}
    for rel in sorted(set(index["weight_map"].values())):
        out.update(load_file(f"{folder}/{rel}"))
    return out


def _same(got: dict, want: dict) -> bool:
    return set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def _files(folder) -> set[str]:
    return set(os.listdir(folder))


@pytest.mark.parametrize("first, second", [(10**9, 300), (300, 10**9), (900, 300)])
def test_an_export_over_an_earlier_one_holds_exactly_the_new_checkpoint(
    tmp_path, root, first, second
):
    out = str(tmp_path / "out")
    export_checkpoint(root, out, step=1, fmt="hf", shard_bytes=first)
    rep = export_checkpoint(root, out, step=2, fmt="hf", shard_bytes=second)
    assert _same(hf_load(out), _weights(2))
    written = {f["name"] for f in rep.files} | {"model.safetensors.index.json", MARKER}
    assert _files(out) == written


def test_a_dcp_export_over_an_earlier_one_leaves_no_stale_distcp(tmp_path, root):
    out = str(tmp_path / "out")
    export_checkpoint(root, out, step=1, fmt="dcp", shard_bytes=300)
    rep = export_checkpoint(root, out, step=2, fmt="dcp", shard_bytes=10**9)
    assert _files(out) == {f["name"] for f in rep.files} | {".metadata", MARKER}
    state = {"model": {k: torch.zeros(8, 8) for k in _weights(2)}}
    dcp.load(state, checkpoint_id=out, no_dist=True)
    assert _same(state["model"], _weights(2))


def test_a_folder_that_is_not_an_export_of_ours_is_never_written(tmp_path, root, capsys):
    theirs = tmp_path / "hub-model"
    theirs.mkdir()
    save_file({"w": torch.ones(2)}, str(theirs / "model.safetensors"))
    (theirs / "config.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in theirs.iterdir()}
    with pytest.raises(CheckpointError, match="not empty"):
        export_checkpoint(root, str(theirs), fmt="hf")
    argv = ["ckpt", "export", root, "--format", "hf", "--to", str(theirs)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in theirs.iterdir()} == before
    empty = tmp_path / "empty"
    empty.mkdir()
    export_checkpoint(root, str(empty), fmt="hf")  # an empty folder is fine
    assert _same(hf_load(empty), _weights(2))


def test_files_of_others_beside_an_export_are_left_alone(tmp_path, root):
    out = tmp_path / "out"
    export_checkpoint(root, str(out), step=1, fmt="hf")
    (out / "README.md").write_text("notes")
    export_checkpoint(root, str(out), step=2, fmt="hf", shard_bytes=300)
    assert (out / "README.md").read_text() == "notes"
    assert _same(hf_load(out), _weights(2))
    save_file({"w": torch.ones(2)}, str(out / "pytorch_extra.safetensors"))
    with pytest.raises(CheckpointError, match="pytorch_extra.safetensors"):
        export_checkpoint(root, str(out), step=1, fmt="hf")


@pytest.mark.parametrize("where", ["root", "inside", "around"])
def test_an_export_into_or_around_its_root_is_refused(tmp_path, root, where, capsys):
    to = {"root": root, "inside": f"{root}/export", "around": str(tmp_path)}[where]
    before = sorted(str(p) for p in (tmp_path / "ckpt").rglob("*"))
    argv = ["ckpt", "export", root, "--format", "hf", "--to", to]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "inside" in err or "holds" in err, err
    assert len(err.strip().splitlines()) == 1
    assert sorted(str(p) for p in (tmp_path / "ckpt").rglob("*")) == before
    with pytest.raises(CheckpointError):
        export_checkpoint(root, to, fmt="torch")


def test_a_source_file_inside_an_earlier_export_is_not_deleted_by_its_own_export(tmp_path, root):
    out = tmp_path / "out"
    export_checkpoint(root, str(out), fmt="torch")
    with pytest.raises(CheckpointError, match="inside"):
        export_checkpoint(str(out / "model.pt"), str(out), fmt="torch")
    assert (out / "model.pt").exists()


def test_a_root_with_stray_foreign_files_is_still_read_as_the_root(tmp_path, root):
    """Issue 37 defect 4: foreign files in a root (an export made into it before exports
    into a root were refused) must not hide its committed steps."""
    save_file(_weights(1), f"{root}/model.safetensors")
    dcp.save({"w": torch.ones(2)}, checkpoint_id=root, no_dist=True)  # a .metadata too
    src = open_source(root)
    assert src.kind == "ckptflow" and src.step == 2
    out = str(tmp_path / "out")
    export_checkpoint(root, out, fmt="hf")
    assert _same(hf_load(out), _weights(2))
    rep = import_checkpoint(root, str(tmp_path / "copy"))
    assert rep.kind == "ckptflow" and rep.step == 2


def _snapshot(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(folder).iterdir()}


class CrashingStorage(Storage):
    """A destination whose writes fail from the `n`-th on (a killed export)."""

    def __init__(self, uri: str, n: int):
        super().__init__(uri)
        self.left = n

    def write(self, rel, data, **kw):
        if self.left <= 0:
            raise OSError(f"killed before writing {rel}")
        self.left -= 1
        super().write(rel, data, **kw)


@pytest.mark.parametrize("first, second", [(300, 10**9), (10**9, 300), (300, 600)])
def test_a_crash_midway_never_leaves_a_folder_that_loads_the_old_step(
    tmp_path, root, first, second
):
    """Every crash point of a second export: the folder loads as the new step, does not load,
    or is the earlier export untouched (the crash came before its first write)."""
    out = str(tmp_path / "out")
    n = 0
    while True:
        export_checkpoint(root, out, step=1, fmt="hf", shard_bytes=first)
        before = _snapshot(out)
        try:
            export_checkpoint(
                root, out, step=2, fmt="hf", shard_bytes=second, storage=CrashingStorage(out, n)
            )
        except OSError:
            try:
                got = hf_load(out)
            except Exception:  # noqa: BLE001 - an unloadable folder is a safe outcome
                got = None
            untouched = _snapshot(out) == before
            assert got is None or _same(got, _weights(2)) or untouched, f"crash after {n} writes"
            assert untouched == (n == 0)
            n += 1
            continue
        break
    assert n >= 3 and _same(hf_load(out), _weights(2))
    export_checkpoint(root, out, step=1, fmt="hf")  # the crashed folder is still ours
    assert _same(hf_load(out), _weights(1))


def test_a_tensor_named_like_the_safetensors_metadata_is_refused(tmp_path, capsys):
    """Issue 37 defect 5: `__metadata__` is the header's own key in safetensors."""
    torch.save({"__metadata__": torch.ones(2), "w": torch.ones(3)}, tmp_path / "src.pt")
    root = str(tmp_path / "ckpt")
    import_checkpoint(str(tmp_path / "src.pt"), root)
    out = str(tmp_path / "out")
    with pytest.raises(CheckpointError, match="__metadata__"):
        export_checkpoint(root, out, fmt="hf")
    assert main(["ckpt", "export", root, "--format", "hf", "--to", out]) == 2
    err = capsys.readouterr().err
    assert "__metadata__" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(f"{out}/model.safetensors")
    rep = export_checkpoint(root, out, fmt="hf", name_map=lambda n: n.strip("_"))
    assert set(hf_load(out)) == {"metadata", "w"} and rep.tensors == 2


def test_hf_export_is_model_only_unless_the_full_state_is_asked(tmp_path, root, capsys):
    out = str(tmp_path / "out")
    assert main(["ckpt", "export", root, "--format", "hf", "--to", out, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert _same(hf_load(out), _weights(2)) and rep["tensors"] == len(_weights(2))
    argv = ["ckpt", "export", root, "--format", "hf", "--to", out, "--full-state"]
    assert main(argv) == 0
    got = hf_load(out)
    assert set(got) == {f"model.{k}" for k in _weights(2)} | {"optim.m"}
    assert torch.equal(got["optim.m"], torch.ones(4) * 2)
    assert main([*argv, "--model-only"]) == 2  # one or the other
    assert main(["ckpt", "export", root, "--format", "torch", "--to", str(tmp_path / "t")]) == 0
    whole = torch.load(tmp_path / "t" / "model.pt", weights_only=True)
    assert set(whole) == {"model", "optim", "step"}  # the training formats keep everything
