"""The Makefile's venv install: torch is the tested pin, from PyTorch's CPU index on Linux
(as in the image), never PyPI's CUDA build; checked on `make -n`'s expanded commands."""

from __future__ import annotations

import shutil
import subprocess
import tomllib

import pytest

from tests.deploy.schemas import REPO
from tests.deploy.test_dockerfile import CPU_INDEX


def _torch_pin() -> str:
    steps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["steps"]
    return next(d for d in steps if d.startswith("torch=="))


def _install_commands(tmp_path, os_name: str) -> list[str]:
    """The commands `make` would run to create a venv at tmp_path on `os_name`."""
    make = shutil.which("make")
    if make is None:
        pytest.fail("make not found: the Makefile cannot be checked")
    venv = tmp_path / "venv"
    done = subprocess.run(
        [
            make,
            "-n",
            "-B",
            "-C",
            str(REPO),
            f"VENV={venv}",
            f"OS_NAME={os_name}",
            f"{venv}/.installed",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_linux_takes_torch_from_the_cpu_index_before_the_project(tmp_path):
    lines = _install_commands(tmp_path, "Linux")
    pin = _torch_pin()
    torch = next(i for i, line in enumerate(lines) if pin in line)
    project = next(i for i, line in enumerate(lines) if "-e '.[all,dev]'" in line)
    assert torch < project, "the project install would resolve torch itself (CUDA on Linux)"
    line = lines[torch]
    # a +cpu wheel pip's own sources hold first (no index asked), else the CPU index; never a
    # bare pin from PyPI (the CUDA build)
    local, _, fallback = line.partition("; else")
    assert f"pip install -q --no-index --no-deps '{pin}+cpu'" in local
    assert local.endswith(f"pip install -q '{pin}+cpu'")  # then its dependencies
    assert f"pip install -q --index-url '{CPU_INDEX}' {pin};" in fallback
    assert f"pip install -q {pin}" not in line


def test_other_systems_take_pypis_torch_wheel(tmp_path):
    """PyPI's macOS and Windows torch wheels carry no CUDA."""
    lines = _install_commands(tmp_path, "Darwin")
    assert any(line.endswith(f"pip install -q {_torch_pin()}") for line in lines)
    assert not any("--index-url" in line for line in lines)


def test_the_image_and_the_venv_share_the_cpu_index():
    makefile = (REPO / "Makefile").read_text()
    assert f"TORCH_INDEX_URL ?= {CPU_INDEX}" in makefile
    assert "--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL)" in makefile
