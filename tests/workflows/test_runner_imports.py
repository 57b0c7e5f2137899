"""`workflows/runner/` is a standalone Argo interpreter: its modules import each other without a
cycle (module-level and function-level imports alike), and nothing outside the runner but the
standard library, PyYAML, the two libraries of its expressions (python-jsonpath, regex) and of
its object store (jsonpatch, jq): no
builders, no hera, no torch, no checkpoint core.

Read from the source with `ast`, so an import hidden inside a function counts too.
"""

from __future__ import annotations

import ast
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PKG = "ckptflow.workflows.runner"
RUNNER = Path(__file__).resolve().parents[2] / "workflows" / "runner"
# yaml: manifests; jsonpath, regex: Argo's jsonpath() and `matches` in expressions (expr_funcs.py);
# jsonpatch: RFC 6902 patches in the object store (objects.py); jq: jqFilter (resource_fields.py)
ALLOWED_THIRD_PARTY = {"yaml", "jsonpath", "regex", "jsonpatch", "jq"}


def _modules() -> dict[str, ast.Module]:
    """Every runner module by its dotted name (the package itself for __init__.py)."""
    out = {}
    for path in sorted(RUNNER.glob("*.py")):
        name = PKG if path.stem == "__init__" else f"{PKG}.{path.stem}"
        out[name] = ast.parse(path.read_text(), filename=str(path))
    return out


def _imported(module: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The modules `module` imports anywhere in its body; `from P import X` names P.X when that
    is a runner module (a submodule, not the package's __init__)."""
    package = module if module == PKG else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imported(name, tree, set(mods)) for name, tree in mods.items()}


def test_the_import_graph_is_read():
    graph = _graph()
    assert len(graph) >= 15, sorted(graph)
    assert f"{PKG}.execute" in graph[f"{PKG}.workflow"]  # the parser finds real edges


def test_runner_modules_import_each_other_without_a_cycle():
    graph = _graph()
    inner = {name: {t for t in targets if t in graph} for name, targets in graph.items()}
    try:
        list(TopologicalSorter(inner).static_order())
    except CycleError as exc:
        cycle = " imports ".join(reversed(exc.args[1]))  # graphlib lists importers after
        pytest.fail(f"import cycle among runner modules: {cycle}")


def test_runner_imports_only_itself_the_standard_library_and_yaml():
    bad = {}
    for name, targets in _graph().items():
        for target in targets:
            top = target.split(".")[0]
            if target == PKG or target.startswith(f"{PKG}."):
                continue
            if top == "ckptflow" or top in ("hera", "torch", "steps", "workflows"):
                bad.setdefault(name, []).append(target)  # builders, core, steps: not standalone
            elif top not in sys.stdlib_module_names and top not in ALLOWED_THIRD_PARTY:
                bad.setdefault(name, []).append(target)
    assert bad == {}, f"runner modules importing outside the runner: {bad}"
