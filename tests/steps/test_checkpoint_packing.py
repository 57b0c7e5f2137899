"""Small parts share objects (packs, steps/checkpoint/packing.py): one file or PUT for many
biases and norms, each part a verified span of its pack; large parts keep their own."""

from __future__ import annotations

import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, CorruptCheckpoint
from ckptflow.steps.checkpoint.packing import PACK_BYTES

from ckptflow.core import layout
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state(n_small: int = 40) -> dict:
    g = torch.Generator().manual_seed(0)
    small = {f"model.norm{i}": torch.randn(256, generator=g) for i in range(n_small)}
    return small | {"model.big": torch.randn(512, 1024, generator=g), "model.step": 7}


def _parts(m: dict) -> dict:
    return {it["fqn"]: it["parts"] for it in m["items"].values()}


def test_small_parts_share_a_pack_and_large_ones_keep_their_own(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    state = _state()
    ck.save(1, state)
    m = ck.manifest(1)
    parts = _parts(m)
    packs = {p["object"] for k, ps in parts.items() if k != "model.big" for p in ps}
    assert len(packs) == 1, "40 norms and a value in one object"
    (big,) = parts["model.big"]
    assert "span" not in big and big["object"] not in packs
    assert len(m["objects"]) == 2
    spans = sorted(tuple(p["span"]) for k, ps in parts.items() if k != "model.big" for p in ps)
    assert all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), (
        "spans never overlap"
    )
    target = {k: torch.zeros_like(v) for k, v in state.items() if k != "model.step"}
    target["model.step"] = None
    ck.load(target)
    assert all(torch.equal(target[k], state[k]) for k in state if k != "model.step")
    assert target["model.step"] == 7
    assert ck.last_load.bytes_read == m["stats"]["stored_bytes"], "each object read once"


def test_without_packing_every_part_has_its_own_object(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), pack_kib=0)
    ck.save(1, _state(5))
    m = ck.manifest(1)
    assert len(m["objects"]) == 7 and not any("span" in p for ps in _parts(m).values() for p in ps)


def test_a_full_pack_is_stored_and_a_new_one_begun(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), threads=1, compress=False)  # sizes exact
    n = 3 * PACK_BYTES // (256 << 10) + 1  # 256 KiB parts: over three packs' worth
    state = {f"model.t{i}": torch.randn(64 << 10) for i in range(n)}
    ck.save(1, state)
    m = ck.manifest(1)
    assert len(m["objects"]) == 4
    assert max(o["size"] for o in m["objects"].values()) <= PACK_BYTES + (256 << 10)
    t = {k: torch.zeros_like(v) for k, v in state.items()}
    ck.load(t)
    assert all(torch.equal(t[k], state[k]) for k in state)


class SlowObjects(Storage):
    """A root whose object reads take a while: every thread decoding a packed part misses
    the pack cache at once, as on a slow store."""

    def read(self, rel: str, *args, **kwargs):
        if rel.startswith("objects/"):
            time.sleep(0.05)
        return super().read(rel, *args, **kwargs)


def test_threads_decoding_parts_of_one_pack_read_it_once(tmp_path):
    state = {f"model.norm{i}": torch.randn(256) for i in range(16)}
    ck = Checkpointer("unused", storage=SlowObjects(f"memory://{tmp_path.name}/r"), threads=4)
    ck.save(1, state)
    (pack,) = {p["object"] for ps in _parts(ck.manifest(1)).values() for p in ps}
    t = {k: torch.zeros(256) for k in state}
    ck.load(t)
    assert all(torch.equal(t[k], v) for k, v in state.items())
    assert ck.last_load.bytes_read == ck.manifest(1)["objects"][pack]["size"]


def test_a_damaged_pack_fails_every_part_in_it_and_the_load_falls_back(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"))
    state = _state(8)
    ck.save(1, state)
    for t in state.values():
        if isinstance(t, torch.Tensor):
            t.add_(1)
    ck.save(2, state)
    pack = _parts(ck.manifest(2))["model.norm3"][0]["object"]
    path = ck.storage.path(layout.object_path(pack))
    with open(path, "r+b") as f:  # one flipped byte in another part's span
        f.seek(3)
        b = f.read(1)
        f.seek(3)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptCheckpoint, match="checksum"):
        ck.verify(2)
    target = {k: torch.zeros_like(v) for k, v in state.items() if k != "model.step"}
    assert Checkpointer(str(tmp_path / "r")).load(target | {"model.step": None}) == 1


def test_deltas_of_small_parts_are_packed_with_their_bases(tmp_path):
    ck = Checkpointer(str(tmp_path / "r"), full_every=3)
    state = {f"model.n{i}": torch.randn(1024) for i in range(6)}
    ck.save(1, state)
    for t in state.values():
        t[:10] += 1e-3
    ck.save(2, state)
    m = ck.manifest(2)
    assert m["kind"] == "delta"
    deltas = [p for ps in _parts(m).values() for p in ps if p["base"] is not None]
    assert deltas and all("span" in p and "span" in p["base"] for p in deltas)
    t = {k: torch.zeros_like(v) for k, v in state.items()}
    Checkpointer(str(tmp_path / "r")).load(t, step=2)
    assert all(torch.equal(t[k], state[k]) for k in state)


def test_each_top_level_group_has_its_own_packs(tmp_path):
    """Slimming to weights drops `optim`: its packs must hold nothing `model` still needs."""
    ck = Checkpointer(str(tmp_path / "r"))
    state = {f"{g}.t{i}": torch.randn(64) for g in ("model", "optim") for i in range(3)}
    ck.save(1, state | {"step": 3})
    parts = _parts(ck.manifest(1))
    packs = {
        g: {p["object"] for k, ps in parts.items() if k.startswith(g) for p in ps}
        for g in ("model", "optim", "step")
    }
    assert all(len(v) == 1 for v in packs.values()) and len(set.union(*packs.values())) == 3


@pytest.mark.parametrize("bad", [-1, 1025, 1.5, True])
def test_pack_size_must_be_an_integer_in_range(tmp_path, bad):
    with pytest.raises(ValueError, match="pack_kib"):
        Checkpointer(str(tmp_path / "r"), pack_kib=bad)
