"""Transient storage failures (an endpoint unreachable for a while, throttling) are retried with
backoff until a deadline; anything else fails at once (issue 15 (d): a 30 s S3 outage lost saves).
"""

from __future__ import annotations

import pytest

from ckptflow.core import retry
from ckptflow.core.storage import Storage, StorageOptions
from ckptflow.core.storage_errors import StorageError, classify, transient


class Clock:
    """A fake clock that sleeping advances (no real waiting in tests)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Unreachable(ConnectionError):
    """What botocore raises when nothing listens at the endpoint (by class name)."""


Unreachable.__name__ = "EndpointConnectionError"


def flaky(failures: int, exc: BaseException):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= failures:
            raise exc
        return "ok"

    return fn, calls


def test_a_transient_failure_is_retried_until_it_passes():
    clock = Clock()
    fn, calls = flaky(5, Unreachable("refused"))
    out = retry.call(fn, deadline_s=60, transient=transient, clock=clock, sleep=clock.sleep)
    assert out == "ok" and len(calls) == 6
    assert clock.sleeps == sorted(clock.sleeps) and clock.sleeps[0] > 0  # backing off


def test_an_outage_longer_than_the_deadline_fails_with_the_last_error():
    clock = Clock()
    fn, calls = flaky(10_000, Unreachable("refused"))
    with pytest.raises(ConnectionError):
        retry.call(fn, deadline_s=30, transient=transient, clock=clock, sleep=clock.sleep)
    assert 29 <= clock.now <= 30 and len(calls) > 3  # kept trying for the whole deadline


def test_a_permanent_failure_is_not_retried():
    clock = Clock()
    fn, calls = flaky(1, PermissionError(13, "denied"))
    with pytest.raises(PermissionError):
        retry.call(fn, deadline_s=60, transient=transient, clock=clock, sleep=clock.sleep)
    assert len(calls) == 1 and clock.sleeps == []


def test_transient_kinds_come_from_the_one_table():
    assert transient(Unreachable("x")) and classify(Unreachable("x")) == "unreachable"
    assert not transient(FileNotFoundError(2, "gone"))
    assert not transient(OSError(28, "full"))
    assert transient(StorageError("s3://b: cannot reach", kind="unreachable"))
    assert not transient(StorageError("s3://b: denied", kind="denied"))


class DownFS:
    """An fsspec-like filesystem whose endpoint is down for the first `down` calls."""

    def __init__(self, down: int) -> None:
        self.down, self.calls, self.files = down, 0, {}

    def _gate(self):
        self.calls += 1
        if self.calls <= self.down:
            raise Unreachable("connection refused")

    def cat_file(self, path, start=None, end=None):
        self._gate()
        return self.files[path][start:end]

    def pipe_file(self, path, data, mode="overwrite", chunksize=None):
        self._gate()
        self.files[path] = bytes(data)

    def exists(self, path):
        self._gate()
        return path in self.files


def _s3(fs, seconds: float) -> Storage:
    return Storage("s3://bucket/root", fs=fs, options=StorageOptions(retry_seconds=seconds))


def test_storage_rides_out_an_outage_on_s3(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(retry, "_default_clock", clock)
    monkeypatch.setattr(retry, "_default_sleep", clock.sleep)
    st = _s3(DownFS(down=4), seconds=60)
    st.write("a/b", b"bytes")
    assert st.read("a/b") == b"bytes" and st.exists("a/b")


def test_storage_gives_up_after_its_deadline_naming_the_fix(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(retry, "_default_clock", clock)
    monkeypatch.setattr(retry, "_default_sleep", clock.sleep)
    st = _s3(DownFS(down=10_000), seconds=5)
    with pytest.raises(StorageError, match="cannot reach the storage endpoint") as info:
        st.read("a/b")
    assert info.value.kind == "unreachable" and transient(info.value)
    assert 4 <= clock.now <= 5
