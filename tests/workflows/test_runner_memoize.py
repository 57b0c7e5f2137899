"""Memoization with the local cache (workflows/runner/memo.py): Argo's rules
(workflow/controller/operator.go, workflow/controller/cache/) on small manifests."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner import memo as memos


def _wf(key: str = "k-{{inputs.parameters.x}}", max_age: str | None = None, **extra) -> dict:
    memoize = {"key": key, "cache": {"configMap": {"name": "my-cache"}}}
    if max_age is not None:
        memoize["maxAge"] = max_age
    return {
        "metadata": {"name": "memo"},
        "spec": {
            "entrypoint": "main",
            "arguments": {"parameters": [{"name": "x", "value": "1"}]},
            "templates": [
                {
                    "name": "main",
                    "steps": [
                        [
                            {
                                "name": "work",
                                "template": "work",
                                "arguments": {
                                    "parameters": [
                                        {"name": "x", "value": "{{workflow.parameters.x}}"}
                                    ]
                                },
                            }
                        ],
                        [
                            {
                                "name": "use",
                                "template": "echo",
                                "arguments": {
                                    "parameters": [
                                        {"name": "m", "value": "{{steps.work.outputs.result}}"}
                                    ]
                                },
                            }
                        ],
                    ],
                },
                {
                    "name": "work",
                    "inputs": {"parameters": [{"name": "x"}]},
                    "memoize": memoize,
                    # counts its real runs in a file beside the cache: a hit does not run it
                    "script": {
                        "command": ["sh"],
                        "source": 'echo ran >> "$RUNS_FILE"; echo out-{{inputs.parameters.x}}',
                    },
                    **extra,
                },
                {
                    "name": "echo",
                    "inputs": {"parameters": [{"name": "m"}]},
                    "container": {"command": ["echo", "{{inputs.parameters.m}}"]},
                },
            ],
        },
    }


def _run(wf: dict, tmp_path: Path, n: int, **kw):
    env = {"PATH": "/usr/bin:/bin", "RUNS_FILE": str(tmp_path / "runs.txt")}
    return run_workflow(
        wf, workdir=str(tmp_path / f"w{n}"), stream=io.StringIO(), env=env,
        memo_cache=str(tmp_path / "cache"), **kw,
    )  # fmt: skip


def _runs(tmp_path: Path) -> int:
    f = tmp_path / "runs.txt"
    return len(f.read_text().splitlines()) if f.exists() else 0


def test_second_run_hits_the_cache_and_skips_the_template(tmp_path):
    first = _run(_wf(), tmp_path, 1)
    assert first.phase == "Succeeded"
    assert first.node("work")["memoizationStatus"] == {
        "hit": False, "key": "k-1", "cacheName": "my-cache",
    }  # fmt: skip
    entry = json.loads((tmp_path / "cache" / "default" / "my-cache" / "k-1.json").read_text())
    assert entry["nodeID"] == first.node("work")["id"]
    assert entry["outputs"]["result"] == "out-1"
    second = _run(_wf(), tmp_path, 2)
    assert second.phase == "Succeeded"
    work = second.node("work")
    assert work["memoizationStatus"]["hit"] is True
    assert work["type"] == "Pod" and work["outputs"]["result"] == "out-1"
    assert second.node("use")["outputs"]["result"] == "out-1"  # the cached output flows on
    assert _runs(tmp_path) == 1


def test_a_different_key_misses(tmp_path):
    _run(_wf(), tmp_path, 1)
    other = _run(_wf(), tmp_path, 2, arguments={"x": "2"})
    assert other.node("work")["memoizationStatus"] == {
        "hit": False, "key": "k-2", "cacheName": "my-cache",
    }  # fmt: skip
    assert _runs(tmp_path) == 2


def test_an_entry_older_than_max_age_misses(tmp_path):
    _run(_wf(max_age="10s"), tmp_path, 1)
    path = tmp_path / "cache" / "default" / "my-cache" / "k-1.json"
    entry = json.loads(path.read_text())
    entry["creationTimestamp"] = "2020-01-01T00:00:00Z"
    path.write_text(json.dumps(entry))
    again = _run(_wf(max_age="10s"), tmp_path, 2)
    assert again.node("work")["memoizationStatus"]["hit"] is False
    assert _runs(tmp_path) == 2
    assert json.loads(path.read_text())["nodeID"] == again.node("work")["id"]  # saved anew


def test_a_failed_node_is_not_cached(tmp_path):
    wf = _wf()
    wf["spec"]["templates"][1]["script"]["source"] = 'echo ran >> "$RUNS_FILE"; exit 3'
    assert _run(wf, tmp_path, 1).phase == "Failed"
    assert not (tmp_path / "cache" / "default" / "my-cache" / "k-1.json").exists()


def test_an_invalid_key_is_the_nodes_error(tmp_path):
    result = _run(_wf(key="bad key {{inputs.parameters.x}}"), tmp_path, 1)
    assert result.phase == "Error" or result.phase == "Failed"
    assert result.node("work")["phase"] == "Error"
    assert result.node("work")["message"] == "invalid cache key: bad key 1"
    assert _runs(tmp_path) == 0


def test_a_damaged_entry_is_the_nodes_error_naming_the_file(tmp_path):
    path = tmp_path / "cache" / "default" / "my-cache" / "k-1.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    result = _run(_wf(), tmp_path, 1)
    node = result.node("work")
    assert node["phase"] == "Error"
    assert node["message"].startswith(f"malformed cache entry {path}:")
    assert _runs(tmp_path) == 0
    assert path.read_text() == "{not json"  # left for the user


def test_the_default_cache_is_beside_the_workdir(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "RUNS_FILE": str(tmp_path / "runs.txt")}
    for n in (1, 2):
        run_workflow(_wf(), workdir=str(tmp_path / "runs" / f"w{n}"), stream=io.StringIO(), env=env)
    assert (tmp_path / "runs" / "memo-cache" / "default" / "my-cache" / "k-1.json").is_file()
    assert _runs(tmp_path) == 1


@pytest.mark.parametrize(
    ("memoize", "field"),
    [
        ({"key": "k"}, "memoize.cache.configMap.name"),
        ({"key": "k", "cache": {"configMap": {"name": "../x"}}}, "memoize.cache.configMap.name"),
        ({"key": "k", "maxAge": "10", "cache": {"configMap": {"name": "c"}}}, "memoize.maxAge"),
        ({"cache": {"configMap": {"name": "c"}}}, "memoize.key"),
    ],
)
def test_a_bad_memoize_block_is_refused(memoize, field, tmp_path):
    wf = _wf()
    wf["spec"]["templates"][1]["memoize"] = memoize
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        _run(wf, tmp_path, 1)


def test_memoized_output_artifacts_are_refused(tmp_path):
    wf = _wf(outputs={"artifacts": [{"name": "a", "path": "/tmp/a"}]})
    with pytest.raises(SpecError, match="output artifacts live in one run's repository"):
        _run(wf, tmp_path, 1)


def test_go_durations():
    assert memos.go_duration("10s") == 10.0
    assert memos.go_duration("1h30m") == 5400.0
    assert memos.go_duration("1.5m") == 90.0
    for bad in ("10", "s", "1d", ""):
        with pytest.raises(memos.MemoError):
            memos.go_duration(bad)


def test_ckptflow_run_memo_cache_option(tmp_path, capsys, monkeypatch):
    import yaml

    from ckptflow.run_cli import main

    monkeypatch.setenv("RUNS_FILE", str(tmp_path / "runs.txt"))
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(_wf()))
    for n in (1, 2):
        argv = [
            str(path),
            "--workdir",
            str(tmp_path / f"w{n}"),
            "--memo-cache",
            str(tmp_path / "c"),
        ]
        assert main(argv) == 0
    assert (tmp_path / "c" / "default" / "my-cache" / "k-1.json").is_file()
    assert _runs(tmp_path) == 1
    status = json.loads((tmp_path / "w2" / "status.json").read_text())
    hits = [n["memoizationStatus"]["hit"] for n in status["status"]["nodes"].values()
            if "memoizationStatus" in n]  # fmt: skip
    assert hits == [True]
