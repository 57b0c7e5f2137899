"""The default pipeline fits the README's laptop cluster: the requests of every set of pods
that can run at once, plus MinIO and MLflow (deploy/k8s), stay within a laptop's budget."""

from __future__ import annotations

import itertools
import json
import re
from fractions import Fraction

import pytest
import yaml

from tests.deploy.schemas import K8S_DIR, REPO

# "About 8 GB of free memory" (README): k3s, Argo and Docker need the rest.
CPU_BUDGET = Fraction(4)
MEMORY_BUDGET_GIB = Fraction(6)
_UNITS = {"": 1, "m": Fraction(1, 1000), "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(text) -> Fraction:
    """A Kubernetes quantity ("250m", "1536Mi", "2") as a number."""
    number, unit = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text)).groups()
    return Fraction(number) * _UNITS[unit]


def _requests(template: dict) -> tuple[Fraction, Fraction]:
    """(cpu, memory bytes) requested by one pod template's main container."""
    body = template.get("container") or template.get("script") or {}
    requests = body.get("resources", {}).get("requests", {})
    assert requests, f"{template['name']} requests no resources: the scheduler cannot place it"
    return quantity(requests.get("cpu", 0)), quantity(requests.get("memory", 0))


def _depends_on(task: dict, names: set[str]) -> set[str]:
    expr = task.get("depends") or " ".join(task.get("dependencies", []))
    return {n for n in re.findall(r"[a-z0-9][a-z0-9-]*", expr) if n in names}


def _fan(task: dict, params: dict[str, str]) -> int:
    """How many pods a task fans out to: withItems, withSequence's count or withParam's list,
    the workflow parameters (their defaults) substituted."""

    def value(text):
        return re.sub(r"\{\{workflow\.parameters\.([\w-]+)\}\}", lambda m: params[m[1]], str(text))

    if "withSequence" in task:
        return int(value(task["withSequence"]["count"]))
    if "withParam" in task:
        return len(json.loads(value(task["withParam"])))
    return len(task.get("withItems", [None]))


def _peak(templates: dict, name: str, params: dict[str, str]) -> tuple[Fraction, Fraction]:
    """The most a template can request at once: a DAG's largest set of tasks of which no one
    waits for another (a daemon lives on past its dependents), each fan-out times its items."""
    template = templates[name]
    if "dag" not in template:
        return _requests(template)
    tasks = {t["name"]: t for t in template["dag"]["tasks"]}
    after = {n: _depends_on(t, set(tasks)) for n, t in tasks.items()}

    def ancestors(n: str) -> set[str]:
        out = set(after[n])
        for a in after[n]:
            out |= ancestors(a)
        return out

    def ordered(a: str, b: str) -> bool:
        daemon = any(templates[tasks[x]["template"]].get("daemon") for x in (a, b))
        return not daemon and (a in ancestors(b) or b in ancestors(a))

    def need(n: str) -> tuple[Fraction, Fraction]:
        cpu, mem = _peak(templates, tasks[n]["template"], params)
        fan = _fan(tasks[n], params)
        return cpu * fan, mem * fan

    best = (Fraction(0), Fraction(0))
    for size in range(1, len(tasks) + 1):
        for group in itertools.combinations(tasks, size):
            if any(ordered(a, b) for a, b in itertools.combinations(group, 2)):
                continue
            total = tuple(map(sum, zip(*(need(n) for n in group), strict=True)))
            best = tuple(map(max, best, total))
    return best


def _services() -> tuple[Fraction, Fraction]:
    """Requests of deploy/k8s's long-running pods (MinIO, MLflow)."""

    cpu = mem = Fraction(0)
    for path in K8S_DIR.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "Deployment":
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    cpu += quantity(c["resources"]["requests"]["cpu"])
                    mem += quantity(c["resources"]["requests"]["memory"])
    assert cpu and mem
    return cpu, mem


def test_the_default_pipeline_fits_the_readmes_laptop():
    render = pytest.importorskip(
        "ckptflow.workflows.render", reason="workflows (hera) not installed"
    )
    assert "About 8 GB of free memory" in (REPO / "README.md").read_text()
    manifest = render.builder("pipeline").build(render.config([])).to_dict()
    templates = {t["name"]: t for t in manifest["spec"]["templates"]}
    params = {p["name"]: p["value"] for p in manifest["spec"]["arguments"]["parameters"]}
    cpu, mem = _peak(templates, manifest["spec"]["entrypoint"], params)
    exit_cpu, exit_mem = _peak(templates, manifest["spec"]["onExit"], params)
    cpu, mem = max(cpu, exit_cpu), max(mem, exit_mem)
    svc_cpu, svc_mem = _services()
    gib = Fraction(2**30)
    assert cpu + svc_cpu <= CPU_BUDGET, f"{float(cpu)} CPUs + {float(svc_cpu)} for services"
    assert mem + svc_mem <= MEMORY_BUDGET_GIB * gib, (
        f"{float(mem / gib)} GiB + {float(svc_mem / gib)} GiB for services"
    )
    # The README states these numbers.
    readme = " ".join((REPO / "README.md").read_text().split())
    claim = (
        f"requests at most {float(cpu):g} CPUs and {float(mem / gib):g} GiB at once, "
        f"MinIO and MLflow {float(svc_cpu):g} CPUs and {float(svc_mem / gib):g} GiB"
    )
    assert claim in readme, f"README should say: {claim}"


def test_the_peak_counts_pretrainings_concurrent_pods():
    """Ranks (rank 0 hosting the rendezvous) and the evaluator at once; variants side by side."""
    render = pytest.importorskip(
        "ckptflow.workflows.render", reason="workflows (hera) not installed"
    )
    cfg = render.config([])
    spec = render.builder("pipeline").build(cfg).to_dict()["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    params = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}
    p, f = cfg.pretrain, cfg.finetune
    parts = [
        (quantity(r.cpu) * n, quantity(r.memory) * n)
        for r, n in (
            (p.rank_resources, p.ranks),
            (p.evaluator_resources, 1),
        )
    ]
    assert _peak(templates, "pretrain", params) == tuple(map(sum, zip(*parts, strict=True)))
    variants = len(f.lrs) * len(f.freeze_blocks)
    assert _peak(templates, "finetune", params) == (
        quantity(f.resources.cpu) * variants,
        quantity(f.resources.memory) * variants,
    )
