"""Verification drills (ckptflow.steps.drill): a sound root passes; a flipped byte in a recent
step marks it CORRUPT for every reader (loads fall back, retention does not count it) and
fails the drill; a model that does not load fails the test-load the same way."""

from __future__ import annotations

import json
import os

import pytest
import torch
from ckptflow.steps import drill as drill_step
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib.model import GPT, config_for

from ckptflow.core import layout, listing, rootreader
from ckptflow.core.gc import gc
from ckptflow.core.storage import Storage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture
def root(tmp_path):
    """Steps 1-3 of a tiny GPT with its model_config, as pretrain saves them."""
    uri = str(tmp_path / "ckpt")
    cfg = config_for("tiny")
    ck = Checkpointer(uri)
    for step in (1, 2, 3):
        torch.manual_seed(step)
        model = GPT(cfg)
        meta = {"model_config": cfg.to_dict()}
        ck.save(step, {"model": model.state_dict(), "step": step}, metadata=meta)
    ck.close()
    return uri


def _run(uri: str, out) -> tuple[int, dict]:
    rc = drill_step.main(["--ckpt-root", uri, "--newest", "2", "--output-dir", str(out)])
    return rc, {n: (out / n).read_text() for n in os.listdir(out)}


def test_a_sound_root_passes_the_drill(root, tmp_path):
    rc, outputs = _run(root, tmp_path / "out")
    assert rc == 0
    assert json.loads(outputs["verified"]) == [3, 2] and json.loads(outputs["corrupt"]) == []
    assert outputs["loaded_step"] == "3"
    assert not any(layout.CORRUPT in n for n in os.listdir(f"{root}/step-00000003"))


def test_a_flipped_byte_marks_the_step_corrupt_for_every_reader_and_fails(root, tmp_path):
    st = Storage(root)
    m = rootreader.read_manifest(st, 3)
    own = sorted(set(m["objects"]) - set(rootreader.read_manifest(st, 2)["objects"]))
    path = os.path.join(root, layout.object_path(own[0]))
    with open(path, "r+b") as f:  # same size: only a full read finds it
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    rc, outputs = _run(root, tmp_path / "out")
    assert rc == 1 and json.loads(outputs["corrupt"]) == [3]
    assert outputs["loaded_step"] == "2"  # the test-load skipped the marked step
    assert os.path.exists(f"{root}/step-00000003/{layout.CORRUPT}")
    ck = Checkpointer(root)
    assert ck.latest() == 2
    cfg = config_for("tiny")
    state = {"model": GPT(cfg).state_dict(), "step": -1}
    assert ck.load(state) == 2  # a resume falls back past it
    ck.close()
    rows = {r.step: r for r in listing.build_rows(st, now=1e10)}
    assert rows[3].state == "corrupt" and not rows[3].valid
    report = gc(root, "last=1", grace_s=0)
    assert report.keep[2] == ["last-1", "latest-valid"]  # 3 is not counted as valid
    rc, outputs = _run(root, tmp_path / "again")
    assert rc == 0 and json.loads(outputs["verified"]) == [2]  # already marked: not re-read


def test_a_step_that_does_not_load_into_its_model_fails_the_test_load(root, tmp_path):
    st = Storage(root)
    ck = Checkpointer(root)
    bad = config_for("tiny").to_dict() | {"d_model": 32}  # the saved tensors do not fit
    ck.save(
        4,
        {"model": GPT(config_for("tiny")).state_dict(), "step": 4},
        metadata={"model_config": bad},
    )
    ck.close()
    rc, outputs = _run(root, tmp_path / "out")
    assert rc == 1 and json.loads(outputs["corrupt"]) == [4]
    assert "test-load" in st.read(f"{layout.step_dir(4)}/{layout.CORRUPT}").decode()


def test_a_step_marked_corrupt_is_not_read_again_whatever_its_reason_says(tmp_path):
    """ "Already marked" is decided by the CORRUPT marker, not by the wording of a message:
    a marker whose reason mentions nothing of the kind still keeps the step from being read."""
    from ckptflow.core import drill, marks

    uri = str(tmp_path / "ckpt")
    ck = Checkpointer(uri)
    ck.save(1, {"w": torch.ones(8)})
    ck.save(2, {"w": torch.zeros(8)})
    ck.close()
    st = Storage(uri)
    assert marks.mark_corrupt(st, 2, "operator: bad node", "a person")
    report = drill.verify_newest(st, 2)
    assert report.already_marked == [2] and report.verified == [1] and report.ok


@pytest.mark.parametrize("kind", ["missing", "no checkpoint"])
def test_a_root_with_no_checkpoint_fails_the_drill(tmp_path, caplog, kind):
    """Retention must not look like it ran on a wrong root (issue 33): exit 2, one line."""
    uri = str(tmp_path / "ckpt")
    if kind == "no checkpoint":
        rootreader.ensure_root(Storage(uri))
    rc = drill_step.main(["--ckpt-root", uri, "--newest", "2", "--output-dir", str(tmp_path / "o")])
    assert rc == 2
    assert any("holds no committed checkpoint" in r.getMessage() for r in caplog.records)
