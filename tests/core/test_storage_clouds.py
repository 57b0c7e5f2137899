"""`gs://` (gcsfs) and `az://` (adlfs) keep S3's guarantees: every storage operation, a commit
claimed by one writer only (two racing commits: exactly one wins), a lost reply of our own
create read as success, transient errors retried by the library, a missing bucket or a wrong
key named with its fix, and a store that ignores conditional creates refused.

GCS runs against gcp-storage-emulator (in this process), which ignores `ifGenerationMatch`:
the tests reach it through tests/cloud_proxy.py, which enforces `ifGenerationMatch=0` the way
GCS does, and one test reaches it directly to show that ckptflow then refuses to commit. Azure
runs against azurite (npm), which honours `If-None-Match: *` itself. S3 (moto) is in the
parametrization where it costs nothing, as the reference.
"""

from __future__ import annotations

import threading

import pytest

from ckptflow.core import layout
from ckptflow.core.storage import AlreadyExists, Storage, StorageError, StorageOptions
from ckptflow.core.storage_errors import classify, precondition_failed, translated
from tests.cloud_proxy import Fault

STORES = ("gs", "az")


@pytest.fixture(params=STORES)
def cloud(request):
    """(protocol, bucket or container, proxy in front of the emulator)."""
    if request.param == "gs":
        return "gs", request.getfixturevalue("gcs_bucket"), request.getfixturevalue("gcs_env")
    return "az", request.getfixturevalue("az_container"), request.getfixturevalue("az_env")


def _root(cloud, prefix="run-20250412-job403/ckpt") -> Storage:
    from ckptflow import env

    protocol, bucket, _ = cloud
    return env.open_storage(f"{protocol}://{bucket}/{prefix}")


def quick_retry_azure(conn_str: str):
    """adlfs with azure-storage-blob's retry policy at short backoffs (its default waits ~15 s
    before the first retry, too long for a default test): the same policy class, injected."""
    from adlfs import AzureBlobFileSystem
    from azure.storage.blob.aio import BlobServiceClient

    class QuickRetry(AzureBlobFileSystem):
        def do_connect(self):
            self.service_client = BlobServiceClient.from_connection_string(
                self.connection_string,
                initial_backoff=0.1,
                increment_base=1.5,
                random_jitter_range=0.05,
                retry_total=3,
            )

    return QuickRetry(
        connection_string=conn_str, skip_instance_cache=True, use_listings_cache=False
    )


@pytest.mark.parametrize("tail", [b"\r", b"\r\n", b"\n"])
def test_bytes_that_end_like_a_line_break_round_trip(cloud, tail):
    """Objects end in any byte (a pack whose last part ends in `\r`: one in 256): the GCS
    emulator's upload parser dropped such a `\r` (fixed in tests/conftest.py), GCS keeps it."""
    st = _root(cloud)
    blob = bytes(range(256)) + tail
    st.write("obj", blob)
    assert st.size("obj") == len(blob) and st.read("obj") == blob


def test_every_operation(cloud):
    st = _root(cloud)
    st.write("step-00000001/a.bin", b"hello")
    st.write("step-00000001/b/c.bin", [b"wor", memoryview(b"ld")])
    assert st.read("step-00000001/a.bin") == b"hello"
    assert st.read("step-00000001/a.bin", limit=2) == b"he"
    assert st.exists("step-00000001/a.bin") and not st.exists("step-00000001/zz")
    assert st.is_file("step-00000001/a.bin") and not st.is_file("step-00000001")
    assert st.size("step-00000001/b/c.bin") == 5
    assert st.listdir() == ["step-00000001"]
    assert st.listdir("step-00000001") == ["a.bin", "b"]
    assert st.listdir("nothing-here") == []
    assert [(e.path, e.size) for e in st.walk()] == [
        ("step-00000001/a.bin", 5),
        ("step-00000001/b/c.bin", 5),
    ]
    assert all(e.mtime > 1.6e9 for e in st.walk())  # the store's clock, never 0 (GC compares)
    before = st.fingerprint("step-00000001/a.bin")
    assert before is not None
    st.write("step-00000001/a.bin", b"HELLO")  # same size, other bytes
    assert st.fingerprint("step-00000001/a.bin") != before
    st.touch("step-00000001/a.bin", b"HELLO")
    st.delete(["step-00000001/a.bin", "step-00000001/never-was"])
    assert not st.exists("step-00000001/a.bin")
    with pytest.raises(FileNotFoundError):
        st.read("step-00000001/a.bin")
    assert st.child("step-00000001").read("b/c.bin") == b"world"
    st.check_reachable()


def test_a_commit_is_claimed_once(cloud):
    st = _root(cloud)
    st.write(layout.commit_path(1), b'{"a": 1}', exclusive=True)
    with pytest.raises(AlreadyExists):
        st.write(layout.commit_path(1), b'{"b": 2}', exclusive=True)
    assert st.read(layout.commit_path(1)) == b'{"a": 1}'
    # the reply of our own create was lost and the retry found our bytes: that is success
    st.write(layout.commit_path(1), b'{"a": 1}', exclusive=True)
    assert st.listdir("step-00000001") == ["COMMIT"]  # the probe of the check left nothing


@pytest.mark.parametrize("protocol", ("s3", *STORES))
def test_two_racing_commits_exactly_one_wins(protocol, request):
    if protocol == "s3":
        root = f"s3://{request.getfixturevalue('s3_bucket')}/race"
    else:
        root = f"{protocol}://{request.getfixturevalue('gcs_bucket' if protocol == 'gs' else 'az_container')}/race"
    from ckptflow import env

    writers = [env.open_storage(root) for _ in range(2)]
    for i, w in enumerate(writers):  # the store's check is done: the creates themselves race
        w.write(f"warm-{i}", b"", exclusive=True)
    start, results = threading.Barrier(len(writers)), {}

    def commit(i: int) -> None:
        start.wait()
        try:
            writers[i].write(layout.commit_path(5), f"writer-{i}".encode(), exclusive=True)
            results[i] = "won"
        except AlreadyExists:
            results[i] = "lost"

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results.values()) == ["lost", "won"], results
    (winner,) = [i for i, r in results.items() if r == "won"]
    assert writers[1].read(layout.commit_path(5)) == f"writer-{winner}".encode()


@pytest.mark.slow  # the library's backoff before its retry
def test_a_lost_reply_of_the_stores_check_is_not_a_lost_commit(cloud):
    """The first create of the check's probe lands but its reply is lost: still no
    "already exists" for the commit."""
    protocol, bucket, proxy = cloud
    st = Storage(_root(cloud).uri, fs=_fresh_fs(protocol, proxy))
    upload = ("POST", "uploadType=multipart") if protocol == "gs" else ("PUT", ".tmp")
    proxy.fail(Fault(*upload, count=1, after_forward=True))
    st.write(layout.commit_path(4), b'{"save_id": "mine"}', exclusive=True)
    assert proxy.failed, "the fault was not hit"
    assert st.read(layout.commit_path(4)) == b'{"save_id": "mine"}'


def _fresh_fs(protocol: str, proxy):
    """A filesystem of its own (not fsspec's shared one), so the store's check runs again."""
    if protocol == "az":
        return quick_retry_azure(_conn_str(proxy))
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem(endpoint_url=proxy.url, token="anon", skip_instance_cache=True)


def test_a_gcs_endpoint_that_ignores_preconditions_is_refused(gcs_emulator, gcs_bucket):
    """gcp-storage-emulator itself overwrites on `ifGenerationMatch=0`: ckptflow must not
    commit there (two writers would both win), and says why."""
    st = Storage(f"gs://{gcs_bucket}/raw", options=StorageOptions(gcs_endpoint=gcs_emulator))
    st.write("step-00000001/data", b"plain writes work")
    with pytest.raises(StorageError, match="ignores conditional creates") as info:
        st.write(layout.commit_path(1), b"{}", exclusive=True)
    assert not isinstance(info.value, AlreadyExists)
    assert st.listdir("step-00000001") == ["data"]  # no COMMIT, no probe left


def test_transient_errors_are_retried(cloud):
    protocol, bucket, proxy = cloud
    st = _root(cloud)
    if protocol == "az":
        st = Storage(st.uri, fs=quick_retry_azure(_conn_str(proxy)))
    # a GCS upload this small names its object in the body of one multipart POST
    upload = ("POST", "uploadType=multipart") if protocol == "gs" else ("PUT", "/data.bin")
    proxy.fail(Fault(*upload, count=1), Fault("GET", "data.bin", count=1))
    st.write("step-00000002/data.bin", b"x" * 1000)
    assert st.read("step-00000002/data.bin") == b"x" * 1000
    assert len(proxy.failed) == 2, proxy.failed


def test_a_lost_reply_of_our_own_commit_is_success(cloud):
    """The store created the marker but its reply was lost (503 after the work): the library
    retries, the retry finds the name taken, and the bytes there are ours."""
    protocol, bucket, proxy = cloud
    st = _root(cloud)
    if protocol == "az":
        st = Storage(st.uri, fs=quick_retry_azure(_conn_str(proxy)))
    st.write("warm", b"", exclusive=True)  # the store's check is done before the fault
    upload = ("POST", "uploadType=multipart") if protocol == "gs" else ("PUT", "COMMIT")
    proxy.fail(Fault(*upload, count=1, after_forward=True))
    st.write(layout.commit_path(3), b'{"save_id": "mine"}', exclusive=True)
    assert proxy.failed, "the fault was not hit"
    with pytest.raises(AlreadyExists):
        _root(cloud).write(layout.commit_path(3), b'{"save_id": "theirs"}', exclusive=True)


def _conn_str(proxy) -> str:
    from tests.conftest import azurite_connection_string

    return azurite_connection_string(proxy.url)


def test_a_missing_bucket_is_named_on_every_operation(cloud):
    protocol, _, _ = cloud
    st = _root((protocol, "no-such-bucket-ckptflow", None))
    word = "bucket" if protocol == "gs" else "container"
    for op in (
        lambda: st.read("x"),
        lambda: st.write("x", b"1"),
        lambda: st.write("x", b"1", exclusive=True),
        lambda: st.listdir(),
        lambda: st.mtime("x"),  # GC asks it; a missing bucket is no "absent" file
        st.check_reachable,
    ):
        with pytest.raises(StorageError, match=f"the {word} does not exist") as info:
            op()
        assert not isinstance(info.value, AlreadyExists)


def test_a_wrong_azure_key_is_a_credentials_problem(az_env, az_container):
    from adlfs import AzureBlobFileSystem

    from tests.conftest import azurite_connection_string

    wrong = azurite_connection_string(az_env.url, key="d3Jvbmc=")
    fs = AzureBlobFileSystem(connection_string=wrong, skip_instance_cache=True)
    st = Storage(f"az://{az_container}/run-20250412/ckpt", fs=fs)
    for op in (
        lambda: st.read("x"),
        lambda: st.write("x", b"1"),
        lambda: st.write(layout.commit_path(1), b"1", exclusive=True),
        st.check_reachable,
    ):
        with pytest.raises(StorageError, match="access denied") as info:
            op()
        assert "AZURE_STORAGE_CONNECTION_STRING" in str(info.value)
        assert not isinstance(info.value, AlreadyExists)
        assert "d3Jvbmc=" not in str(info.value)


# -- the table, on the libraries' own exception types (no server) ---------------------------------
def test_gcs_and_azure_errors_are_classified_by_type_and_code():
    from azure.core.exceptions import HttpResponseError, ResourceExistsError
    from gcsfs.retry import HttpError
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    assert classify(HttpError({"code": 401, "message": "path has 412 in it"})) == "gcs-denied"
    assert classify(HttpError({"code": 503, "message": "x"})) == "gcs-throttled"
    assert classify(HttpError({"code": 412, "message": "403"})) is None
    assert precondition_failed(HttpError({"code": 412, "message": "x"}))
    assert not precondition_failed(HttpError({"code": 403, "message": "412"}))
    assert classify(DefaultCredentialsError("x")) == "gcs-no-credentials"
    assert classify(RefreshError("x")) == "gcs-denied"

    def azure(cls, code, status=None):
        exc = cls(message="run-20250412-job403")
        exc.error_code, exc.status_code = code, status
        return exc

    assert classify(azure(HttpResponseError, "AuthenticationFailed", 403)) == "az-denied"
    assert classify(azure(HttpResponseError, "SomethingNew", 403)) == "az-denied"
    assert classify(azure(HttpResponseError, "ServerBusy", 503)) == "az-throttled"
    assert classify(azure(HttpResponseError, "ContainerNotFound", 404)) == "az-no-container"
    assert classify(azure(HttpResponseError, "BlobNotFound", 404)) is None
    try:  # adlfs raises FileExistsError while handling ResourceExistsError
        try:
            raise azure(ResourceExistsError, "BlobAlreadyExists", 409)
        except ResourceExistsError:
            raise FileExistsError("c/COMMIT") from None
    except FileExistsError as exc:
        assert precondition_failed(exc)
    # a message that happens to contain a code means nothing
    assert not precondition_failed(OSError("412 Precondition Failed"))
    assert classify(OSError("403 AuthorizationFailure")) is None


def test_translated_passes_an_absent_file_and_names_a_missing_container():
    """The one absent-or-translate idiom: "no such blob" stays a FileNotFoundError, "no such
    container" (adlfs raises FileNotFoundError for both) and other fixable errors become a
    StorageError naming the URL, and an error the user cannot fix passes as itself."""
    import errno

    from azure.core.exceptions import HttpResponseError

    def not_found(code):
        try:  # adlfs raises FileNotFoundError while handling the service's 404
            exc = HttpResponseError(message="run-20250412-job403")
            exc.error_code, exc.status_code = code, 404
            raise exc
        except HttpResponseError:
            raise FileNotFoundError("c/ckpt/x") from None

    url = "az://c/ckpt/x"
    with pytest.raises(FileNotFoundError) as info, translated(url):
        not_found("BlobNotFound")
    assert not isinstance(info.value, StorageError)
    with pytest.raises(StorageError, match="container does not exist") as info, translated(url):
        not_found("ContainerNotFound")
    assert info.value.kind == "az-no-container" and str(info.value).startswith(url)
    with pytest.raises(StorageError, match="no space left") as info, translated(url):
        raise OSError(errno.ENOSPC, "full")
    assert str(info.value).startswith(url)
    with pytest.raises(ValueError, match="other"), translated(url):
        raise ValueError("other")


def test_an_error_translate_leaves_as_it_is_keeps_its_own_cause():
    """translate() hands back errors it does not classify; raised "from" themselves, their
    real cause (the backend's own error) was lost."""
    from ckptflow.core.storage_errors import translated

    inner = KeyError("backend detail")
    with pytest.raises(ValueError) as info, translated("memory://r/x"):
        try:
            raise inner
        except KeyError as exc:
            raise ValueError("unclassified") from exc
    assert info.value.__cause__ is inner
