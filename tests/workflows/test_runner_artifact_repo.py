"""Artifact repositories and archives (workflows/runner/artifact_repo.py): a directory, an S3
bucket through an injected boto3 client (moto, in-process), and safe unpacking."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from ckptflow.workflows.runner import run_workflow
from ckptflow.workflows.runner.artifact_repo import (
    ArtifactError,
    DirRepository,
    S3Repository,
    pack,
    unpack,
)


@pytest.fixture
def s3_client():
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k",
                              aws_secret_access_key="s")  # fmt: skip
        client.create_bucket(Bucket="arts")
        yield client


def test_dir_repository_put_get_keys(tmp_path):
    repo = DirRepository(str(tmp_path / "r"))
    src = tmp_path / "f"
    src.write_text("x")
    repo.put("a/b/f", str(src))
    repo.put("a/b/g", str(src))
    repo.get("a/b/f", str(tmp_path / "back"))
    assert (tmp_path / "back").read_text() == "x"
    assert repo.keys("a/b") == ["a/b/f", "a/b/g"]
    with pytest.raises(ArtifactError, match="no artifact with key 'a/nope'"):
        repo.get("a/nope", str(tmp_path / "x"))


@pytest.mark.parametrize("key", ["../escape", "/abs", "a//b", "a/./b", ""])
def test_keys_that_would_leave_the_repository_are_refused(tmp_path, key):
    with pytest.raises(ArtifactError, match="not a relative object name"):
        DirRepository(str(tmp_path)).put(key, __file__)


def test_s3_repository_through_an_injected_client(tmp_path, s3_client):
    repo = S3Repository(s3_client, "arts", "runs/x")
    src = tmp_path / "f"
    src.write_text("y")
    repo.put("k/f", str(src))
    repo.put("k/g", str(src))
    assert s3_client.head_object(Bucket="arts", Key="runs/x/k/f")["ContentLength"] == 1
    assert repo.keys("k") == ["k/f", "k/g"]
    repo.get("k/g", str(tmp_path / "g"))
    assert (tmp_path / "g").read_text() == "y"
    with pytest.raises(ArtifactError, match="cannot download s3://arts/runs/x/k/missing"):
        repo.get("k/missing", str(tmp_path / "m"))


def test_a_workflow_passes_artifacts_through_s3(tmp_path, s3_client):
    make = {"name": "make", "container": {"command": ["sh", "-c"], "args": ["echo s3 > /tmp/o"]},
            "outputs": {"artifacts": [{"name": "o", "path": "/tmp/o"}]}}  # fmt: skip
    use = {"name": "use", "container": {"command": ["cat", "/tmp/i"]},
           "inputs": {"artifacts": [{"name": "i", "path": "/tmp/i"}]}}  # fmt: skip
    main = {"name": "main", "dag": {"tasks": [{"name": "A", "template": "make"}, {
        "name": "B", "template": "use", "depends": "A",
        "arguments": {"artifacts": [{"name": "i", "from": "{{tasks.A.outputs.artifacts.o}}"}]}}]}}  # fmt: skip
    manifest = {
        "metadata": {"name": "wf"},
        "spec": {"entrypoint": "main", "templates": [main, make, use]},
    }
    result = run_workflow(
        manifest, workdir=str(tmp_path / "w"), name="wf", stream=io.StringIO(),
        artifact_repository=S3Repository(s3_client, "arts"),
    )  # fmt: skip
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result.node("B")["outputs"]["result"] == "s3"
    key = result.node("A")["outputs"]["artifacts"][0]["s3"]["key"]
    assert s3_client.head_object(Bucket="arts", Key=key)
    assert not (tmp_path / "w" / "artifacts").exists()


def test_pack_and_unpack_a_file_and_a_directory(tmp_path):
    (tmp_path / "d" / "s").mkdir(parents=True)
    (tmp_path / "d" / "s" / "f").write_text("1")
    (tmp_path / "one.txt").write_text("2")
    pack(str(tmp_path / "d"), str(tmp_path / "d.tgz"))
    pack(str(tmp_path / "one.txt"), str(tmp_path / "one.tgz"))
    unpack(str(tmp_path / "d.tgz"), str(tmp_path / "out-d"))
    unpack(str(tmp_path / "one.tgz"), str(tmp_path / "out-one"))
    assert (tmp_path / "out-d" / "s" / "f").read_text() == "1"
    assert (tmp_path / "out-one").read_text() == "2"
    (tmp_path / "plain").write_text("not an archive")
    unpack(str(tmp_path / "plain"), str(tmp_path / "out-plain"))
    assert (tmp_path / "out-plain").read_text() == "not an archive"


def test_unpack_refuses_members_that_leave_the_destination(tmp_path):
    bad = tmp_path / "bad.tgz"
    with tarfile.open(bad, "w:gz") as tf:
        data = b"owned"
        info = tarfile.TarInfo("../../escaped")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    (tmp_path / "x").mkdir()
    with pytest.raises(ArtifactError, match="unsafe archive"):
        unpack(str(bad), str(tmp_path / "x" / "dest"))
    assert not Path(tmp_path / "escaped").exists()
