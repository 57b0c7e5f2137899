"""Paths a manifest names never reach the host (#37 points 6-7): an artifact path resolves in
the task's own filesystem (`WORKDIR/pods/<node>/...`) after substitution, `..` cleaned by
Argo's rule (`Artifact.CleanPath`), or the manifest (or, for a path only known at run time, the
node) is refused with one line. The runner's cwd holds sentinel user folders that must survive.

Every host path these tests name lies in their own sandbox under /var/tmp (a traversal aimed at
`/etc` would delete the machine's /etc if the rule ever regressed).
"""

from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.pods import available

WHY = available()
ISOLATE = [False, pytest.param(True, marks=pytest.mark.skipif(WHY is not None, reason=str(WHY)))]
SENTINELS = ("data", "etc")


def passing(use_path: str, script: str = "true") -> dict:
    """make writes an artifact; use receives it at `use_path` (maybe holding `{{...x}}`)."""
    make = {
        "name": "make",
        "container": {"command": ["sh", "-c"], "args": ["echo new > /tmp/a.txt"]},
        "outputs": {"artifacts": [{"name": "out", "path": "/tmp/a.txt"}]},
    }
    use = {
        "name": "use",
        "inputs": {
            "parameters": [{"name": "x"}],
            "artifacts": [{"name": "in", "path": use_path}],
        },
        "container": {"command": ["sh", "-c"], "args": [script]},
    }
    arg = {"name": "in", "from": "{{steps.make.outputs.artifacts.out}}"}
    main = {
        "name": "main",
        "steps": [
            [{"name": "make", "template": "make"}],
            [{"name": "use", "template": "use", "arguments": {
                "artifacts": [arg], "parameters": [{"name": "x", "value": "{{workflow.parameters.x}}"}]}}],
        ],
    }  # fmt: skip
    return {
        "metadata": {"name": "wf"},
        "spec": {
            "entrypoint": "main",
            "arguments": {"parameters": [{"name": "x", "value": "data"}]},
            "templates": [main, make, use],
        },
    }


@pytest.fixture
def cwd(monkeypatch):
    """The runner's cwd: a sandbox outside /tmp (so `/tmp/..` leaves /tmp to reach it), with
    the user's folders `data` and `etc`; WORKDIR beside it (outside /tmp: a pod's own /tmp
    would hide it)."""
    box = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ckptflow-hostpaths-"))
    here = box / "cwd"
    for name in SENTINELS:
        (here / name).mkdir(parents=True)
        (here / name / "keep.txt").write_text("mine")
    monkeypatch.chdir(here)
    yield here
    shutil.rmtree(box, ignore_errors=True)


def intact(cwd: Path) -> None:
    for name in SENTINELS:
        assert (cwd / name / "keep.txt").read_text() == "mine", name
    assert sorted(p.name for p in cwd.iterdir()) == sorted(SENTINELS)


def run(manifest, cwd: Path, isolate: bool, **kw):
    return run_workflow(
        manifest, workdir=str(cwd.parent / "w"), name="wf", stream=io.StringIO(),
        isolate=isolate, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("isolate", ISOLATE)
def test_a_relative_artifact_path_is_refused_and_the_users_folder_survives(cwd, isolate):
    with pytest.raises(SpecError, match=r"artifacts\.in\.path.*not absolute"):
        run(passing("data"), cwd, isolate)
    intact(cwd)


@pytest.mark.parametrize("isolate", ISOLATE)
def test_a_relative_path_from_a_parameter_is_one_line_error(cwd, isolate):
    result = run(passing("{{inputs.parameters.x}}"), cwd, isolate, arguments={"x": "data"})
    intact(cwd)
    use = result.node("use")
    assert use["phase"] == "Error", result.table
    assert "not absolute" in use["message"] and "\n" not in use["message"]


@pytest.mark.parametrize("isolate", ISOLATE)
@pytest.mark.parametrize("shape", ["../{}", "../../../../../../{}", "x/../../{}", "x/../../{}/.."])
def test_a_parameter_that_leaves_the_directory_is_one_line_error(cwd, isolate, shape):
    # `/tmp/../<sandbox>/data`: the user's folder on the host (the runner deleted it)
    value = shape.format(str(cwd / "data").lstrip("/"))
    result = run(passing("/tmp/{{inputs.parameters.x}}"), cwd, isolate, arguments={"x": value})
    intact(cwd)
    use = result.node("use")
    assert use["phase"] == "Error", result.table
    assert "Directory traversal" in use["message"] and "\n" not in use["message"]


@pytest.mark.parametrize("isolate", ISOLATE)
def test_a_parameter_path_lands_in_the_pod(cwd, isolate):
    wf = passing("/tmp/in/{{inputs.parameters.x}}", "cat /tmp/in/{{inputs.parameters.x}}")
    result = run(wf, cwd, isolate, arguments={"x": "data"})
    assert result.phase == "Succeeded", result.table
    assert result.node("use")["outputs"]["result"] == "new"
    intact(cwd)


@pytest.mark.parametrize("isolate", ISOLATE)
def test_an_absolute_artifact_path_outside_tmp_lands_in_the_pod(cwd, isolate):
    wf = passing(str(cwd / "data"), f"cat {cwd / 'data'}")  # the pod's path, not the host's
    result = run(wf, cwd, isolate)
    assert result.phase == "Succeeded", result.table
    assert result.node("use")["outputs"]["result"] == "new"
    intact(cwd)


def test_a_static_traversal_is_refused_before_anything_runs(cwd):
    with pytest.raises(SpecError, match="Directory traversal"):
        run(passing("/tmp/x/../../" + str(cwd / "etc").lstrip("/")), cwd, False)
    assert not (cwd.parent / "w" / "pods").exists()
    intact(cwd)


def with_volume(volume: dict, mount: dict) -> dict:
    """One task mounting `volume` (the workflow's) with `mount`'s extra fields."""
    return {
        "metadata": {"name": "wf"},
        "spec": {
            "entrypoint": "t",
            "arguments": {"parameters": [{"name": "x", "value": "ok"}]},
            "volumes": [{"name": "v", **volume}],
            "templates": [{
                "name": "t",
                "container": {"command": ["sh", "-c"], "args": ["true"], "volumeMounts": [
                    {"name": "v", "mountPath": "/mnt/v", **mount}]},
            }],
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    "volume, mount",
    [
        ({"persistentVolumeClaim": {"claimName": "c"}}, {"subPath": "../../../../../../{out}"}),
        ({"emptyDir": {}}, {"subPath": "../../../../../../../../../{out}"}),
        ({"persistentVolumeClaim": {"claimName": "../../../../../../{out}"}}, {}),
        ({"persistentVolumeClaim": {"claimName": "c"}}, {"subPath": "/{out}"}),
    ],
)
def test_a_volume_path_that_leaves_the_workdir_is_refused(cwd, volume, mount):
    out = str(cwd / "escape").lstrip("/")
    volume = {k: {kk: vv.format(out=out) for kk, vv in v.items()} for k, v in volume.items()}
    mount = {k: v.format(out=out) for k, v in mount.items()}
    with pytest.raises(SpecError, match="subPath|claimName"):
        run(with_volume(volume, mount), cwd, False)
    intact(cwd)


@pytest.mark.parametrize("isolate", ISOLATE)
def test_a_volume_subpath_from_a_parameter_cannot_leave(cwd, isolate):
    wf = with_volume({"emptyDir": {}}, {"subPath": "{{workflow.parameters.x}}"})
    out = "../" * 12 + str(cwd / "escape").lstrip("/")
    result = run(wf, cwd, isolate, arguments={"x": out})
    intact(cwd)
    node = result.node("wf")
    assert node["phase"] == "Error" and "subPath" in node["message"], result.table
