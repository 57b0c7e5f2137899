"""Argo's own examples (a vendored fast subset, tests/workflows/fixtures/argo-examples/, Apache-2.0)
run with the local runner: what runs, with which outcome, and what is refused with which field.

`scripts/argo_examples.py` runs all 190 of `../shared/argo/examples` and prints the tally; this
test keeps the handful that cover each feature green without that checkout."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, load_manifest, run_workflow

VENDORED = Path(__file__).parent / "fixtures" / "argo-examples"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "argo" / "examples"

# name -> (workflow phase, {display name: phase} that must hold)
RUNS = {
    "hello-world": ("Succeeded", {}),
    "steps": ("Succeeded", {"hello2a": "Succeeded", "hello2b": "Succeeded"}),
    "dag-diamond": ("Succeeded", {"D": "Succeeded"}),
    "artifact-passing": ("Succeeded", {"consume-artifact": "Succeeded"}),
    "artifact-passing-subpath": ("Succeeded", {"consume-artifact": "Succeeded"}),
    "input-artifact-raw": ("Succeeded", {}),
    "global-outputs": ("Succeeded", {"global-outputs.onExit[0].consume-global-art": "Succeeded"}),
    "nested-workflow": ("Succeeded", {}),
    "dag-targets": ("Succeeded", {"A": "Succeeded", "C": "Succeeded", "E": "Succeeded"}),
    "scripts-bash": ("Succeeded", {"print": "Succeeded"}),
    "cron-workflow": ("Succeeded", {}),
    "synchronization-mutex-wf-level": ("Succeeded", {}),
    "synchronization-wf-level": ("Succeeded", {}),
    "exit-code-output-variable": ("Succeeded", {"failing-container": "Failed"}),
    # failFast: whether D (B.Failed && C) starts before E's failure stops the DAG is a race
    "dag-continue-on-fail": ("Failed", {"B": "Failed", "E": "Failed"}),
}
# what each needs from its caller: the ConfigMap its comments describe
OPTIONS = {"synchronization-wf-level": {"semaphores": {"my-config/workflow": 3}}}
# name -> the field the refusal names
REFUSED = {
    "key-only-artifact": "template 'generate': command: missing",
    "sidecar": "template 'sidecar-example': sidecars: sidecars need a pod",
    "hello-windows": "nodeSelector.kubernetes.io/os=windows",
}
# run as pods (`isolate=True`): volumes-emptydir checks /proc/mounts for its own mount, which
# only a pod with a mount namespace of its own shows (in process mode it fails)
ISOLATED = {"volumes-emptydir": "Succeeded"}
OUTPUTS = {
    "artifact-passing": ("consume-artifact", "hello world"),
    "artifact-passing-subpath": ("consume-artifact", "hello world"),
    "input-artifact-raw": ("input-artifact-raw-", "this is\nthe raw file\ncontents"),
    "global-outputs": ("global-outputs[1].consume-globals[0].consume-global-art", "hello world"),
}


def _run(name: str, tmp_path: Path, **kwargs):
    manifest = load_manifest(str(VENDORED / f"{name}.yaml"))
    return run_workflow(
        manifest, workdir=str(tmp_path / "w"), name=name, stream=io.StringIO(),
        lock_dir=str(tmp_path / "locks"), **kwargs,
    )  # fmt: skip


def test_the_vendored_examples_are_there_with_their_license():
    assert (VENDORED / "LICENSE").read_text().lstrip().startswith("Apache License")
    missing = [n for n in [*RUNS, *REFUSED, *ISOLATED] if not (VENDORED / f"{n}.yaml").is_file()]
    assert not missing, f"vendor these from Argo's examples/: {missing}"


@pytest.mark.skipif(
    not SHARED.is_dir(), reason="no Argo checkout at ../shared (vendored copies used)"
)
def test_the_vendored_examples_are_unchanged_copies():
    for path in VENDORED.glob("*.yaml"):
        assert path.read_bytes() == (SHARED / path.name).read_bytes(), path.name


@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_runs_with_argos_outcome(name, tmp_path):
    phase, nodes = RUNS[name]
    result = _run(name, tmp_path, **OPTIONS.get(name, {}))
    assert result.phase == phase, result.status["status"].get("message")
    for display, node_phase in nodes.items():
        assert result.node(display)["phase"] == node_phase, display
    if name in OUTPUTS:
        display, text = OUTPUTS[name]
        node = result.node(name) if display.endswith("-") else result.node(display)
        assert node["outputs"]["result"] == text


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_example_is_refused_naming_the_field(name, tmp_path):
    with pytest.raises(SpecError) as info:
        _run(name, tmp_path)
    assert REFUSED[name] in str(info.value)
    assert not (tmp_path / "w" / "pods").exists()  # nothing ran


@pytest.mark.parametrize("name", sorted(ISOLATED))
def test_example_runs_as_pods_with_argos_outcome(name, tmp_path):
    from ckptflow.workflows.runner.pods import available

    why = available()
    if why is not None:
        pytest.skip(f"pods unavailable: {why}")
    result = _run(name, tmp_path, isolate=True)
    assert result.phase == ISOLATED[name], result.status["status"].get("message")
