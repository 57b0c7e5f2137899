"""Calls to MLflow that never raise: retries, cooldown, replay queue, rejected calls (no MLflow
needed: the calls are plain functions that fail on demand)."""

from __future__ import annotations

from ckptflow.steps.lib.mlflow_calls import MlflowCalls


class Rejected(Exception):
    error_code = "INVALID_PARAMETER_VALUE"


class Server:
    """A fake endpoint: records what it received, fails while `down`."""

    def __init__(self):
        self.down, self.got, self.attempts = False, [], 0

    def send(self, item):
        def fn():
            self.attempts += 1
            if self.down:
                raise ConnectionError("refused")
            self.got.append(item)
            return item

        return fn


def calls(**kw) -> tuple[MlflowCalls, list[str]]:
    warned: list[str] = []
    kw = {"retries": 2, "backoff_s": 0.0, "cooldown_s": 0.0, **kw}
    return MlflowCalls(True, warned.append, **kw), warned


def test_a_failed_call_is_retried_queued_and_replayed_in_order():
    srv, (c, warned) = Server(), calls()
    assert c.call("a", srv.send("a")) == "a"
    srv.down = True
    assert c.call("b", srv.send("b")) is None
    assert srv.attempts == 3 and c.pending == 1 and "queued" in warned[-1]
    srv.down = False
    assert c.call("c", srv.send("c")) == "c"
    assert srv.got == ["a", "b", "c"] and c.pending == 0


def test_a_lookup_is_skipped_not_queued():
    srv, (c, warned) = Server(), calls()
    srv.down = True
    assert c.call("find", srv.send("x"), queue=False) is None
    assert c.pending == 0 and "skipped" in warned[-1]


def test_while_down_calls_are_queued_without_trying():
    srv, (c, _) = Server(), calls(cooldown_s=60.0)
    srv.down = True
    c.call("a", srv.send("a"))
    tried = srv.attempts
    c.call("b", srv.send("b"))
    assert srv.attempts == tried and c.pending == 2  # the cooldown spares the server
    srv.down = False
    assert c.flush() and srv.got == ["a", "b"]  # flush ignores the cooldown


def test_a_rejected_call_is_dropped_and_does_not_block_the_queue():
    srv, (c, warned) = Server(), calls()

    def rejected():
        raise Rejected("params are immutable")

    assert c.call("log params", rejected) is None
    assert c.pending == 0 and "rejected" in warned[-1]
    assert c.call("a", srv.send("a")) == "a"


def test_flush_drops_what_still_fails_and_says_so():
    srv, (c, warned) = Server(), calls()
    srv.down = True
    c.call("a", srv.send("a"))
    assert not c.flush()
    assert c.pending == 0 and "dropped" in warned[-1]


def test_disabled_sends_nothing():
    srv = Server()
    c = MlflowCalls(False, print)
    assert c.call("a", srv.send("a")) is None and srv.attempts == 0 and c.pending == 0
