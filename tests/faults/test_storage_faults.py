"""Storage faults: transient S3 errors are retried and lose nothing; permanent ones fail fast
with a clear message; a full local disk is a clear error and never a commit.

Transient faults are injected by `FaultProxy`, a real HTTP proxy between s3fs/botocore and the
moto server: the client sees exactly what a struggling object store sends.
"""

from __future__ import annotations

import contextlib
import subprocess
import time

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, StorageError

from ckptflow.core import layout
from ckptflow.core.storage import Storage
from tests.faults.proxy import FaultProxy
from tests.steps import ckpt_helpers as h


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(64, 64, generator=g),
        "b": torch.randn(128, generator=g),
        "step": seed,
        "pos": {"offset": 17 + seed},
    }


@pytest.fixture
def proxy(s3_bucket, moto_server, monkeypatch):
    """A FaultProxy in front of moto, with the client's endpoint pointed at it."""
    px = FaultProxy(moto_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL", px.url)
    yield px
    px.close()


def _retried(px: FaultProxy, action: str) -> list[float]:
    """For each injected fault, seconds until the same request went through (backoff)."""
    gaps = []
    for t0, method, path, _ in px.injected(action):
        later = [t for t, m, p, a in px.log if (m, p, a) == (method, path, "forward") and t > t0]
        assert later, f"{method} {path} was never retried after the injected {action}"
        gaps.append(min(later) - t0)
    return gaps


TRANSIENT = {
    "500": "HTTP 500 InternalError",
    "503": "HTTP 503 SlowDown (throttling), three times in a row on one request",
    "reset": "connection reset before the response",
    "lost": "request applied, response lost (connection reset after forwarding)",
    "slow": "slow response (1 s before forwarding)",
}


# Three run by default; the throttling storm and the slow response (seconds of waiting)
# run with -m slow.
_ACTIONS = [
    pytest.param(a, marks=pytest.mark.slow) if a in ("503", "slow") else a for a in TRANSIENT
]


@pytest.mark.s3
@pytest.mark.parametrize("action", _ACTIONS)
def test_transient_s3_faults_are_retried_and_lose_nothing(proxy, s3_bucket, action, fault):
    root = f"s3://{s3_bucket}/ckpt"
    repeat = 3 if action == "503" else 1
    # on object writes, the manifest, the commit marker (an exclusive create) and object reads
    proxy.add(action, method="PUT", path=r"/objects/", times=2 * repeat, delay=1.0)
    proxy.add(action, method="PUT", path=r"/manifest-", times=repeat, delay=1.0)
    proxy.add(action, method="PUT", path=r"/COMMIT", times=repeat, delay=1.0)
    proxy.add(action, method="GET", path=r"/objects/", times=repeat, delay=1.0)
    state = _state()
    Checkpointer(root, threads=2).save(1, state)
    target = h.zeros_like_state(state)
    ck = Checkpointer(root)
    assert ck.load(target) == 1
    h.assert_same(state, target)
    assert all(r.times == 0 for r in proxy.rules), "every injected fault was hit"
    gaps = _retried(proxy, action) if action != "slow" else []
    proxy.clear()
    ck.verify(1)
    assert ck.committed_steps() == [1]
    assert set(h.object_files(ck.storage)) == {layout.object_path(k) for k in ck.needs(1)}
    n = len(proxy.injected(action))
    detail = f"{n} faults injected; all retried" + (
        f", first retry after {min(gaps):.2f}-{max(gaps):.2f} s" if gaps else ""
    )
    fault("storage", f"S3: {TRANSIENT[action]}", cases=n, detail=detail)


@pytest.mark.s3
def test_access_denied_fails_fast_with_a_clear_message(proxy, s3_bucket, fault):
    root = f"s3://{s3_bucket}/ckpt"
    proxy.add("403", times=None)
    t0 = time.monotonic()
    with pytest.raises(StorageError, match="access denied; check AWS_ACCESS_KEY_ID") as ei:
        Checkpointer(root).save(1, _state())
    assert "{" not in str(ei.value), "the message is fully formatted"
    with pytest.raises(StorageError, match="access denied"):
        Checkpointer(root).load(h.zeros_like_state(_state()))
    elapsed = time.monotonic() - t0
    requests = len(proxy.log)
    assert requests <= 4, f"a permanent error is not retried ({requests} requests)"
    proxy.clear()
    assert Checkpointer(root).committed_steps() == []
    fault(
        "storage",
        "S3: permanent 403 AccessDenied on every request",
        cases=2,
        detail=f"save and load fail in {elapsed:.2f} s after {requests} requests",
    )


@pytest.mark.s3
def test_missing_bucket_fails_fast_on_save_and_load(s3_env, fault):
    root = "s3://no-such-bucket-ckptflow/run/ckpt"
    t0 = time.monotonic()
    with pytest.raises(StorageError, match="bucket does not exist; create it first"):
        Checkpointer(root).save(1, _state())
    with pytest.raises(StorageError, match="bucket does not exist"):
        Checkpointer(root).load(h.zeros_like_state(_state()))
    elapsed = time.monotonic() - t0
    fault(
        "storage",
        "S3: missing bucket (save and load)",
        cases=2,
        detail=f"both fail in {elapsed:.2f} s naming `aws s3 mb`",
    )


@pytest.mark.s3
def test_bucket_vanishing_mid_save_is_an_error_and_no_commit(proxy, s3_bucket, fault):
    root = f"s3://{s3_bucket}/ckpt"
    Checkpointer(root, threads=2).save(1, _state(1))
    proxy.add("nobucket", method="PUT", path=r"/objects/", times=None)
    with pytest.raises(StorageError, match="bucket does not exist"):
        Checkpointer(root, threads=2).save(2, _state(2))
    proxy.clear()
    ck = Checkpointer(root)
    assert ck.committed_steps() == [1]
    target = h.zeros_like_state(_state(1))
    assert ck.load(target) == 1
    h.assert_same(_state(1), target)
    fault(
        "storage",
        "S3: NoSuchBucket on data writes in the middle of a save",
        detail="clear error, no commit, previous step loads",
    )


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MiB tmpfs mounted for the test (skipped where mounting is not permitted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
            check=True,
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN): {exc}")
    yield mnt
    with contextlib.suppress(Exception):
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=20)


@pytest.mark.parametrize("block", [True, False], ids=["sync", "async"])
def test_full_local_disk_is_a_clear_error_and_no_commit(tiny_disk, block, fault):
    root = str(tiny_disk / "ckpt")
    small = {"w": torch.randn(32, 32), "step": 1}
    Checkpointer(root).save(1, small)
    g = torch.Generator().manual_seed(0)
    big = {"noise": torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=g), "step": 2}
    ck = Checkpointer(root, threads=2)
    with pytest.raises(StorageError, match="no space left on device; free space"):
        ck.save(2, big, block=block).wait()
    ck2 = Checkpointer(root)
    assert ck2.committed_steps() == [1] and ck2.latest() == 1
    target = {"w": torch.zeros(32, 32), "step": None}
    assert ck2.load(target) == 1 and torch.equal(target["w"], small["w"])
    assert not Storage(root).exists(layout.commit_path(2))
    fault(
        "storage",
        f"local disk full (2 MiB tmpfs) during a {'blocking' if block else 'background'} save",
        detail="clear error, no commit, previous step loads",
    )
