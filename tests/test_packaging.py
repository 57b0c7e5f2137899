"""The distribution installs exactly one top-level package, `ckptflow`, and lives beside another
project's top-level `workflows` package (llama-index-workflows installs one)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = {"ckptflow": "ckptflow", "ckptflow.steps": "steps", "ckptflow.workflows": "workflows"}


def package_folders() -> set[str]:
    """Every folder with an __init__.py, named as the installed package it becomes."""
    out = set()
    for package, folder in PACKAGE_DIR.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            out.add(".".join([package, *rel.parts]))
    return out


def test_pyproject_lists_every_package_folder():
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert conf["package-dir"] == PACKAGE_DIR
    assert set(conf["packages"]) == package_folders()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (path,) = out.glob("ckptflow-*.whl")
    return path


def test_wheel_has_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"ckptflow"}
    packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("__init__.py")}
    assert packages == package_folders()
    assert "ckptflow/steps/checkpoint/checkpointer.py" in names
    assert "ckptflow/workflows/runner/workflow.py" in names


STANDIN = '"""A stand-in for llama-index-workflows\' top-level package."""\nSTANDIN = "theirs"\n'
PROBE = """
import workflows
import ckptflow.workflows.runner, ckptflow.core.layout
from ckptflow.workflows.runner import run_workflow
assert workflows.STANDIN == "theirs", workflows.__file__
assert ckptflow.workflows.__name__ == "ckptflow.workflows"
print("both", workflows.__file__, ckptflow.workflows.runner.__file__)
"""


def test_installed_wheel_lives_beside_another_workflows_package(wheel, tmp_path):
    """Install the wheel into a fresh environment that also has a top-level `workflows`
    package; both import, neither shadows the other."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    site = next((env / "lib").glob("python3*/site-packages"))
    # the dependencies come from this environment; its editable ckptflow must not leak in
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "deps.pth").write_text("".join(f"{p}\n" for p in deps))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    (site / "workflows").mkdir()
    (site / "workflows" / "__init__.py").write_text(STANDIN)
    out = subprocess.run(
        [str(env / "bin" / "python"), "-c", PROBE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    _, theirs, ours = out.stdout.split()
    assert Path(theirs) == site / "workflows" / "__init__.py"
    assert Path(ours) == site / "ckptflow" / "workflows" / "runner" / "__init__.py"


def test_license_is_declared_the_way_setuptools_wants_it(tmp_path):
    """`license = { text = ... }` made setuptools warn ("project.license as a TOML table is
    deprecated") three times per install (issue 38, point 10): an SPDX expression, with a
    setuptools that reads it (PEP 639: setuptools 77)."""
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    conf = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert conf["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in conf["build-system"]["requires"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    said = [str(w.message) for w in seen if "license" in str(w.message).lower()]
    assert not said, said
    assert dist.metadata.license_expression == "Apache-2.0"
