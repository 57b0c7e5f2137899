"""Storage errors are classified by exception type and S3 error code (one table), never by
the text of a message: a path containing "412" or "403" means nothing, a local permission
problem is not an AWS credentials problem, and only a lost exclusive create is "already exists".

S3 cases run against the in-process moto server, whose real errors s3fs translates into OSError
subclasses carrying the botocore ClientError as `__cause__`.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer

from ckptflow.core import layout
from ckptflow.core.storage import AlreadyExists, Storage, StorageError, StorageOptions

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class FailingDisk(Storage):
    """Local storage whose writes of `target` (a suffix) fail with `err` (an OSError naming the
    file, as the OS reports it): what a full disk, an exhausted quota or a permission does."""

    def __init__(self, uri: str, target: str, err: int):
        super().__init__(uri)
        self.target, self.err = target, err

    def _write_local(self, path, data, exclusive, durable=True, atomic=False):
        if path.endswith(self.target):
            raise OSError(self.err, os.strerror(self.err), path)
        return super()._write_local(path, data, exclusive, durable, atomic)


@pytest.fixture
def dated_root(tmp_path) -> str:
    """A root whose path contains 412 and 403 (a date, a job number)."""
    return str(tmp_path / "run-20250412-job403" / "ckpt")


@pytest.mark.parametrize(
    ("err", "expect"),
    [
        (errno.ENOSPC, "no space left on device"),
        (errno.EDQUOT, "disk quota exceeded"),
        (errno.EACCES, "permission denied"),
        (errno.EPERM, "permission denied"),
        (errno.EROFS, "read-only file system"),
        (errno.ENOENT, "no such file or folder"),
    ],
)
def test_a_failing_local_commit_says_what_failed(dated_root, err, expect):
    """The commit of a save fails on the disk: the message names the disk's problem, never
    "committed by another writer" (the path holds 412) nor AWS credentials (it holds 403)."""
    st = FailingDisk(dated_root, layout.COMMIT, err)
    with pytest.raises(StorageError) as info:
        st.write(layout.commit_path(1), b"{}", exclusive=True)
    assert not isinstance(info.value, AlreadyExists)
    text = str(info.value)
    assert expect in text and "another writer" not in text and "AWS" not in text, text
    with pytest.raises(Exception) as info:
        Checkpointer(dated_root, storage=st).save(1, {"w": torch.ones(4)})
    text = str(info.value)
    assert expect in text and "another writer" not in text and "AWS" not in text, text


def test_a_lost_local_exclusive_create_is_already_exists(dated_root):
    st = Storage(dated_root)
    st.write(layout.commit_path(1), b"{}", exclusive=True)
    with pytest.raises(AlreadyExists):
        st.write(layout.commit_path(1), b"{}", exclusive=True)


def test_a_file_where_a_folder_belongs_is_not_already_exists(dated_root):
    """A regular file named like the step folder: the create fails, but nobody else claimed
    the name, so it must not read as "committed by another writer"."""
    st = Storage(dated_root)
    st.write("step-00000001", b"not a folder")
    with pytest.raises(StorageError, match="not a folder") as info:
        st.write(layout.commit_path(1), b"{}", exclusive=True)
    assert not isinstance(info.value, AlreadyExists)


@pytest.mark.s3
def test_s3_412_on_an_exclusive_create_is_already_exists(s3_bucket):
    st = Storage(f"s3://{s3_bucket}/run-20250412/ckpt")
    st.write(layout.commit_path(1), b'{"a": 1}', exclusive=True)
    with pytest.raises(AlreadyExists):
        st.write(layout.commit_path(1), b'{"b": 2}', exclusive=True)
    # the reply of our own create was lost and the retry found our bytes: that is success
    st.write(layout.commit_path(1), b'{"a": 1}', exclusive=True)


@pytest.mark.s3
def test_s3_missing_bucket_is_named_on_every_operation(s3_env):
    st = Storage(f"s3://no-such-bucket-{os.getpid()}/ckpt", options=StorageOptions(s3_env))
    for op in (
        lambda: st.read("x"),
        lambda: st.write("x", b"1"),
        lambda: st.write("x", b"1", exclusive=True),
        lambda: st.mtime("x"),  # GC asks it; a missing bucket is no "absent" file
        st.check_reachable,
    ):
        with pytest.raises(StorageError, match="the bucket does not exist"):
            op()


@pytest.fixture
def s3_auth(s3_bucket, monkeypatch):
    """The in-process server checks credentials (moto's own switch) for this test."""
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    return s3_bucket


@pytest.mark.s3
def test_s3_403_is_a_credentials_problem(s3_auth, s3_env):
    st = Storage(
        f"s3://{s3_auth}/ckpt",
        options=StorageOptions(s3_env, credentials=("AKIAWRONGKEY", "wrong")),
    )
    for op in (
        lambda: st.read("x"),
        lambda: st.write("x", b"1", exclusive=True),
        lambda: st.exists("x"),
        st.check_reachable,
    ):
        with pytest.raises(StorageError, match="access denied") as info:
            op()
        assert "AWS_ACCESS_KEY_ID" in str(info.value)
        assert not isinstance(info.value, AlreadyExists)


def test_s3_first_bytes_of_an_empty_object_are_no_bytes(s3_bucket):
    """A ranged read of an empty object is refused by S3 (416 InvalidRange; s3fs raises a bare
    OSError EINVAL): the first bytes of an empty object are none, not an error of its own
    (an emptied object is a damaged one: its step is corrupt, and loads fall back)."""
    st = Storage(f"s3://{s3_bucket}/empty")
    st.write("obj", b"")
    assert st.read("obj", limit=10) == b""
    assert st.read("obj") == b""
