"""docs/to-a-cluster.md names the runner code of each rule: every file and function it names
exists, so the page cannot point at code that was moved or renamed."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "to-a-cluster.md"
RUNNER = REPO / "workflows" / "runner"


def _defines(module: str, name: str) -> bool:
    text = (RUNNER / f"{module}.py").read_text()
    return re.search(rf"^def {name}\(", text, re.MULTILINE) is not None


def _here_cells() -> list[str]:
    """The last cell ('here') of each rule row of the page's tables."""
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ")]
    return [row.rstrip(" |").rsplit(" | ", 1)[1] for row in rows if not row.startswith("| rule")]


def test_every_runner_file_and_function_the_page_names_exists():
    cells = _here_cells()
    assert len(cells) >= 15
    for cell in cells:
        files = re.findall(r"workflows/runner/(\w+)\.py", cell)
        files += re.findall(r"`(\w+)\.py`", cell)
        for module in files:
            assert (RUNNER / f"{module}.py").is_file(), (cell, module)
        for ref in re.findall(r"`([\w.]+)`", cell):
            if ref.endswith(".py"):
                continue
            if "." in ref:  # module.function
                module, name = ref.split(".", 1)
                assert _defines(module, name), (cell, ref)
            else:  # a function of a file the cell names
                assert any(_defines(m, ref) for m in files), (cell, ref)


def test_the_readme_and_the_runner_page_link_to_it():
    assert "(docs/to-a-cluster.md)" in (REPO / "README.md").read_text()
    assert "(to-a-cluster.md)" in (REPO / "docs" / "local-runner.md").read_text()
