"""The engine against a real S3 HTTP API (moto's in-process server)."""

from __future__ import annotations

import boto3
import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer, StorageError

from ckptflow.core import layout
from ckptflow.core.storage import AlreadyExists, Storage
from tests.steps import ckpt_helpers as h

pytestmark = pytest.mark.s3


def test_round_trip_on_s3(s3_bucket):
    state = h.make_state()
    ck = Checkpointer(f"s3://{s3_bucket}/runs/r1/ckpt")
    ck.save(7, state, metadata={"note": "s3"})
    target = h.zeros_like_state(state)
    assert Checkpointer(f"s3://{s3_bucket}/runs/r1/ckpt").load(target) == 7
    h.assert_same(state, target)
    assert ck.verify(7)["objects"] > 0


def test_large_objects_use_multipart_and_credentials_stay_out(s3_bucket, s3_env):
    ck = Checkpointer(f"s3://{s3_bucket}/ckpt", compress=False)
    w = torch.randn(5 << 20)  # 20 MiB raw: above 2 x the multipart chunk
    ck.save(1, {"w": w})
    key = ck.manifest(1)["items"]["w@0"]["parts"][0]["object"]
    s3 = boto3.client("s3", endpoint_url=s3_env)
    etag = s3.head_object(Bucket=s3_bucket, Key=f"ckpt/{layout.object_path(key)}")["ETag"]
    assert "-" in etag, "a multipart upload has an ETag of the form <md5>-<parts>"
    for obj in s3.list_objects_v2(Bucket=s3_bucket, Prefix="ckpt/step-")["Contents"]:
        body = s3.get_object(Bucket=s3_bucket, Key=obj["Key"])["Body"].read()
        assert b"testing-secret-key" not in body and b"testing-key-id" not in body
    t = {"w": torch.zeros_like(w)}
    ck.load(t)
    assert torch.equal(t["w"], w)


def test_commit_marker_is_exclusive_on_s3(s3_bucket):
    st = Storage(f"s3://{s3_bucket}/x")
    st.write("COMMIT", b"first", exclusive=True)
    with pytest.raises(AlreadyExists):
        st.write("COMMIT", b"second", exclusive=True)
    assert st.read("COMMIT") == b"first"


def test_missing_bucket_names_the_fix(s3_env):
    with pytest.raises(StorageError, match="bucket does not exist"):
        Checkpointer("s3://no-such-bucket-ckptflow/ckpt").save(1, {"x": torch.ones(2)})
