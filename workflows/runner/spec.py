"""The Argo spec validator: refuse, before anything runs, what the local runner cannot do
faithfully in a Workflow / WorkflowTemplate spec (loaded by document.py).

Fields with no meaning on one machine (image, resources, scheduling, pod metadata) are ignored;
fields that change what runs or how (artifacts, configMap/secret volumes, resource templates,
sidecars, synchronization, expression tags...) are refused with an error naming the field and the
template, so a run never silently differs from the cluster.
"""

from __future__ import annotations

import os
from typing import Any

from ckptflow.workflows.runner import depends as dep
from ckptflow.workflows.runner import hooks, podgc
from ckptflow.workflows.runner.artifacts import artifact_problems
from ckptflow.workflows.runner.document import SpecError, _known_parameters
from ckptflow.workflows.runner.expr_check import problems as expression_problems
from ckptflow.workflows.runner.machine import os_problems
from ckptflow.workflows.runner.memo import problems as memo_problems
from ckptflow.workflows.runner.objects import ObjectStore
from ckptflow.workflows.runner.pod_containers import problems as pod_container_problems
from ckptflow.workflows.runner.refs import missing_volume_objects
from ckptflow.workflows.runner.resource import resource_problems
from ckptflow.workflows.runner.spec_leaf import check_container, check_retry, missing_refs
from ckptflow.workflows.runner.substitution import TAG, parse_duration, render, to_str
from ckptflow.workflows.runner.suspend import suspend_problems
from ckptflow.workflows.runner.sync import sync_problems
from ckptflow.workflows.runner.volumes import declared, volume_problems

__all__ = ["SpecError", "validate"]

_SPEC_OK = {"entrypoint", "arguments", "templates", "onExit", "activeDeadlineSeconds"}
_SPEC_OK |= {"hooks"}  # lifecycle hooks (hooks.py)
_SPEC_OK |= {"parallelism", "retryStrategy", "volumes", "volumeClaimTemplates", "synchronization"}
_SPEC_IGNORED = {
    "serviceAccountName", "podGC", "ttlStrategy", "ttlSecondsAfterFinished", "imagePullSecrets",
    "nodeSelector", "tolerations", "affinity", "podMetadata", "workflowMetadata", "archiveLogs",
    "artifactRepositoryRef", "securityContext", "priority", "podPriorityClassName", "podPriority",
    "hostNetwork", "dnsPolicy", "dnsConfig", "executor", "schedulerName", "metrics",
    "automountServiceAccountToken", "podDisruptionBudget", "hostAliases", "volumeClaimGC",
    "artifactGC", "podSpecPatch", "archiveLocation",
    # pod-level resources and DRA claims size and equip a pod on a cluster node; a local task
    # runs with this machine's CPUs, memory and devices, as with `container.resources`
    # (ignored too), so they change where a pod may run, never what it does
    "podResources", "resourceClaims",
}  # fmt: skip
_TEMPLATE_OK = {"name", "inputs", "outputs", "container", "script", "dag", "steps", "daemon"}
_TEMPLATE_OK |= {"retryStrategy", "activeDeadlineSeconds", "timeout", "parallelism", "volumes"}
_TEMPLATE_OK |= {"synchronization", "failFast", "memoize", "suspend"}
_TEMPLATE_OK |= {"resource"}  # against the run's object store (resource.py)
_TEMPLATE_IGNORED = {
    "metadata", "nodeSelector", "tolerations", "affinity", "securityContext",
    "serviceAccountName", "automountServiceAccountToken", "priorityClassName", "priority",
    "podSpecPatch", "schedulerName", "hostAliases", "executor", "metrics", "archiveLocation",
    "podResources", "resourceClaims",  # as in _SPEC_IGNORED
    # not a Template field (pkg/apis/workflow/v1alpha1/workflow_types.go: annotations go in
    # `metadata`): Argo's decoder drops it, so the template runs as if it were not there
    "annotations",
}  # fmt: skip
_POD_CONTAINERS = ("sidecars", "initContainers")  # run in a pod (--isolate): pod_containers.py
_STEP_OK = {"name", "template", "arguments", "when", "withItems", "withParam", "withSequence"}
_STEP_OK |= {"continueOn", "templateRef", "description"}
_STEP_OK |= {"hooks", "onExit"}  # lifecycle hooks and exit handlers (hooks.py)
_TASK_OK = _STEP_OK | {"dependencies", "depends"}

_WHY = {
    "suspend": "a suspend template without a duration waits for a human or an API call",
    "http": "http templates run in the Argo agent",
    "plugin": "executor plugins run in the Argo agent",
    "data": "data templates read artifacts",
    "containerSet": "container sets share one pod",
    "sidecars": "sidecars need a pod: run with --isolate",
    "initContainers": "init containers need a pod: run with --isolate",
    "templateDefaults": "template defaults are not implemented locally",
    "workflowTemplateRef": "give the WorkflowTemplate it names with --template-file FILE",
    "envFrom": "envFrom reads ConfigMaps/Secrets",
    "inline": "inline templates are not implemented locally",
    "suspend-spec": "a suspended workflow waits for an API call",
    "shutdown": "shutdown is an API operation",
}


class _Checker:
    def __init__(
        self,
        spec: dict,
        env: dict[str, str],
        parameters: dict[str, str],
        limits: dict[str, int],
        isolate: bool = False,
        objects: Any = None,
    ) -> None:
        self.spec, self.env, self.errors, self.limits = spec, env, [], limits
        self.isolate = isolate  # tasks run as pods: sidecars and init containers can run
        self.objects = objects  # the run's object store (objects.py): ConfigMaps, Secrets
        # (kind, object name) -> {variable: templates}: said once per object (missing_refs)
        self.refs: dict[tuple[str, str], dict[str, set[str]]] = {}
        # `{{workflow.parameters.X}}` known before the run (e.g. in dag.target)
        self.workflow_values = {f"workflow.parameters.{k}": v for k, v in parameters.items()}
        self.templates = {
            t.get("name"): t for t in spec.get("templates") or [] if isinstance(t, dict)
        }

    def err(self, where: str, field: str, why: str) -> None:
        self.errors.append(f"{where}: {field}: {why}")

    def fields(self, where: str, obj: dict, ok: set, ignored: set = frozenset()) -> None:
        for key in obj:
            if key in ok or key in ignored:
                continue
            self.err(where, key, _WHY.get(key, "not supported by the local runner"))

    def parameters(
        self,
        where: str,
        block: Any,
        *,
        inputs: bool = False,
        kind: str = "arguments",
        value_from: tuple[str, ...] = (),
    ) -> None:
        if block is None:
            return
        if not isinstance(block, dict):
            self.err(where, "parameters", "expected a mapping")
            return
        for field, why in artifact_problems(block.get("artifacts"), kind):
            self.err(where, field, why)
        for key in block:
            if key not in ("parameters", "artifacts"):
                self.err(where, key, "not supported by the local runner")
        for p in block.get("parameters") or []:
            if not isinstance(p, dict) or "name" not in p:
                self.err(where, "parameters", "each parameter needs a name")
                continue
            vf = p.get("valueFrom")
            if vf is not None and inputs:
                self.err(where, f"parameters.{p['name']}.valueFrom", "not supported locally")
            if vf is not None and not inputs:
                for key in vf:
                    if key not in ("path", "default", "parameter", *value_from):
                        self.err(
                            where,
                            f"parameters.{p['name']}.valueFrom.{key}",
                            "not supported locally",
                        )

    def retry(self, where: str, rs: Any) -> None:
        check_retry(self, where, rs)  # spec_leaf.py

    def container(self, where: str, c: Any, *, script: bool) -> None:
        check_container(self, where, c, script=script)  # spec_leaf.py

    def machine(self, where: str, problems: list[tuple[str, str]]) -> None:
        for field, why in problems:  # machine.py: what this machine lacks
            self.err(where, field, why)

    def step(self, where: str, s: Any, ok: set) -> None:
        if not isinstance(s, dict) or "name" not in s:
            self.err(where, "step", "each step/task needs a name")
            return
        sw = f"{where} step/task {s['name']!r}"
        self.fields(sw, s, ok)
        if "template" in s and "templateRef" in s:
            self.err(sw, "templateRef", "give template or templateRef, not both")
        if "templateRef" in s:
            self.err(
                sw, "templateRef", "templates of other WorkflowTemplates cannot be resolved locally"
            )
        elif s.get("template") not in self.templates:
            self.err(sw, "template", f"no template named {s.get('template')!r}")
        self.parameters(sw + " arguments", s.get("arguments"))
        self.hook_fields(sw, s)
        loops = [k for k in ("withItems", "withParam", "withSequence") if s.get(k) is not None]
        if len(loops) > 1:
            self.err(sw, loops[1], f"use only one of {', '.join(loops)}")

    def hook_fields(self, where: str, holder: dict) -> None:
        """`hooks` / `onExit` of the spec or a step/task (hooks.py), their arguments too."""
        for field, why in hooks.problems(holder, self.templates):
            self.err(where, field, why)
        if isinstance(holder.get("hooks"), dict):
            for name, hook in holder["hooks"].items():
                if isinstance(hook, dict):
                    self.parameters(f"{where} hooks.{name} arguments", hook.get("arguments"))

    def dag(self, where: str, d: Any) -> None:
        if not isinstance(d, dict) or not isinstance(d.get("tasks"), list):
            self.err(where, "dag.tasks", "expected a list of tasks")
            return
        self.fields(f"{where} dag", d, {"tasks", "target", "failFast"})
        names = {t.get("name") for t in d["tasks"] if isinstance(t, dict)}
        if len(names) != len(d["tasks"]):
            self.err(where, "dag.tasks", "task names must be unique")
        for t in d["tasks"]:
            self.step(where, t, _TASK_OK)
            if not isinstance(t, dict):
                continue
            tw = f"{where} task {t.get('name')!r}"
            if t.get("depends") and t.get("dependencies"):
                self.err(tw, "depends", "use either depends or dependencies, not both")
            try:
                tree = (
                    dep.parse_depends(str(t["depends"]))
                    if t.get("depends")
                    else dep.from_dependencies(t.get("dependencies") or [])
                )
            except dep.DependsError as exc:
                self.err(tw, "depends", str(exc))
                continue
            for missing in sorted(dep.tasks_in(tree) - names):
                self.err(tw, "depends", f"names unknown task {missing!r}")
        target_text = render(to_str(d.get("target") or ""), self.workflow_values)
        for target in target_text.split():
            if TAG.search(target):
                continue  # e.g. {{inputs.parameters.x}}: checked when the DAG runs
            if target not in names:
                self.err(where, "dag.target", f"unknown task {target!r}")

    def template(self, t: dict) -> None:
        where = f"template {t.get('name')!r}"
        pod_ok = set(_POD_CONTAINERS) if self.isolate else set()
        self.fields(where, t, _TEMPLATE_OK | pod_ok, _TEMPLATE_IGNORED)
        self.template_extras(where, t)
        kinds = [k for k in ("container", "script", "dag", "steps", "resource") if k in t]
        if len(kinds) != 1 and not any(k in t for k in _WHY):
            self.err(where, "container/script/dag/steps", "a template needs exactly one of them")
        self.parameters(f"{where} inputs", t.get("inputs"), inputs=True, kind="inputs")
        self.parameters(
            f"{where} outputs", t.get("outputs"), kind="outputs",
            value_from=("jsonPath", "jqFilter") if "resource" in t
            else ("expression",) if "dag" in t or "steps" in t else (),  # expr.py
        )  # fmt: skip
        if "resource" in t:
            for field, why in resource_problems(t):
                self.err(where, field, why)
        if "container" in t:
            self.container(where, t["container"], script=False)
        if "script" in t:
            self.container(where, t["script"], script=True)
        if "dag" in t:
            self.dag(where, t["dag"])
        if "steps" in t:
            groups = t["steps"]
            if not isinstance(groups, list):
                self.err(where, "steps", "expected a list of step groups")
            for group in groups or []:
                for s in group if isinstance(group, list) else [group]:
                    self.step(where, s, _STEP_OK)
        if "retryStrategy" in t:
            self.retry(where, t["retryStrategy"])
            affinity = (
                (t["retryStrategy"] or {}).get("affinity")
                if isinstance(t["retryStrategy"], dict)
                else None
            )
            if affinity and ("dag" in t or "steps" in t):
                # retry_tweak.go FindRetryNode also applies it to pods below a retried DAG/steps
                self.err(
                    where,
                    "retryStrategy.affinity",
                    "retry affinity on a DAG/steps template is not followed locally; set it on "
                    "its container templates",
                )
        if "synchronization" in t:
            for field, why in sync_problems(t["synchronization"], self.limits):
                self.err(where, field, why)
        self.machine(where, os_problems(t))
        for field, why in [*volume_problems(self.spec, t), *self.object_volumes(t)]:
            self.err(where, field, why)
        for key in ("activeDeadlineSeconds", "timeout"):
            if key in t and "{{" not in to_str(t[key]):  # a parameter's: parsed when it runs
                try:
                    parse_duration(t[key])
                except ValueError as exc:
                    self.err(where, key, str(exc))

    def object_volumes(self, t: dict) -> list[tuple[str, str]]:
        """(field, why) for a secret/configMap volume of `t` (the spec's own with t=spec)
        whose object the store lacks (refs.py)."""
        out = []
        for v in t.get("volumes") or []:
            if isinstance(v, dict) and any(k in v for k in ("secret", "configMap")):
                why = missing_volume_objects(v, self.objects or ObjectStore())
                if why:
                    out.append((f"volumes.{v.get('name')}", why))
        return out

    def template_extras(self, where: str, t: dict) -> None:
        """failFast, memoize, suspend, sidecars and initContainers of a template."""
        if "failFast" in t and "steps" not in t:
            # operator.go checkParallelism also stops a DAG's new tasks; spelled dag.failFast here
            self.err(
                where, "failFast", "followed on steps templates only; on a DAG use dag.failFast"
            )
        if "memoize" in t:
            for field, why in memo_problems(t["memoize"]):
                self.err(where, field, why)
            if (t.get("outputs") or {}).get("artifacts"):
                self.err(
                    where,
                    "memoize",
                    "a memoized template's output artifacts live in one run's repository; "
                    "memoize only templates with output parameters",
                )
        if "suspend" in t:
            for field, why in suspend_problems(t):
                self.err(where, field, why)
        for key in _POD_CONTAINERS:
            if key in t and self.isolate:
                for field, why in pod_container_problems(key, t[key], self.env):
                    self.err(where, field, why)
                known = declared(self.spec, t)
                for c in t[key] if isinstance(t[key], list) else []:
                    for m in (c.get("volumeMounts") or []) if isinstance(c, dict) else []:
                        if not isinstance(m, dict) or m.get("name") not in known:
                            self.err(where, f"{key}.volumeMounts", f"no volume {m!r} declared")

    def run(self) -> list[str]:
        spec = self.spec
        for key in spec:
            if key in _SPEC_OK or key in _SPEC_IGNORED:
                continue
            self.err(
                "spec",
                key,
                _WHY.get(
                    key if key != "suspend" else "suspend-spec", "not supported by the local runner"
                ),
            )
        if not isinstance(spec.get("templates"), list) or not spec["templates"]:
            self.err("spec", "templates", "the manifest has no templates")
            return self.errors
        if len(self.templates) != len(spec["templates"]):
            self.err("spec", "templates", "template names must be unique")
        entry = spec.get("entrypoint")
        if entry not in self.templates:
            self.err("spec", "entrypoint", f"no template named {entry!r}")
        self.hook_fields("spec", spec)
        self.parameters("spec arguments", spec.get("arguments"))
        if "retryStrategy" in spec:
            self.retry("spec", spec["retryStrategy"])
        if "synchronization" in spec:
            for field, why in sync_problems(spec["synchronization"], self.limits):
                self.err("spec", field, why)
        self.machine("spec", os_problems(spec))
        for field, why in podgc.problems(spec):
            self.err("spec", field, why)
        for field, why in [*volume_problems(spec, None), *self.object_volumes(spec)]:
            self.err("spec", field, why)
        for t in spec["templates"]:
            if isinstance(t, dict):
                self.template(t)
        self.missing_refs()
        for where, field, why in expression_problems(spec):  # expr_check.py
            self.err(where, field, why)
        return self.errors

    def missing_refs(self) -> None:
        """One line per Secret or ConfigMap the runner cannot read (spec_leaf.py)."""
        for where, field, why in missing_refs(self.refs):
            self.err(where, field, why)


def validate(
    spec: dict,
    env: dict[str, str] | None = None,
    arguments: dict[str, Any] | None = None,
    semaphores: dict[str, int] | None = None,
    isolate: bool = False,
    objects: Any = None,
) -> None:
    """Raise SpecError listing every unsupported or invalid field of a workflow spec.

    arguments: the workflow parameters given to the run (`-p`), substituted with the spec's own
    values into fields checked here (a `dag.target` of `{{workflow.parameters.target}}`).
    semaphores: the limits of the semaphores (`configmap/key` -> N) the run may use.
    isolate: tasks run as pods, where sidecars and init containers can run.
    objects: the run's object store (objects.py), where ConfigMaps/Secrets are looked up."""
    errors = _Checker(
        spec,
        dict(os.environ if env is None else env),
        _known_parameters(spec, arguments),
        dict(semaphores or {}),
        isolate,
        objects,
    ).run()
    if errors:
        lines = "\n  ".join(dict.fromkeys(errors))
        raise SpecError(f"the manifest cannot run locally:\n  {lines}")
