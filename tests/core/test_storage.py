"""`ckptflow.core.storage` receives how to reach S3 (`StorageOptions`); it reads no environment."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import boto3
import pytest

from ckptflow.core import locator
from ckptflow.core.storage import Storage, StorageOptions
from ckptflow.core.storage_errors import StorageError
from ckptflow.core.uris import join_uri

CORE = Path(__file__).resolve().parents[2] / "ckptflow" / "core"


def test_options_become_s3fs_kwargs():
    no_cache = {"use_listings_cache": False}  # a stale listing hid committed objects
    assert StorageOptions().s3_kwargs() == no_cache
    opts = StorageOptions(endpoint_url="http://minio:9000", region="eu-west-1")
    assert opts.s3_kwargs() == {
        **no_cache,
        "client_kwargs": {"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"},
    }
    keyed = StorageOptions(region="us-east-1", credentials=("id", "very-secret"))
    assert keyed.s3_kwargs() == {
        **no_cache,
        "client_kwargs": {"region_name": "us-east-1"},
        "key": "id",
        "secret": "very-secret",
    }
    assert "very-secret" not in repr(keyed)  # options may be logged; keys never are


# The storage module and those it was split into (its errors, its URIs, its filesystems):
# together they read no environment and import nothing else of ckptflow.
STORAGE_MODULES = (
    "storage",
    "storage_clouds",
    "storage_errors",
    "storage_fs",
    "uris",
    "localfs",
    "localio",
    "retry",
)


@pytest.mark.parametrize("name", STORAGE_MODULES)
def test_storage_module_reads_no_environment(name):
    tree = ast.parse((CORE / f"{name}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
        elif isinstance(node, ast.Attribute):
            assert not (
                node.attr in ("environ", "getenv") and getattr(node.value, "id", "") == "os"
            )
    own = {f"ckptflow.core.{m}" for m in STORAGE_MODULES}
    assert not {m for m in imported if m.startswith("ckptflow") and m not in own}


def test_derived_storages_keep_the_options():
    opts = StorageOptions(endpoint_url="http://example.invalid:9000")
    st = Storage("memory://opts/a", options=opts)
    assert st.child("ckpt").options is opts
    assert st.peer("memory://opts/b").options is opts  # an archive or parent root
    assert Storage("memory://opts/c").options == StorageOptions()


def test_archived_and_parent_roots_are_reached_with_the_roots_options():
    opts = StorageOptions(region="eu-west-1")
    st = Storage("memory://opts-locate/hot", options=opts)
    arch = Storage("memory://opts-locate/archive")
    root = json.dumps({"format": "ckptflow-checkpoint-root", "root_id": "h" * 32}).encode()
    commit = json.dumps({"save_id": "ab" * 8, "manifest_xxh3": "0" * 32}).encode()
    for where in (st, arch):  # a redirect is followed only to this root's copy of the step
        where.write("ckptflow-root.json", root)
        where.write("step-00000003/COMMIT", commit)
    st.write("step-00000003/ARCHIVED", b'{"uri": "memory://opts-locate/archive"}')
    located = locator.locate(st, 3)
    assert located.uri == "memory://opts-locate/archive" and located.options is opts
    child = Storage("memory://opts-locate/child", options=opts)
    marker = {"format": "ckptflow-checkpoint-root", "root_id": "c" * 32}
    marker["parent"] = {"uri": "memory://opts-locate/hot", "step": 2, "root_id": "h" * 32}
    child.write("ckptflow-root.json", json.dumps(marker).encode())
    (parent,) = locator.parent_stores(child)
    assert parent.uri == "memory://opts-locate/hot" and parent.options is opts


@pytest.mark.s3
def test_explicit_endpoint_reaches_s3_without_endpoint_variables(moto_server, monkeypatch):
    """The endpoint comes from the options alone (no AWS_ENDPOINT_URL* here)."""
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-key")
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(
        Bucket="options-only"
    )
    opts = StorageOptions(endpoint_url=moto_server, region="us-east-1")
    st = Storage("s3://options-only/run", options=opts)
    st.write("ckpt/x", b"hello")
    assert st.child("ckpt").read("x") == b"hello"


def test_join_uri_is_storage_url_without_a_filesystem():
    for uri in ("/tmp/r", "/tmp/r/", "rel/p", "file:///tmp/r", "memory://a/b", "s3://b/p/"):
        for rel in ("ckpt", "", "a/b", "."):
            assert join_uri(uri, rel) == Storage(uri).url(rel), (uri, rel)


@pytest.mark.parametrize(
    "uri",
    ["s3:/", "s3:", "s3:/bucket/run", "s3:bucket", "S3:/b", "gs:/b/p", "az:/c", "abfs:/c",
     "memory:/x", "file:/tmp/x", "s3://", "s3:///run", "gs://", "az://"],
)  # fmt: skip
def test_a_malformed_uri_with_a_known_scheme_is_refused_not_read_as_a_local_path(uri):
    """`s3:/` was read as a local folder named `s3:` (issue 37): a scheme this module serves
    followed by anything but `://` and a name is refused, naming the form to use."""
    with pytest.raises(StorageError, match="malformed storage URI") as ei:
        Storage(uri)
    assert "://" in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize("path", ["rel/s3:/x", "./s3:", "/tmp/gs:/b", "runs:1", "memoryx:/y"])
def test_local_paths_holding_a_colon_are_still_local(path):
    assert Storage(path).protocol == "file"
