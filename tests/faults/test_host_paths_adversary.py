"""The adversarial model of host paths reached through manifests (issue 37 points 6-7): hypothesis
generates workflows whose artifact paths, volume subPaths and claim names and parameters hold
`..`, absolute and relative paths, symlinks out of a directory and `{{inputs.parameters.x}}`
substitutions, and runs each with
the local runner whose cwd is a sandbox full of sentinel files. Either the runner refuses the
manifest (SpecError) or a node errors with one line, or it runs: in every case no sentinel
changed and nothing appeared outside the workdir.

Every generated path, read as a host path from the runner's cwd (what the runner did before
the fix), lies in the sandbox: ups past `/` come back down through the sandbox's own absolute
path, so a regression damages only the sandbox, never the machine. Default run: a few dozen
manifests (derandomized); `-m slow`: 400 in processes and 60 as pods (`--isolate`, as root);
`CKPTFLOW_HOSTPATH_EXAMPLES=N` sets the count. The counts go to the fault report.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.pods import available
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

WHY = available()
DEFAULT_EXAMPLES = 25
NAMES = ("data", "etc", "link_out", "keep.txt", "x", "in")


def _box() -> Path:
    """A sandbox outside /tmp: cwd/ (the runner's) with the user's folders and a link out of
    cwd, outside/ (what the link reaches), w/ (the workdir)."""
    box = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ckptflow-hostpath-box-"))
    cwd = box / "cwd"
    for d in (cwd / "data", cwd / "etc", box / "outside"):
        d.mkdir(parents=True)
        (d / "keep.txt").write_text("mine")
    (cwd / "link_out").symlink_to(box / "outside")
    return box


def _snapshot(box: Path) -> dict[str, str]:
    """Every entry of the sandbox but the workdir: its kind and content (or link target)."""
    out = {}
    for dirpath, dirs, files in os.walk(box):
        if Path(dirpath) == box:
            dirs[:] = [d for d in dirs if d != "w"]
        for name in dirs + files:
            p = Path(dirpath, name)
            if p.is_symlink():
                out[str(p)] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[str(p)] = "dir"
            else:
                out[str(p)] = "file:" + p.read_text(errors="replace")
    return out


@st.composite
def host_paths(draw, box: Path, in_param: bool = False) -> str:
    """A path (or a parameter's value, `in_param`: what follows `/tmp/`) that any reading on
    the host keeps inside `box`."""
    tail = "/".join(draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3)))
    if draw(st.booleans()):  # a `..` inside the tail, below cwd
        tail = f"{draw(st.sampled_from(NAMES[:3]))}/../{tail}"
    inside = str(box / "cwd").lstrip("/")
    kind = draw(st.sampled_from(["climb", "absolute", "relative", "tmp", "through-link"]))
    if kind == "climb":  # ../../<box>/cwd/<tail>: past `/` and back down into the box
        ups = draw(st.integers(1, 12))
        path = "../" * ups + f"{inside}/{tail}"
    elif kind == "absolute":
        path = f"/{inside}/{tail}"
    elif kind == "relative":  # from the runner's cwd
        path = tail if draw(st.booleans()) else f"./{tail}"
    elif kind == "tmp":
        path = f"/tmp/ckptflow-hostpath-x/{tail}" if not in_param else tail
    else:
        path = f"/{inside}/link_out/{draw(st.sampled_from(['keep.txt', 'x', 'new']))}"
    if not in_param and kind in ("climb",):
        path = "/tmp/" + path
    return path


@st.composite
def manifests(draw, box: Path) -> tuple[dict, dict]:
    """(workflow, its -p arguments): make writes a file and a directory holding a link out of
    the box's cwd; use receives them at generated paths, maybe through a parameter."""
    param = draw(host_paths(box, in_param=True))
    how = draw(st.sampled_from(["literal", "tmp-param", "whole-param"]))
    if how == "literal":
        in_path = draw(host_paths(box))
    elif how == "tmp-param":
        in_path = "/tmp/{{inputs.parameters.x}}"
    else:
        in_path = "{{inputs.parameters.x}}"
    out_path = draw(st.sampled_from(["/tmp/{{inputs.parameters.x}}", draw(host_paths(box))]))
    dir_path = draw(st.sampled_from(["/tmp/in", "/tmp/in/link_out", draw(host_paths(box))]))
    mode = draw(st.sampled_from([None, 0o600, "0755"]))
    volume = draw(st.sampled_from([None, "emptyDir", "claim"]))
    sub = draw(st.sampled_from(["{{inputs.parameters.x}}", draw(host_paths(box, in_param=True))]))
    mounts = [{"name": "v", "mountPath": "/mnt/v", "subPath": sub}] if volume else []
    link = f"ln -s {box / 'outside'} /tmp/d/l; ln -s ../../.. /tmp/d/up"
    make = {
        "name": "make",
        "inputs": {"parameters": [{"name": "x"}]},
        "container": {"command": ["sh", "-c"], "args": [
            f"mkdir -p /tmp/d; echo new > /tmp/a.txt; echo in > /tmp/d/f; {link}"],
            "volumeMounts": mounts},
        "outputs": {"artifacts": [
            {"name": "a", "path": "/tmp/a.txt"},  # the program's /tmp/a.txt is the pod's
            {"name": "out", "path": out_path, "optional": True},
            {"name": "dir", "path": "/tmp/d"}]},
    }  # fmt: skip
    in_art = {"name": "in", "path": in_path, **({"mode": mode} if mode is not None else {})}
    use = {
        "name": "use",
        "inputs": {
            "parameters": [{"name": "x"}],
            "artifacts": [in_art, {"name": "dir", "path": dir_path, "optional": True}],
        },
        "container": {"command": ["sh", "-c"], "args": ["true"], "volumeMounts": mounts},
    }
    x = [{"name": "x", "value": "{{workflow.parameters.x}}"}]
    arts = [
        {"name": "in", "from": "{{steps.make.outputs.artifacts.a}}"},
        {"name": "dir", "from": "{{steps.make.outputs.artifacts.dir}}"},
    ]
    main = {
        "name": "main",
        "steps": [
            [{"name": "make", "template": "make", "arguments": {"parameters": x}}],
            [{"name": "use", "template": "use", "arguments": {"parameters": x, "artifacts": arts}}],
        ],
    }
    wf = {
        "metadata": {"name": "adv"},
        "spec": {
            "entrypoint": "main",
            "arguments": {"parameters": [{"name": "x", "value": "data"}]},
            "templates": [main, make, use],
        },
    }
    if volume == "emptyDir":
        wf["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    elif volume == "claim":  # a claim's name is a directory of the workdir too
        name = draw(st.sampled_from(["c", "../../" + str(box / "cwd" / "data").lstrip("/")]))
        wf["spec"]["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": name}}]
    return wf, {"x": param}


def _one(box: Path, wf: dict, arguments: dict, isolate: bool, seen: dict) -> None:
    before = _snapshot(box)
    tmp_before = set(os.listdir("/tmp"))
    work = box / "w"
    try:
        _check_run(box, wf, arguments, isolate, seen, work)
    finally:  # a fresh workdir for each example: no pod directory is reused
        shutil.rmtree(work, ignore_errors=True)
    after = _snapshot(box)
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                             if before.get(k) != after.get(k)}  # fmt: skip
    appeared = {
        n for n in set(os.listdir("/tmp")) - tmp_before if n.startswith("ckptflow-hostpath")
    }
    assert not appeared, appeared  # the runner wrote nothing in the host's /tmp


def _check_run(box: Path, wf: dict, arguments: dict, isolate: bool, seen: dict, work: Path):
    """Run one manifest; count its outcome (refused, node error, succeeded, failed)."""
    try:
        result = run_workflow(
            wf, arguments=arguments, workdir=str(work), name="adv", stream=io.StringIO(),
            cwd=str(box / "cwd"), isolate=isolate,
        )  # fmt: skip
    except SpecError as exc:
        assert "Traceback" not in str(exc)
        outcome = "refused"
    else:
        nodes = result.status["status"]["nodes"].values()
        errors = [n for n in nodes if n["type"] == "Pod" and n["phase"] == "Error"]
        assert all("\n" not in (n.get("message") or "") for n in errors), errors
        outcome = "node error" if errors else result.phase.lower()
    seen[outcome] = seen.get(outcome, 0) + 1


def _examples(slow: bool, isolate: bool) -> int:
    env = os.environ.get("CKPTFLOW_HOSTPATH_EXAMPLES")
    if env:
        return int(env)
    return (60 if isolate else 400) if slow else DEFAULT_EXAMPLES


def _run(isolate: bool, slow: bool, monkeypatch) -> dict:
    box = _box()
    monkeypatch.chdir(box / "cwd")
    seen: dict = {}

    @settings(
        max_examples=_examples(slow, isolate),
        deadline=None,
        database=None,
        derandomize=not slow,
        suppress_health_check=list(HealthCheck),
    )
    @given(manifests(box))
    def check(case):
        wf, arguments = case
        _one(box, wf, arguments, isolate, seen)

    try:
        check()
    finally:
        shutil.rmtree(box, ignore_errors=True)
    return seen


def _report(fault, seen: dict, isolate: bool, slow: bool) -> None:
    fault(
        "hostile",
        "generated manifests aiming artifact paths and parameters at host files"
        + (" (pods)" if isolate else " (processes)")
        + (" (slow run)" if slow else ""),
        cases=sum(seen.values()),
        detail=", ".join(f"{k} {v}" for k, v in sorted(seen.items())),
    )


def test_generated_host_paths_never_reach_the_host(fault, monkeypatch):
    seen = _run(False, False, monkeypatch)
    _report(fault, seen, False, False)
    assert sum(seen.values()) >= DEFAULT_EXAMPLES
    assert seen.get("refused") and (seen.get("node error") or seen.get("succeeded")), seen


@pytest.mark.slow
@pytest.mark.parametrize(
    "isolate",
    [False, pytest.param(True, marks=pytest.mark.skipif(WHY is not None, reason=str(WHY)))],
)
def test_many_generated_host_paths_never_reach_the_host(fault, monkeypatch, isolate):
    seen = _run(isolate, True, monkeypatch)
    _report(fault, seen, isolate, True)
    assert sum(seen.values()) >= _examples(True, isolate) // 2, seen
