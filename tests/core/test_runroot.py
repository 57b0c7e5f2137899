"""`ckptflow.core.runroot`: a run root's names, FINISHED, eval records and pins.

Eval records have one writer and one reader; the reader takes any file (wrong types, huge,
deeply nested, not JSON) and answers with a RecordError naming the file and the fix.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid

import pytest

import ckptflow.core.localfs as localfs
from ckptflow.core import runroot
from ckptflow.core.runroot import EvalRecord, RecordError
from ckptflow.core.storage import Storage

# What ckptflow.steps.evaluate and ckptflow.steps.finetune write, field for field and in order.
EVALUATE_OK = {
    "step": 20,
    "status": "ok",
    "metrics": {"val_loss": 1.25, "val_exact_match": 0.5},
    "task": "add",
    "model_id": "m-123",
    "mlflow_run_id": None,
    "uri": "s3://b/run/ckpt/step-00000020",
    "evaluated_at": 1.7e9,
    "seconds": 2.5,
    "evaluator": {"host": "pod-1", "pid": 42},
}
FINETUNE_OK = {
    "step": 20,
    "status": "ok",
    "metrics": {"val_loss": 0.75},
    "task": "rev",
    "base_metrics": {"val_loss": 2.0},
    "model_id": None,
    "mlflow_run_id": "r-1",
    "uri": "/runs/a/ckpt/step-00000020",
    "evaluated_at": 1.7e9,
    "evaluator": "ckptflow.steps.finetune",
}
EVALUATE_FAILED = {
    "step": 20,
    "status": "failed",
    "error": "RuntimeError: out of memory",
    "evaluated_at": 1.7e9,
}


@pytest.fixture
def ckpt():
    return Storage(f"memory://runroot-{uuid.uuid4().hex[:8]}/run/ckpt")


def put(st: Storage, step: int, blob: bytes) -> None:
    st.write(runroot.eval_path(step), blob)


@pytest.mark.parametrize("doc", [EVALUATE_OK, FINETUNE_OK, EVALUATE_FAILED], ids=str)
def test_records_round_trip_as_the_writers_wrote_them(ckpt, doc):
    rec = EvalRecord.from_json(doc, "here", 20)
    assert list(rec.to_json().items()) == list(doc.items())  # same keys, same order, same values
    runroot.write_eval(ckpt, rec)
    assert ckpt.read(runroot.eval_path(20)) == json.dumps(doc, indent=1).encode()
    assert runroot.read_eval(ckpt, 20) == rec
    assert runroot.has_eval(ckpt, 20) and not runroot.has_eval(ckpt, 21)


def test_record_accessors_and_defaults(ckpt):
    ok, failed = (
        EvalRecord.from_json(EVALUATE_OK, "x", 20),
        EvalRecord.from_json(EVALUATE_FAILED, "x", 20),
    )
    assert ok.ok and ok.metric("val_loss") == 1.25 and ok.metric("nope") is None
    assert not failed.ok and failed.metric("val_loss") is None and failed.metrics == {}
    # records written without a status (older or hand-made ones) count as ok
    legacy = EvalRecord.from_json({"step": 3, "metrics": {"acc": 1}}, "x", 3)
    assert legacy.ok and legacy.metrics == {"acc": 1.0}
    # NaN is a result (a diverged model), not a broken file
    put(ckpt, 4, b'{"step": 4, "status": "ok", "metrics": {"val_loss": NaN}}')
    assert math.isnan(runroot.read_eval(ckpt, 4).metrics["val_loss"])
    assert runroot.read_eval(ckpt, 5) is None  # no record


HOSTILE = {
    "not json": b"{not json",
    "not utf-8": b'{"step": 20, "task": "\xff\xfe"}',
    "a list": b"[1, 2, 3]",
    "a string": b'"eval"',
    "other step": b'{"step": 21, "status": "ok", "metrics": {}}',
    "step as text": b'{"step": "20", "metrics": {}}',
    "step as bool": b'{"step": true, "metrics": {}}',
    "no step": b'{"status": "ok", "metrics": {}}',
    "bad status": b'{"step": 20, "status": "great"}',
    "status as list": b'{"step": 20, "status": ["ok"]}',
    "metrics as list": b'{"step": 20, "metrics": [1.0]}',
    "metric as text": b'{"step": 20, "metrics": {"val_loss": "1.5"}}',
    "metric as bool": b'{"step": 20, "metrics": {"acc": true}}',
    "metric as null": b'{"step": 20, "metrics": {"acc": null}}',
    "metric nested": b'{"step": 20, "metrics": {"acc": {"value": 1}}}',
    "metric too large": b'{"step": 20, "metrics": {"acc": 1' + b"0" * 400 + b"}}",
    "huge integer": b'{"step": 20, "seconds": 1' + b"0" * 5000 + b"}",
    "too many metrics": json.dumps(
        {"step": 20, "metrics": {f"m{i}": 1.0 for i in range(runroot.MAX_METRICS + 1)}}
    ).encode(),
    "long metric name": json.dumps({"step": 20, "metrics": {"m" * 300: 1.0}}).encode(),
    "task as number": b'{"step": 20, "task": 7}',
    "long uri": json.dumps({"step": 20, "uri": "u" * (runroot.MAX_TEXT + 1)}).encode(),
    "model id as object": b'{"step": 20, "model_id": {"id": "m"}}',
    "time as text": b'{"step": 20, "evaluated_at": "yesterday"}',
    "evaluator as list": b'{"step": 20, "evaluator": ["me"]}',
    "evaluator nested": b'{"step": 20, "evaluator": {"host": {"name": "x"}}}',
    "base metrics as text": b'{"step": 20, "base_metrics": "good"}',
    "error as list": b'{"step": 20, "status": "failed", "error": ["x"]}',
    "huge": json.dumps({"step": 20, "task": "x" * (runroot.MAX_RECORD + 10)}).encode(),
    "deeply nested": b'{"step": 20, "metrics": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "deeply nested objects": b'{"step": 20, "x": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_eval_files_are_refused_naming_the_file(ckpt, name):
    put(ckpt, 20, HOSTILE[name])
    url = ckpt.url(runroot.eval_path(20))
    with pytest.raises(RecordError) as info:
        runroot.read_eval(ckpt, 20)
    msg = str(info.value)
    assert msg.startswith(url) and "delete it to have step 20 evaluated again" in msg
    assert len(msg) < 600, msg  # one readable line, not the file echoed back


def test_reads_are_bounded(ckpt):
    """A huge eval.json is refused after reading just over the limit, not in full."""
    asked = []

    class Recording(Storage):
        def read(self, rel, limit=None):
            asked.append(limit)
            return super().read(rel, limit=limit)

    st = Recording(ckpt.uri, fs=ckpt.fs)
    put(st, 20, b" " * (3 * runroot.MAX_RECORD))
    with pytest.raises(RecordError, match="larger than"):
        runroot.read_eval(st, 20)
    assert asked == [runroot.MAX_RECORD + 1]


def test_read_evals_skips_and_reports_bad_records(ckpt):
    for step in (1, 2):
        runroot.write_eval(ckpt, EvalRecord(step, metrics={"val_loss": float(step)}))
    put(ckpt, 3, b"[")
    problems: list[str] = []
    evals = runroot.read_evals(ckpt, [1, 2, 3, 4], problems)
    assert sorted(evals) == [1, 2] and evals[2].metric("val_loss") == 2.0
    assert len(problems) == 1 and ckpt.url(runroot.eval_path(3)) in problems[0]
    assert sorted(runroot.read_evals(ckpt, [1, 2, 3])) == [1, 2]  # without a problems list


def test_the_writer_refuses_what_the_reader_would(ckpt):
    with pytest.raises(RecordError):
        runroot.write_eval(ckpt, EvalRecord(1, status="maybe"))
    with pytest.raises(RecordError):
        runroot.write_eval(ckpt, EvalRecord(1, metrics={"acc": "high"}))
    assert not runroot.has_eval(ckpt, 1)


def test_pins(ckpt):
    assert not runroot.pinned(ckpt, 7) and runroot.pin_reason(ckpt, 7) is None
    assert runroot.pin(ckpt, 7, "published v1")
    assert runroot.pinned(ckpt, 7) and runroot.pin_reason(ckpt, 7) == "published v1"
    doc = json.loads(ckpt.read(runroot.pin_path(7)))
    assert set(doc) == {"reason", "pinned_at"}
    assert not runroot.pin(ckpt, 7, "base of fine-tune x", exclusive=True)  # kept the first
    assert runroot.pin_reason(ckpt, 7) == "published v1"
    assert runroot.pin(ckpt, 7, "republished")  # a plain pin replaces the reason
    assert runroot.unpin(ckpt, 7) and not runroot.pinned(ckpt, 7) and not runroot.unpin(ckpt, 7)


@pytest.mark.parametrize(
    "blob",
    [b"not json", b'{"reason": ["x"]}', b"[1]", b"[" * 100_000, b" " * (2 * runroot.MAX_RECORD)],
)
def test_a_damaged_pin_still_pins_without_a_reason(ckpt, blob):
    ckpt.write(runroot.pin_path(3), blob)
    assert runroot.pinned(ckpt, 3) and runroot.pin_reason(ckpt, 3) is None


def test_finished_marker():
    run = Storage(f"memory://runroot-{uuid.uuid4().hex[:8]}/run")
    assert not runroot.finished(run)
    runroot.write_finished(run, {"last_step": 40})
    assert runroot.finished(run) and json.loads(run.read("FINISHED")) == {"last_step": 40}
    runroot.clear_finished(run)
    assert not runroot.finished(run)


def test_names(tmp_path):
    for run in (str(tmp_path / "run"), "s3://bucket/runs/r1/", "memory://m/run"):
        assert runroot.ckpt_uri(run) == Storage(run).url("ckpt")
    assert runroot.ckpt_root(Storage("memory://m/run")).uri == "memory://m/run/ckpt"
    assert runroot.eval_path(20) == "step-00000020/eval.json"
    assert runroot.pin_path(20) == "step-00000020/PIN"
    assert runroot.export_name("a", 8, "bf16") == "a-step-00000008-bf16"


def test_importing_the_names_costs_only_the_standard_library():
    probe = "import sys, ckptflow.core.runroot; print(sorted({'fsspec', 'torch', 'hera'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "blob",
    [
        b"[1]",
        b'{"at": "yesterday"}',
        b'{"at": true}',
        b'{"at": ' + b"9" * 5000 + b"}",
        b'{"at": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"at": NaN}',
        b"\xff",
    ],
)
def test_a_damaged_evaluator_claim_has_no_time(ckpt, blob):
    """An evaluator reads the age of another's claim: a damaged claim is no crash."""
    ckpt.write("step-00000003/eval.claim", blob)
    assert runroot.claim_time(ckpt, "step-00000003/eval.claim") is None
    ckpt.write("step-00000003/eval.claim", b'{"host": "h", "pid": 1, "at": 1700000000.5}')
    assert runroot.claim_time(ckpt, "step-00000003/eval.claim") == 1700000000.5
    assert runroot.claim_time(ckpt, "step-00000004/eval.claim") is None


@pytest.mark.parametrize("what", ["pin", "eval"])
def test_a_killed_writer_never_leaves_a_torn_pin_or_eval_record(tmp_path, monkeypatch, what):
    ckpt = Storage(str(tmp_path / "ckpt"))
    runroot.pin(ckpt, 7, "published v1")
    runroot.write_eval(ckpt, runroot.EvalRecord(7, metrics={"val_loss": 0.5}))
    real = localfs._write_fd
    name = runroot.PIN if what == "pin" else runroot.EVAL

    def killed(path, data, flags, durable):
        if name in os.path.basename(path):
            os.close(os.open(path, flags, 0o644))  # opened (truncated), then killed
            raise KeyboardInterrupt("killed")
        return real(path, data, flags, durable)

    monkeypatch.setattr(localfs, "_write_fd", killed)
    with pytest.raises(KeyboardInterrupt):
        if what == "pin":
            runroot.pin(ckpt, 7, "republished")
        else:
            runroot.write_eval(ckpt, runroot.EvalRecord(7, metrics={"val_loss": 0.4}))
    monkeypatch.setattr(localfs, "_write_fd", real)
    assert runroot.pin_reason(ckpt, 7) == "published v1"  # the old file, whole
    assert runroot.read_eval(ckpt, 7).metrics == {"val_loss": 0.5}
