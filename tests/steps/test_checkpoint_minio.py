"""The engine against a real MinIO (`docker compose -f minio-compose.yaml up -d --wait`).

Skipped unless CKPTFLOW_MINIO_ENDPOINT is set (tests/conftest.py says how to bring it up).
"""

from __future__ import annotations

import os
import uuid

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import layout
from ckptflow.core.storage import AlreadyExists, Storage
from tests.steps import ckpt_helpers as h

pytestmark = pytest.mark.minio


@pytest.fixture
def minio_root(monkeypatch):
    endpoint = os.environ["CKPTFLOW_MINIO_ENDPOINT"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", os.environ.get("AWS_ACCESS_KEY_ID", "minioadmin"))
    monkeypatch.setenv(
        "AWS_SECRET_ACCESS_KEY", os.environ.get("AWS_SECRET_ACCESS_KEY", "minioadmin")
    )
    monkeypatch.setenv("AWS_DEFAULT_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    # The compose stack's one-shot job creates the `ckptflow` bucket.
    return f"s3://ckptflow/tests/{uuid.uuid4().hex[:12]}/ckpt"


def test_round_trip_delta_and_verify_on_minio(minio_root):
    ck = Checkpointer(minio_root, full_every=2)
    state = h.make_state()
    ck.save(1, state)
    state["model"]["w"].add_(1e-4)
    ck.save(2, state)
    assert ck.manifest(2)["kind"] == "delta"
    target = h.zeros_like_state(state)
    assert Checkpointer(minio_root).load(target) == 2
    h.assert_same(state, target)
    assert ck.verify(2)["objects"] > 0


def test_commit_marker_is_exclusive_on_minio(minio_root):
    ck = Checkpointer(minio_root)
    ck.save(1, {"x": torch.ones(4)})
    st = Storage(minio_root)
    with pytest.raises(AlreadyExists):
        st.write(layout.commit_path(1), b"{}", exclusive=True)
    t = {"x": torch.zeros(4)}
    assert ck.load(t) == 1 and torch.equal(t["x"], torch.ones(4))
