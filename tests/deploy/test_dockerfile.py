"""images/step.Dockerfile: pinned, multi-stage, non-root, and its entrypoints are the step
modules of docs/contracts.md and the ckptflow CLI, resolved to files in the repository."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.deploy.schemas import REPO, contract_step_modules, is_pinned_image

DOCKERFILE = REPO / "images" / "step.Dockerfile"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
OURS = {"ckptflow"}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with comments dropped and continuations joined."""
    out, buf = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        buf = f"{buf} {line[:-1]}" if line.endswith("\\") else f"{buf} {line}"
        if not line.endswith("\\"):
            keyword, _, rest = buf.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
            buf = ""
    return out


def _args() -> dict[str, str]:
    args = {}
    for keyword, rest in _instructions():
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = shlex.split(value)[0]
    return args


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def _module_file(module: str):
    """The source file `python -m module` runs (the installed package-dir mapping resolves it)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.origin:
        return None
    origin = Path(spec.origin)
    main = origin.parent / "__main__.py"
    return main if origin.name == "__init__.py" and main.exists() else origin


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_multi_stage_from_a_pinned_base():
    stages = _stages()
    assert len(stages) >= 2
    base = _args()["PYTHON_IMAGE"]
    assert is_pinned_image(base) and "slim" in base
    assert all(stage[0][1].split()[0] in ("${PYTHON_IMAGE}", base) for stage in stages)
    final = stages[-1]
    assert any(k == "COPY" and r.startswith("--from=build") for k, r in final)
    assert not any(k == "RUN" and "pip install" in r for k, r in final), "build tools in runtime"


def test_runs_as_a_numeric_non_root_user():
    users = [r for k, r in _stages()[-1] if k == "USER"]
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_torch_is_the_tested_pin_from_the_cpu_index_by_default():
    steps = _pyproject()["optional-dependencies"]["steps"]
    torch_pin = next(d for d in steps if d.startswith("torch=="))
    runs = " ".join(r for k, r in _instructions() if k == "RUN")
    assert f'--index-url "${{TORCH_INDEX_URL}}" {torch_pin}' in runs
    assert _args()["TORCH_INDEX_URL"] == CPU_INDEX
    assert "--constraint images/constraints.txt" in runs and '".[steps,workflows]"' in runs


def test_constraints_are_the_tested_versions():
    """Ranges in pyproject are pinned, for the image, to what this environment tests with."""
    pinned = {
        d.split("==")[0].lower()
        for deps in _pyproject()["optional-dependencies"].values()
        for d in deps
        if "==" in d
    }
    lines = [
        ln
        for ln in (REPO / "images" / "constraints.txt").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    assert lines
    for line in lines:
        name, version = line.split("==")
        assert name.lower() not in pinned, f"{name} is pinned in pyproject already"
        assert importlib.metadata.version(name) == version, f"{name}: tested version differs"


def test_copied_paths_exist_and_pass_dockerignore():
    patterns = [
        ln.strip()
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert patterns[0] == "*", ".dockerignore should admit only what the image copies"
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    for keyword, rest in _instructions():
        if keyword != "COPY" or rest.startswith("--from"):
            continue
        for src in rest.split()[:-1]:
            src = src.rstrip("/")
            assert (REPO / src).exists(), f"COPY {src}: missing"
            assert any(fnmatch.fnmatch(src, a) or src == a for a in allowed), f"{src} ignored"


def _checked_at_build() -> set[str]:
    """Modules whose `python -m X --help` the build runs."""
    named = set(_args()["STEP_MODULES"].split())
    for keyword, rest in _instructions():
        if keyword == "RUN":
            named |= set(re.findall(r"python -m ([a-z_][\w.]*)", rest))
    return named


def test_build_checks_every_contract_step():
    steps, modules = _args()["STEP_MODULES"].split(), contract_step_modules()
    assert len(modules) == 8  # start_run pretrain evaluate finetune select finish_run rdzv drill
    assert steps[: len(modules)] == modules
    assert len(set(steps)) == len(steps)


def test_build_checks_every_module_the_workflows_run():
    """Render every builder and collect the `-m MODULE` of each container."""
    render = pytest.importorskip(
        "ckptflow.workflows.render", reason="workflows (hera) not installed"
    )
    run = set()
    for name in render.BUILDER_NAMES:
        manifest = json.dumps(render.builder(name).build(render.config([])).to_dict())
        run |= set(re.findall(r'"-m", "([\w.]+)"', manifest))
    assert "ckptflow.steps.pretrain" in run, "found no step modules in the rendered workflows"
    assert run <= _checked_at_build(), (
        f"not checked by the image build: {run - _checked_at_build()}"
    )


def test_entrypoint_modules_exist():
    """CMD and RUN name `python -m` modules: ours are files in the repository."""
    named = set()
    for keyword, rest in _instructions():
        if keyword in ("CMD", "ENTRYPOINT", "RUN"):
            named |= set(re.findall(r'-m"?,?\s*"?([a-z_][\w.]*)', rest))
    assert "ckptflow.cli" in named
    for module in named:
        if module.split(".")[0] in OURS:
            assert _module_file(module), f"`python -m {module}`: no such module in the repository"
        else:  # the standard library's (venv)
            assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("module", _args()["STEP_MODULES"].split())
def test_each_step_module_exists(module):
    assert _module_file(module) is not None, f"{module} does not exist: the image build would fail"
    text = _module_file(module).read_text()
    assert re.search(r"^def main\(argv", text, flags=re.M), f"{module} has no main(argv)"
    assert "__main__" in text, f"`python -m {module}` would not call main()"
