"""A step's kept stdout (`outputs.result`) is bounded in bytes whatever its newlines (#37 point
8): one long line was read whole by readline (150 MiB printed: 477 MiB of runner memory and a
157 MB status.json). The log still gets every byte."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from ckptflow.workflows.runner import run_workflow
from ckptflow.workflows.runner.pods import available
from ckptflow.workflows.runner.process import PUMP_CHUNK, RESULT_LIMIT, Proc, pump

WHY = available()
ISOLATE = [False, pytest.param(True, marks=pytest.mark.skipif(WHY is not None, reason=str(WHY)))]
BIG = 3 * RESULT_LIMIT  # one line, no newline until the very end


def test_one_long_line_is_kept_up_to_the_limit_and_logged_whole(tmp_path):
    script = f"import sys; sys.stdout.write('x' * {BIG}); sys.stdout.write('\\nend\\n')"
    proc = Proc(["python3", "-c", script], dict(os.environ), str(tmp_path), str(tmp_path / "log"))
    proc.popen.wait()
    text = proc.finish()
    assert len(proc.stdout) == RESULT_LIMIT and text == "x" * RESULT_LIMIT
    assert (tmp_path / "log").stat().st_size == BIG + len("\nend\n")


def test_the_pump_never_holds_more_than_a_chunk():
    class Log:
        largest = 0

        def write(self, data):
            Log.largest = max(Log.largest, len(data))

    kept = bytearray()
    stream = io.BufferedReader(io.BytesIO(b"y" * BIG))  # readline() would return it all
    pump(stream, Log().write, kept, threading.Lock())
    assert Log.largest <= PUMP_CHUNK and len(kept) == RESULT_LIMIT


@pytest.mark.parametrize("isolate", ISOLATE)
def test_status_json_stays_small_after_one_long_line(tmp_path, isolate):
    wf = {
        "metadata": {"name": "long"},
        "spec": {"entrypoint": "t", "templates": [{"name": "t", "container": {
            "command": ["python3", "-c", f"print('z' * {BIG}, end='')"]}}]},
    }  # fmt: skip
    # a pod's own /tmp hides a WORKDIR under /tmp (where pytest's tmp_path is)
    base = Path(tempfile.mkdtemp(dir="/var/tmp")) if isolate else tmp_path
    try:
        result = run_workflow(
            wf, workdir=str(base / "w"), name="long", stream=io.StringIO(), isolate=isolate
        )
        check(result)
    finally:
        if isolate:
            shutil.rmtree(base, ignore_errors=True)


def check(result) -> None:
    assert result.phase == "Succeeded", result.table
    assert len(result.node("long")["outputs"]["result"]) == RESULT_LIMIT
    assert Path(result.status_file).stat().st_size < 2 * RESULT_LIMIT
    status = json.loads(Path(result.status_file).read_text())
    assert status["status"]["phase"] == "Succeeded"
    assert Path(result.node("long")["local"]["logFile"]).stat().st_size == BIG
