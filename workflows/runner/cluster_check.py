"""What would hang or be rejected on a cluster, found before submit (`ckptflow check`).

For each pod template of the manifests (Workflow, WorkflowTemplate, CronWorkflow): a pod that
fits no node, a gang larger than the cluster (a gang scheduler's pod group read by the runner's
own rule, gang.py, its PodGroup from the manifest's resource templates; or a torchrun fan-out),
a gang whose PodGroup is missing or asks more pods than the task makes, a retry with node
anti-affinity that runs out of
nodes, a memory-backed /dev/shm above the memory limit, and `restricted` Pod Security Standard
violations (pss.py); for each Sensor and service account, whether `deploy/` creates what it
needs. Placement uses the runner's own scheduler filters (placement.py) on an empty cluster.

Workflow parameters are their defaults unless given (`-p`); a field that still holds a
`{{...}}` after that is not known before submit and is not judged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from ckptflow.workflows.runner import gang as gangs
from ckptflow.workflows.runner import pss
from ckptflow.workflows.runner.cluster import MEMORY, Cluster, resource_units
from ckptflow.workflows.runner.placement import node_reasons, place, pod_request

__all__ = ["check_manifests", "deploy_objects"]

WORKFLOW_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")
MAX_DEPLOY_FILES, MAX_DEPLOY_BYTES = 200, 1 << 20
MAX_MANIFEST = 1 << 20  # characters of one resource template's manifest read for a PodGroup
MAX_GANG = 10_000
_PARAM = re.compile(r"\{\{\s*(workflow|inputs)\.parameters\.([\w.-]+)\s*\}\}")


def deploy_objects(root: str) -> tuple[list[dict], str]:
    """(every YAML object under `root`, the text of its files): what `deploy/` creates."""
    objects, texts = [], []
    files = sorted(p for p in Path(root).rglob("*") if p.is_file())[:MAX_DEPLOY_FILES]
    for path in files:
        if path.stat().st_size > MAX_DEPLOY_BYTES:
            continue
        text = path.read_text(errors="replace")
        texts.append(text)
        if path.suffix in (".yaml", ".yml"):
            try:
                objects += [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
            except yaml.YAMLError:
                continue
    return objects, "\n".join(texts)


def _spec(doc: dict) -> dict:
    spec = doc.get("spec") or {}
    return (spec.get("workflowSpec") or {}) if doc.get("kind") == "CronWorkflow" else spec


def _substitute(tmpl: dict, wf_params: dict[str, str]) -> dict:
    """The template with workflow parameters and its own input defaults filled in."""
    inputs = {
        str(p.get("name")): str(p.get("value", p.get("default")))
        for p in (tmpl.get("inputs") or {}).get("parameters") or []
        if isinstance(p, dict) and (p.get("value", p.get("default")) is not None)
    }

    def fill(match: re.Match) -> str:
        values = wf_params if match.group(1) == "workflow" else inputs
        value = values.get(match.group(2))
        return match.group(0) if value is None else json.dumps(value)[1:-1]

    return json.loads(_PARAM.sub(fill, json.dumps(tmpl)))


def _known(obj) -> bool:
    return "{{" not in json.dumps(obj)


def _unplaceable(name: str, req, cluster: Cluster) -> list[str]:
    where, why = place(cluster, req, {})
    return [] if where else [f"template {name}: its pod fits no node: {why}"]


def _retry(name: str, tmpl: dict, req, cluster: Cluster) -> list[str]:
    """Argo adds each failed attempt's node to a required node anti-affinity of the next
    (workflow/controller/retry_tweak.go RetryOnDifferentHost): retry k needs k+1 nodes."""
    retry = tmpl.get("retryStrategy") or {}
    if not isinstance(retry.get("affinity"), dict) or "nodeAntiAffinity" not in retry["affinity"]:
        return []
    limit = retry.get("limit")
    eligible = sum(1 for n in cluster.nodes if not node_reasons(req, n, {}))
    if limit is None or not _known(limit):
        attempts = None
    else:
        try:
            attempts = int(str(limit)) + 1
        except ValueError:
            return [f"template {name}: retryStrategy.limit {limit!r} is not a number"]
    if eligible == 0 or (attempts is not None and attempts <= eligible):
        return []
    need = "an unlimited number of" if attempts is None else f"{attempts}"
    return [
        f"template {name}: retryStrategy.affinity.nodeAntiAffinity needs {need} nodes for its "
        f"attempts but {eligible} fit the pod: retry {eligible} would stay Pending forever "
        "(drop the retry affinity or add nodes)"
    ]


def _shm(name: str, tmpl: dict, spec: dict) -> list[str]:
    """A memory-backed emptyDir counts against the container's memory limit (the kubelet's
    tmpfs accounting, pkg/volume/emptydir): a sizeLimit above it OOM-kills the pod once full."""
    container = tmpl.get("container") or tmpl.get("script") or {}
    limit = ((container.get("resources") or {}).get("limits") or {}).get(MEMORY)
    if limit is None or not _known(limit):
        return []
    volumes = {
        v.get("name"): v for v in [*(spec.get("volumes") or []), *(tmpl.get("volumes") or [])]
    }
    out = []
    for mount in container.get("volumeMounts") or []:
        empty = (volumes.get(mount.get("name")) or {}).get("emptyDir") or {}
        size = empty.get("sizeLimit")
        if empty.get("medium") != "Memory" or size is None or not _known(size):
            continue
        try:
            above = resource_units(MEMORY, size, "sizeLimit") > resource_units(
                MEMORY, limit, "limit"
            )
        except ValueError as exc:
            out.append(f"template {name}: {exc}")
            continue
        if above:
            out.append(
                f"template {name}: emptyDir {mount.get('name')!r} at {mount.get('mountPath')} "
                f"(medium Memory, sizeLimit {size}) is above the memory limit {limit}: filling it "
                "OOM-kills the pod"
            )
    return out


def _nnodes(tmpl: dict) -> bool:
    """Pods that must all run at once without a gang scheduler: torchrun's `--nnodes` (its
    rendezvous waits for every node)."""
    container = tmpl.get("container") or tmpl.get("script") or {}
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    return any(w.startswith("--nnodes") for w in words)


def _fan_out(task: dict) -> int | None:
    """How many pods a task's withSequence/withItems/withParam makes, if known before submit."""
    if isinstance(task.get("withItems"), list):
        return len(task["withItems"])
    seq = task.get("withSequence")
    try:
        if isinstance(seq, dict) and _known(seq):
            if "count" in seq:
                return int(str(seq["count"]))
            return int(str(seq.get("end", 0))) - int(str(seq.get("start", 0))) + 1
        if isinstance(task.get("withParam"), str) and _known(task["withParam"]):
            items = json.loads(task["withParam"])
            return len(items) if isinstance(items, list) else None
    except ValueError:
        return None
    return None


class _PodGroups:
    """The PodGroups the manifest's own `resource` templates create or apply (workflow
    parameters filled in), read as the runner reads its object store (gang.pod_group_size)."""

    def __init__(self, spec: dict, wf_params: dict[str, str], namespace: str):
        self.namespace, self.groups = namespace, {}
        for raw in spec.get("templates") or []:
            res = raw.get("resource") if isinstance(raw, dict) else None
            if not isinstance(res, dict) or res.get("action") not in ("create", "apply"):
                continue
            text = _substitute(raw, wf_params)["resource"].get("manifest")
            if not isinstance(text, str) or len(text) > MAX_MANIFEST:
                continue
            try:
                obj = yaml.safe_load(text)
            except yaml.YAMLError:  # a parameter still unknown: not judged
                continue
            if isinstance(obj, dict) and obj.get("kind") == "PodGroup":
                self.groups[str((obj.get("metadata") or {}).get("name"))] = obj

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        return self.groups.get(name) if kind == "PodGroup" else None


def _gang_size(task: dict, req, count: int | None, groups: _PodGroups) -> tuple[int | None, list]:
    """(how many pods of `task` must be bound together, problems): a gang scheduler's size
    (gang.py, the runner's own rule), else the fan-out of a torchrun template."""
    name, template = task.get("name"), task.get("template")
    if req.gang is None:
        return count, []
    size, why = gangs.pod_group_size(req.gang, groups)
    if size is None:
        return None, [
            f"task {name}: {why}: the manifest does not create it, so its pods stay Pending"
        ]
    if count is not None and size > count:
        return None, [
            f"task {name}: {req.gang} needs {size} pods bound together but the task makes "
            f"{count} {template} pods: none of them is ever bound"
        ]
    return size, []


def _gangs(
    spec: dict, pods: dict, cluster: Cluster, wf_params: dict[str, str], namespace: str
) -> list[str]:
    """Each gang must fit the cluster at once (first fit, as binding): a gang scheduler's pod
    group (its size), or a fan-out of a torchrun template (all its pods)."""
    out = []
    groups = _PodGroups(spec, wf_params, namespace)
    for raw in spec.get("templates") or []:
        tmpl = _substitute(raw, wf_params) if isinstance(raw, dict) else {}
        tasks = list((tmpl.get("dag") or {}).get("tasks") or [])
        tasks += [s for group in tmpl.get("steps") or [] for s in (group or [])]
        for task in tasks:
            req, body = pods.get(task.get("template"), (None, None))
            if req is None or (req.gang is None and not _nnodes(body)):
                continue
            count, problems = _gang_size(task, req, _fan_out(task), groups)
            out += problems
            if count is None or count < 2:
                continue
            what = f"{req.gang} of {count}" if req.gang else f"a gang of {count}"
            used: dict[str, dict[str, int]] = {}
            for placed in range(min(count, MAX_GANG)):
                where, why = place(cluster, req, used)
                if where is None:
                    if placed:
                        out.append(
                            f"task {task.get('name')}: {what} {task.get('template')} "
                            f"pods must run together but the cluster holds {placed} at once: {why}"
                        )
                    break
                node_used = used.setdefault(where, {})
                for rname, units in {**req.requests, "pods": 1}.items():
                    node_used[rname] = node_used.get(rname, 0) + units
    return out


def _gang_known(tmpl: dict) -> dict:
    """The template, without its metadata when a Kueue group's size is not known before submit
    (a parameter without a value): such a gang is not judged."""
    annotations = (tmpl.get("metadata") or {}).get("annotations") or {}
    if _known(annotations.get(gangs.KUEUE_COUNT_ANNOTATION, "")):
        return tmpl
    return {k: v for k, v in tmpl.items() if k != "metadata"}


def _pod_templates(doc: dict, params: dict[str, str], cluster: Cluster) -> list[str]:
    spec = _spec(doc)
    wf_params = {
        str(p.get("name")): str(p["value"])
        for p in (spec.get("arguments") or {}).get("parameters") or []
        if isinstance(p, dict) and p.get("value") is not None
    }
    wf_params.update(params)
    namespace = str((doc.get("metadata") or {}).get("namespace") or "default")
    problems, pods = [], {}
    for raw in spec.get("templates") or []:
        if not isinstance(raw, dict) or not any(
            k in raw for k in ("container", "script", "containerSet")
        ):
            continue
        tmpl, name = _substitute(raw, wf_params), str(raw.get("name"))
        placement = {k: tmpl.get(k) for k in ("nodeSelector", "tolerations", "affinity")}
        container = tmpl.get("container") or tmpl.get("script") or {}
        if _known([placement, container.get("resources"), spec.get("affinity")]):
            try:
                req = pod_request(name, _gang_known(tmpl), spec, namespace)
            except ValueError as exc:
                problems.append(f"template {name}: {exc}")
            else:
                pods[name] = (req, tmpl)
                problems += _unplaceable(name, req, cluster) or _retry(name, tmpl, req, cluster)
        problems += _shm(name, tmpl, spec)
        violations = pss.restricted_violations(tmpl, spec)
        if violations:
            problems.append(
                f'template {name}: violates PodSecurity "restricted:latest": {", ".join(violations)}'
            )
    return problems + _gangs(spec, pods, cluster, wf_params, namespace)


def _has(objects: list[dict], kind: str, name: str) -> bool:
    return any(
        o.get("kind") == kind and (o.get("metadata") or {}).get("name") == name for o in objects
    )


def _accounts(doc: dict, deploy: tuple[list[dict], str], deploy_dir: str) -> list[str]:
    """Service accounts and Argo Events objects the manifest needs that deploy/ does not make."""
    objects, text = deploy
    meta = doc.get("metadata") or {}
    kind, name = doc.get("kind"), meta.get("name") or meta.get("generateName")
    out, accounts = [], []
    if kind == "Sensor":
        spec = doc.get("spec") or {}
        accounts.append((spec.get("template") or {}).get("serviceAccountName"))
        bus = spec.get("eventBusName") or "default"
        if "argo-events" not in text:
            out.append(
                f"Sensor {name}: {deploy_dir} does not install Argo Events (the Sensor kind)"
            )
        if not _has(objects, "EventBus", bus):
            out.append(f"Sensor {name}: EventBus {bus!r} is not created by {deploy_dir}")
    else:
        spec = _spec(doc)
        accounts.append(spec.get("serviceAccountName"))
        accounts += [
            t.get("serviceAccountName") for t in spec.get("templates") or [] if isinstance(t, dict)
        ]
    for account in dict.fromkeys(a for a in accounts if a and a != "default"):
        if not _has(objects, "ServiceAccount", account):
            out.append(f"{kind} {name}: service account {account!r} is not created by {deploy_dir}")
    return out


def check_manifests(
    docs: list[dict],
    cluster: Cluster,
    deploy: tuple[list[dict], str],
    deploy_dir: str = "deploy/",
    params: dict[str, str] | None = None,
) -> list[str]:
    """One line per problem the manifests `docs` would meet on `cluster` ([] when none)."""
    problems = []
    for doc in docs:
        if doc.get("kind") in WORKFLOW_KINDS:
            problems += _pod_templates(doc, dict(params or {}), cluster)
        if doc.get("kind") in (*WORKFLOW_KINDS, "Sensor"):
            problems += _accounts(doc, deploy, deploy_dir)
    return list(dict.fromkeys(problems))
