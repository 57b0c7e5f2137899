"""The house rules of the import graph, checked on the source (every import, also inside
functions) and at run time.

Layers, bottom to top (a module imports only from its own layer group or below):

    ckptflow.core              the checkpoint format core: no torch, no hera
    ckptflow.contract          the step argument dataclasses: no torch, no hera
    ckptflow.env               the one reader of deployment wiring (environment variables)
    ckptflow.workflows.runner  a standalone Argo interpreter: nothing else of ckptflow
    ckptflow.steps             what containers run: torch, never hera, never workflows
    ckptflow.workflows         Hera builders: hera, never torch, never steps
    ckptflow (cli, run_cli)    the command line: dispatches to everything, lazily

No step module (`ckptflow.steps.<name>`) imports another, and nothing anywhere imports the bare
`steps` or `workflows` (they are `ckptflow.steps` and `ckptflow.workflows`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# source folder -> package name (pyproject's package-dir)
ROOTS = {"ckptflow": "ckptflow", "steps": "ckptflow.steps", "workflows": "ckptflow.workflows"}
# group -> (rank, third-party roots it must never import)
GROUPS = {
    "ckptflow.core": (0, {"torch", "hera"}),
    "ckptflow.contract": (1, {"torch", "hera"}),
    "ckptflow.env": (1, {"torch", "hera"}),
    "ckptflow.workflows.runner": (1, {"torch", "hera"}),
    "ckptflow.steps": (2, {"hera"}),
    "ckptflow.workflows": (2, {"torch"}),
    "ckptflow": (3, set()),
}


def group_of(module: str) -> str:
    """The most specific group a module belongs to."""
    return max((g for g in GROUPS if module == g or module.startswith(g + ".")), key=len)


def source_modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name."""
    out = {}
    for folder, package in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def import_statements(path: Path, module: str) -> list[tuple[str, list[str]]]:
    """Every import statement in the file, also inside functions, as (module, names): `import
    a.b` is ("a.b", []), `from P import N` is (P, [N]) with relative P resolved."""
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_pkg else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, [a.name for a in node.names]))
    return found


def imports_of(path: Path, module: str) -> set[str]:
    """Every module name an import statement in the file names (relative ones resolved)."""
    found = set()
    for base, names in import_statements(path, module):
        found.add(base)
        found |= {f"{base}.{n}" for n in names}  # `from pkg import module`
    return found


MODULES = source_modules()


def _violations(module: str, path: Path) -> list[str]:
    rank, banned = GROUPS[group_of(module)]
    own = group_of(module)
    bad = []
    for name in sorted(imports_of(path, module)):
        root = name.split(".")[0]
        if root in banned:
            bad.append(f"{module} imports {name} ({own} must not import {root})")
        if root in ("steps", "workflows"):
            bad.append(f"{module} imports bare {name!r}: use ckptflow.{name}")
        if root != "ckptflow" or name == "ckptflow" or name not in MODULES:
            continue
        other = group_of(name)
        if other == own or other.startswith(own + "."):
            continue
        other_rank = GROUPS[other][0]
        if other_rank > rank or (other_rank == rank and other != own):
            bad.append(f"{module} imports {name}: {own} may not import {other}")
        if own == "ckptflow.workflows.runner":
            bad.append(f"{module} imports {name}: the runner is standalone")
    return bad


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module):
    assert _violations(module, MODULES[module]) == []


def test_no_step_imports_another_step():
    entry = {m for m in MODULES if m.count(".") == 2 and m.startswith("ckptflow.steps.")}
    entry -= {"ckptflow.steps.checkpoint", "ckptflow.steps.lib"}
    assert len(entry) >= 6
    bad = [
        f"{m} imports {n}"
        for m in sorted(entry)
        for n in imports_of(MODULES[m], m)
        if n in entry and n != m
    ]
    assert bad == []


def test_nothing_in_the_repository_imports_bare_steps_or_workflows():
    bad = []
    for path in sorted(REPO.rglob("*.py")):
        if ".venv" in path.parts or "node_modules" in path.parts:
            continue
        for name in imports_of(path, "x"):
            if name.split(".")[0] in ("steps", "workflows"):
                bad.append(f"{path.relative_to(REPO)}: {name}")
    assert bad == []


PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'hera'}))
"""


@pytest.mark.parametrize(
    "group", ["ckptflow.core", "ckptflow.contract", "ckptflow.workflows.runner"]
)
def test_torch_free_groups_load_neither_torch_nor_hera(group):
    names = [m for m in MODULES if group_of(m) == group]
    if group == "ckptflow.contract" and not names:
        pytest.fail("ckptflow.contract does not exist")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *names], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"importing {group} loaded {out.stdout.strip()}"


def module_edges(path: Path, module: str) -> set[str]:
    """The ckptflow modules a file's imports load first, also inside functions: `from P import
    N` names module P.N when that is a module, else P itself (its package face)."""
    found = set()
    for base, names in import_statements(path, module):
        found |= {f"{base}.{n}" if f"{base}.{n}" in MODULES else base for n in names} or {base}
    return {n for n in found if n in MODULES and n != module}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                scc = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    scc.append(w)
                    if w == v:
                        break
                if len(scc) > 1:
                    cycles.append(sorted(scc))
    return cycles


def test_import_cycle_finder_sees_one():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """No ckptflow module reaches itself through imports, in-function ones included: a cycle
    works only by the order modules happen to load in (the runner's recursion takes its
    executor as an argument instead)."""
    graph = {m: module_edges(p, m) for m, p in MODULES.items()}
    cycles = import_cycles(graph)
    shown = [
        " <-> ".join(c)
        + ": "
        + "; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
        for c in cycles
    ]
    assert shown == []
