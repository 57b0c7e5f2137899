"""The training loop's saves with the local tier (steps/lib/tier_loop.py, steps/lib/loop.py,
issue 35), in one process: local steps, drains at steps that are both, a failed drain's normal
durable save."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.checkpoint.results import SaveHandle, SaveStats
from ckptflow.steps.checkpoint.tier import drain as drain_mod
from ckptflow.steps.checkpoint.tier.setup import TierSettings, start_tier
from ckptflow.steps.lib import tier_loop
from ckptflow.steps.lib.loop import CheckpointedLoop, LoopSpec, TrainObjects

from ckptflow.core import health, tier
from tests.steps.training_setup import dinfo, make  # noqa: F401 (a fixture)


def run_loop(tmp_path, dinfo, *, max_steps=6, ckpt_every=3, local_every=2, async_save=True):  # noqa: F811
    ck = Checkpointer(str(tmp_path / "ckpt"))
    settings = TierSettings(local_every=local_every, local_dir=str(tmp_path / "local"))
    parts = start_tier(ck, settings)
    spec = LoopSpec(max_steps=max_steps, ckpt_every=ckpt_every, async_save=async_save)
    loop = CheckpointedLoop(
        spec, TrainObjects(*make(dinfo, total=max_steps)), ck=ck, dinfo=dinfo, tier=parts
    )
    loop.run(0)
    parts.close()
    ck.close()
    return ck, parts, loop


def save_kinds(ck) -> list[tuple]:
    return sorted(
        (e.step, e.save_kind) for e in health.read_events(ck.storage)[0] if e.kind == "save"
    )


def local_steps(tmp_path, ck) -> list[int]:
    return [p.step for p in tier.list_pieces(str(tmp_path / "local"), tier.run_key(ck.root))]


def test_local_steps_and_a_drain_at_a_step_that_is_both(tmp_path, dinfo):  # noqa: F811
    ck, parts, loop = run_loop(tmp_path, dinfo)
    assert ck.committed_steps() == [3, 6]
    assert save_kinds(ck) == [(3, "full"), (6, "")]  # 6: drained, not serialized again
    assert local_steps(tmp_path, ck) == [4, 6]  # keep 2 of 2, 4, 6
    assert len(loop.tiers.local_stalls) == 3
    ck.verify(6)


@pytest.mark.parametrize("async_save", [True, False])
def test_a_failed_drain_is_a_warning_and_the_step_is_saved_the_normal_way(
    tmp_path,
    dinfo,  # noqa: F811
    monkeypatch,
    caplog,
    async_save,
):
    def failing(ck, local, step, local_save=None):
        future = Future()
        future.set_exception(drain_mod.DrainError(f"drain of {step} failed on purpose"))
        return SaveHandle(SaveStats(step=step, kind="drain"), future)

    monkeypatch.setattr(tier_loop, "drain", failing)
    ck, _, loop = run_loop(tmp_path, dinfo, async_save=async_save)
    assert ck.committed_steps() == [3, 6]
    assert save_kinds(ck) == [(3, "full"), (6, "full")]
    assert any("the drain of step 6 failed" in r.getMessage() for r in caplog.records)
    assert not loop.tiers.owed


def test_a_failed_drain_makes_the_next_durable_save_a_normal_one(tmp_path, dinfo, monkeypatch):  # noqa: F811
    calls = []
    real = tier_loop.drain

    def first_fails(ck, local, step, local_save=None):
        calls.append(step)
        if len(calls) > 1:
            return real(ck, local, step, local_save=local_save)
        future = Future()
        future.set_exception(drain_mod.DrainError("on purpose"))
        return SaveHandle(SaveStats(step=step, kind="drain"), future)

    monkeypatch.setattr(tier_loop, "drain", first_fails)
    ck, _, _ = run_loop(tmp_path, dinfo, max_steps=12, ckpt_every=4, local_every=4)
    assert calls == [4, 12]  # 8 was owed: a normal save; 12 drained again
    assert ck.committed_steps() == [8, 12]
    assert save_kinds(ck) == [(8, "full"), (12, "")]


@pytest.mark.parametrize(("ckpt_every", "durable_buffers"), [(4, False), (3, True)])
def test_one_host_copy_when_the_local_tier_takes_every_durable_step(
    tmp_path,
    dinfo,  # noqa: F811
    ckpt_every,
    durable_buffers,
):
    ck, parts, _ = run_loop(tmp_path, dinfo, max_steps=8, ckpt_every=ckpt_every)
    assert parts.local.ck._stager._buffers  # the local tier's snapshot buffers
    assert bool(ck._stager._buffers) is durable_buffers  # 4: every durable step drained
