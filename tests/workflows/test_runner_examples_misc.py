"""Argo's own examples for memoize, inline templates, templateDefaults, steps failFast, template
fields accepted as no-ops, suspend, sidecars and init containers (vendored unchanged in
tests/workflows/fixtures/argo-examples/, Apache-2.0), run with the local runner to Argo's
outcome, or refused naming the field. The pod ones run with `isolate=True` and are skipped
only where pods are unavailable (as tests/workflows/test_runner_argo_examples.py does)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, load_manifest, run_workflow
from ckptflow.workflows.runner.steps_exec import FAIL_FAST

VENDORED = Path(__file__).parent / "fixtures" / "argo-examples"

# name -> the workflow phase Argo ends with
RUNS = {
    "loops-param-argument": "Succeeded",  # template-level `annotations`: no Template field
    "pod-resources": "Succeeded",
    "resource-claims": "Succeeded",
    "resource-claims-template-override": "Succeeded",
}
# name -> (run as pods?, the text the refusal names)
REFUSED = {
    # inline templates resolve: what stops them is argosay's entrypoint, named in the inline one
    "steps-inline-workflow": (False, "template 'main/a': command: missing: the image's entrypoint"),
    "dag-inline-workflow": (False, "template 'main/a': command: missing: the image's entrypoint"),
    "suspend-template": (False, "template 'approve': suspend: a suspend template without a "),
    "sidecar": (False, "template 'sidecar-example': sidecars: sidecars need a pod"),
    "init-container": (False, "initContainers: init containers need a pod"),
    "pod-resources-template-override": (False, "template 'large': sidecars: sidecars need a pod"),
}
REFUSED_AS_PODS = {
    "sidecar": "sidecars.influxdb command 'influxd': not installed on this machine",
}


def _run(name: str, tmp_path: Path, workdir: str = "w", **kwargs):
    manifest = load_manifest(str(VENDORED / f"{name}.yaml"))
    return run_workflow(
        manifest, workdir=str(tmp_path / workdir), stream=io.StringIO(),
        lock_dir=str(tmp_path / "locks"), **kwargs,
    )  # fmt: skip


def _pods_or_skip() -> None:
    from ckptflow.workflows.runner.pods import available

    why = available()
    if why is not None:
        pytest.skip(f"pods unavailable: {why}")


def _pods(result) -> list[dict]:
    return [n for n in result.nodes.values() if n["type"] == "Pod"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_runs_with_argos_outcome(name, tmp_path):
    result = _run(name, tmp_path)
    assert result.phase == RUNS[name], result.message


def test_loops_param_argument_runs_each_item(tmp_path):
    result = _run("loops-param-argument", tmp_path)
    assert len(_pods(result)) == 4
    assert all(n["phase"] == "Succeeded" for n in _pods(result))


def test_memoize_simple_misses_then_hits(tmp_path):
    first = _run("memoize-simple", tmp_path, "w1", memo_cache=str(tmp_path / "cache"))
    assert first.phase == "Succeeded"
    (node,) = _pods(first)
    assert node["memoizationStatus"] == {
        "hit": False,
        "key": "cache-key",
        "cacheName": "cache-config",
    }
    second = _run("memoize-simple", tmp_path, "w2", memo_cache=str(tmp_path / "cache"))
    assert second.phase == "Succeeded"
    (hit,) = _pods(second)
    assert hit["memoizationStatus"]["hit"] is True
    assert hit["outputs"]["parameters"] == node["outputs"]["parameters"]
    assert not (tmp_path / "w2" / "pods").exists()  # nothing ran: the cache answered


def test_template_defaults_make_every_template_retry(tmp_path):
    # labelled expected-failure in Argo: retry-backoff exits 1 with probability 2/3, so its
    # three attempts (limit "2" from templateDefaults) may all fail; then `main`, which has
    # the default retryStrategy too, runs again (up to three times)
    result = _run("template-defaults", tmp_path)
    assert result.phase in ("Succeeded", "Failed")
    root = result.nodes[next(iter(result.nodes))]
    assert root["type"] == "Retry" and 1 <= len(root["children"]) <= 3
    retries = [n for n in result.nodes.values() if n["displayName"] == "retry-backoff"]
    assert retries and all(n["type"] == "Retry" for n in retries)
    for n in retries:  # its attempts (a next step group is its child too, as in Argo)
        attempts = [c for c in n["children"] if result.nodes[c]["name"].startswith(n["name"] + "(")]
        assert 1 <= len(attempts) <= 3
    ok = any(n["phase"] == "Succeeded" for n in retries)
    assert result.phase == ("Succeeded" if ok else "Failed")
    if ok:
        assert result.node("hello-world")["phase"] == "Succeeded"


def test_loops_arbitrary_sequential_steps_stops_at_the_failed_item(tmp_path):
    result = _run("loops-arbitrary-sequential-steps", tmp_path)
    assert result.phase == "Failed"
    assert result.message == FAIL_FAST
    phases = sorted(n["phase"] for n in _pods(result))
    assert phases == ["Failed", "Succeeded", "Succeeded", "Succeeded"]  # "will not run" did not


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_example_is_refused_naming_the_field(name, tmp_path):
    with pytest.raises(SpecError) as info:
        _run(name, tmp_path)
    assert REFUSED[name][1] in str(info.value)
    assert not (tmp_path / "w" / "pods").exists()


@pytest.mark.parametrize("name", sorted(REFUSED_AS_PODS))
def test_example_is_refused_as_pods_naming_the_field(name, tmp_path):
    _pods_or_skip()
    with pytest.raises(SpecError) as info:
        _run(name, tmp_path, isolate=True)
    assert REFUSED_AS_PODS[name] in str(info.value)


def test_init_container_runs_to_completion_before_the_main_one(tmp_path):
    _pods_or_skip()
    result = _run("init-container", tmp_path, isolate=True)
    assert result.phase == "Succeeded", result.message
    (pod,) = _pods(result)
    assert pod["outputs"]["result"] == "bye"  # the init container's stdout is not the result
    # both in the pod's log; not their order: the init container's stdout goes to the pod's
    # stderr, and the log's two streams are read apart (a fresh clone's CI saw "bye hello").
    # The order itself: test_runner_pod_containers.py, through a shared file
    assert sorted(Path(pod["local"]["logFile"]).read_text().split()) == ["bye", "hello"]


def test_a_sidecar_ends_with_its_main_container(tmp_path):
    _pods_or_skip()
    result = _run("pod-resources-template-override", tmp_path, isolate=True)
    assert result.phase == "Succeeded", result.message
    large = result.node("large")
    assert large["outputs"]["result"] == "large step"
    took = large["local"]["finishedAtUnix"] - large["local"]["startedAtUnix"]
    assert took < 9.5, took  # main sleeps 5s; the sidecar's `sleep 10` was stopped with it


def test_fibonacci_memoizes_its_subproblems(tmp_path):
    cache = str(tmp_path / "cache")
    result = _run("fibonacci-seq-conditional-param", tmp_path, "w1", memo_cache=cache)
    assert result.phase == "Succeeded", result.message
    assert result.node("printresult")["outputs"]["result"] == "5"  # fib(5)
    memo = [n["memoizationStatus"] for n in result.nodes.values() if "memoizationStatus" in n]
    assert {m["key"] for m in memo} == {"1", "2", "3", "4", "5"}
    # fib(3) and fib(2) are computed once and then found in the cache within the same run
    assert sorted(m["key"] for m in memo if m["hit"]) == ["2", "3"]
    again = _run("fibonacci-seq-conditional-param", tmp_path, "w2", memo_cache=cache)
    assert again.node("fibonaccimain")["memoizationStatus"]["hit"] is True
    assert again.node("printresult")["outputs"]["result"] == "5"
    assert not [n for n in again.nodes.values() if n["displayName"] == "add"]  # nothing computed
