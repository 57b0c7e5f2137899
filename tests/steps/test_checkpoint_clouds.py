"""The engine on gs:// and az://, as test_checkpoint_s3.py runs it on S3: a save that loads
bitwise, large objects uploaded in pieces (GCS resumable chunks, Azure parallel blocks),
credentials never in what is stored, and the dedup check never trusting an overwritten object
(that one on S3 too, the reference: moto runs in this process).

GCS: gcp-storage-emulator behind tests/cloud_proxy.py (which enforces ifGenerationMatch=0, as
GCS does); Azure: azurite. See tests/core/test_storage_clouds.py for the storage guarantees.
"""

from __future__ import annotations

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import layout
from tests.steps import ckpt_helpers as h

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(params=("gs", "az"))
def cloud(request):
    """(root URI, proxy in front of the emulator; None on S3, reached directly)."""
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('s3_bucket')}/runs/r1/ckpt", None
    if request.param == "gs":
        bucket, proxy = request.getfixturevalue("gcs_bucket"), request.getfixturevalue("gcs_env")
    else:
        bucket, proxy = request.getfixturevalue("az_container"), request.getfixturevalue("az_env")
    return f"{request.param}://{bucket}/runs/r1/ckpt", proxy


def test_round_trip(cloud):
    root, _ = cloud
    state = h.make_state()
    ck = Checkpointer(root)
    ck.save(7, state, metadata={"note": "cloud"})
    target = h.zeros_like_state(state)
    assert Checkpointer(root).load(target) == 7
    h.assert_same(state, target)
    assert ck.verify(7)["objects"] > 0
    with pytest.raises(Exception, match="already"):
        Checkpointer(root).save(7, state)  # step 7 is committed: never overwritten


@pytest.mark.slow  # tens of MiB through an emulator: seconds each
def test_large_objects_go_up_in_pieces_and_credentials_stay_out(cloud, monkeypatch):
    root, proxy = cloud
    ck = Checkpointer(root, compress=False)
    w = torch.randn(5 << 20)  # 20 MiB raw: above GCS's 8 MiB upload piece
    proxy.fail()
    ck.save(1, {"w": w})
    if root.startswith("gs://"):
        # a resumable upload, sent in GCS_CHUNK pieces (straight to the emulator's own URL)
        assert any("uploadType=resumable" in r for r in proxy.seen)
    stored = b"".join(ck.storage.read(e.path) for e in ck.storage.walk() if e.size < 1 << 20)
    from tests.conftest import AZURITE_KEY

    for secret in (AZURITE_KEY.encode(), b"AccountKey"):
        assert secret not in stored
    t = {"w": torch.zeros_like(w)}
    ck.load(t)
    assert torch.equal(t["w"], w)


@pytest.mark.slow  # tens of MiB through an emulator: seconds each
def test_azure_blobs_over_64_mib_go_up_as_parallel_blocks(az_container, az_env):
    """azure-storage-blob puts a blob up to 64 MiB in one request; above, blocks (4 MiB) are
    sent AZURE_CONCURRENCY at a time and committed by one block list, which carries the
    `If-None-Match: *` of an exclusive create."""
    from ckptflow import env
    from ckptflow.core.storage import AlreadyExists

    st = env.open_storage(f"az://{az_container}/big")
    blob = bytes(range(256)) * ((65 << 20) // 256)
    st.write("obj", blob, exclusive=True)
    blocks = [r for r in az_env.seen if "comp=block&" in r or r.endswith("comp=block")]
    assert len(blocks) > 8, az_env.seen[:5]
    assert any("comp=blocklist" in r for r in az_env.seen)
    with pytest.raises(AlreadyExists):
        st.write("obj", b"other", exclusive=True)
    assert st.size("obj") == len(blob)


@pytest.mark.parametrize(
    "cloud",
    [
        pytest.param("s3", marks=pytest.mark.s3),  # in this process: runs by default
        # tens of MiB through an emulator: seconds each
        *(pytest.param(p, marks=pytest.mark.slow) for p in ("gs", "az")),
    ],
    indirect=True,
)
def test_dedup_never_references_an_overwritten_object(cloud):
    """The reuse check: (size, ETag or generation) by HEAD, the bytes once per process."""
    root, _ = cloud
    ck = Checkpointer(root)
    state = {"frozen": torch.randn(64, 64), "head": torch.zeros(4)}
    ck.save(1, state)
    state["head"] += 1
    ck.save(2, state)  # verifies and notes the frozen object
    key = ck.manifest(2)["items"]["frozen@0,0"]["parts"][0]["object"]
    rel = layout.object_path(key)
    blob = bytearray(ck.storage.read(rel))
    blob[len(blob) // 2] ^= 0x10
    ck.storage.write(rel, bytes(blob))  # same size, other bytes: a new ETag / generation
    state["head"] += 1
    ck.save(3, state)
    ck.verify(3)
