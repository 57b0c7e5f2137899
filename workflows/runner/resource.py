"""`resource` templates against the cluster model's object store (objects.py).

Argo runs a resource template as a pod whose `argoexec resource ACTION` calls kubectl on the
manifest (workflow/executor/resource.go ExecResource, getKubectlArguments), waits for the
success/failure conditions (WaitResource, matchConditions) and saves output parameters from
`jsonPath`/`jqFilter` (SaveResourceParameters); the controller adds the workflow as owner when
`setOwnerReference` is set (workflow/controller/operator.go executeResource). Here the same
steps run against `run.objects`; kinds with a local controller (controllers.py: Workflow, Job)
change their status as they run, other kinds are only stored.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import yaml
from ckptflow.workflows.runner import artifacts as arts
from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import objects as ob
from ckptflow.workflows.runner.nodes import ERROR, FAILED, RUNNING, SUCCEEDED, Node
from ckptflow.workflows.runner.object_rules import MAX_OBJECT_BYTES, canonical_kind
from ckptflow.workflows.runner.resource_fields import (
    ResourceError,
    conditions_met,
    jq_filter,
    json_path,
    parse_json_path,
)
from ckptflow.workflows.runner.selectors import parse_selector
from ckptflow.workflows.runner.substitution import TAG, substitute, to_str, unresolved

__all__ = [
    "ACTIONS",
    "ResourceError",
    "conditions_met",
    "jq_filter",
    "json_path",
    "owner_reference",
    "parse_flags",
    "resource_problems",
    "run_template",
]

ACTIONS = ("get", "create", "apply", "delete", "replace", "patch")
MERGE_STRATEGIES = ("strategic", "merge", "json")
_RESOURCE_OK = {"action", "manifest", "manifestFrom", "successCondition", "failureCondition"}
_RESOURCE_OK |= {"setOwnerReference", "flags", "mergeStrategy"}
MAX_MANIFEST_BYTES = MAX_OBJECT_BYTES
POLL_S = 0.1  # Argo polls every resourceStateCheckInterval (5 s); the store wakes us sooner
# kinds whose status a local controller writes (controllers.py); others never change by
# themselves, so a condition on their status would wait forever
CONTROLLED = ("Workflow", "Job")


_VALIDATE = ("", "false", "true", "strict", "ignore", "warn")
_IGNORE_NOT_FOUND = ("--ignore-not-found", "--ignore-not-found=true")


def owner_reference(run: cx.Run) -> dict:
    """The workflow as controller owner (metav1.NewControllerRef in operator.go executeResource)."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "name": run.name,
        "uid": run.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def parse_flags(flags: list) -> dict:
    """The kubectl flags a resource template may give, as {"args": [positional...],
    "selector": str|None, "namespace": str|None}; ResourceError naming any other flag.
    `--validate=false` (no schema to validate against here) and `--ignore-not-found` (Argo's
    delete adds it anyway) change nothing locally."""
    out: dict = {"args": [], "selector": None, "namespace": None}
    items = [to_str(f) for f in flags or []]
    i = 0
    while i < len(items):
        flag = items[i]
        name, eq, value = flag.partition("=")
        if name in ("--selector", "-l", "--namespace", "-n"):
            if not eq:
                if i + 1 >= len(items):
                    raise ResourceError(f"flag {flag} needs a value")
                value, i = items[i + 1], i + 1
            out["selector" if name in ("--selector", "-l") else "namespace"] = value
        elif (name == "--validate" and value in _VALIDATE) or flag in _IGNORE_NOT_FOUND:
            pass
        elif flag.startswith("-"):
            raise ResourceError(
                f"kubectl flag {flag!r} is not followed locally (known: --selector/-l, "
                "--namespace/-n, --validate, --ignore-not-found)"
            )
        else:
            out["args"].append(flag)
        i += 1
    if len(out["args"]) > 2:
        raise ResourceError(f"flags name {out['args']}: expected KIND [NAME]")
    return out


def resource_problems(tmpl: dict) -> list[tuple[str, str]]:
    """(field, why) for a resource template the runner cannot follow (checked before the run;
    values with `{{...}}` tags are checked again when it runs)."""
    res = tmpl.get("resource")
    if not isinstance(res, dict):
        return [("resource", "expected a mapping")]
    problems = [(f"resource.{k}", "not supported locally") for k in res if k not in _RESOURCE_OK]
    action = res.get("action")
    if action not in ACTIONS:
        problems.append(("resource.action", f"{action!r} is not one of {', '.join(ACTIONS)}"))
    strategy = res.get("mergeStrategy")
    if strategy is not None and strategy not in MERGE_STRATEGIES:
        problems.append(
            ("resource.mergeStrategy", f"{strategy!r} is not one of {MERGE_STRATEGIES}")
        )
    if not res.get("manifest") and not res.get("flags") and not res.get("manifestFrom"):
        problems.append(("resource", "Must provide at least one of flags or manifest."))
    outputs = (tmpl.get("outputs") or {}).get("parameters") or []
    if action == "delete" and (
        res.get("successCondition") or res.get("failureCondition") or outputs
    ):
        # cmd/argoexec/commands/resource.go execResource
        problems.append(
            (
                "resource",
                "successCondition, failureCondition and outputs are not supported for delete action",
            )
        )
    for key in ("successCondition", "failureCondition"):
        cond = res.get(key)
        if cond and "{{" not in to_str(cond):
            try:
                parse_selector(to_str(cond))
            except ob.Invalid as exc:
                problems.append((f"resource.{key}", str(exc)))
    if "flags" in res and not isinstance(res["flags"], list):
        problems.append(("resource.flags", "expected a list"))
    elif res.get("flags") and "{{" not in json.dumps(res["flags"]):
        try:
            parse_flags(res["flags"])
        except ResourceError as exc:
            problems.append(("resource.flags", str(exc)))
    problems.extend(_kind_problems(res))
    for p in outputs:
        vf = (p or {}).get("valueFrom") or {}
        if vf.get("jsonPath") is not None and "{{" not in to_str(vf["jsonPath"]):
            try:
                parse_json_path(to_str(vf["jsonPath"]))
            except ResourceError as exc:
                problems.append(
                    (f"outputs.parameters.{p.get('name')}.valueFrom.jsonPath", str(exc))
                )
    return problems


def _kind_problems(res: dict) -> list[tuple[str, str]]:
    """A condition on the status of a kind no local controller writes would wait forever."""
    text = TAG.sub("x", to_str(res.get("manifest") or ""))  # tags: known when it runs
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError:
        obj = None
    kind = canonical_kind(obj["kind"]) if isinstance(obj, dict) and obj.get("kind") else None
    if kind is None or kind in CONTROLLED:
        return []
    for key in ("successCondition", "failureCondition"):
        if "status." in to_str(res.get(key) or ""):
            return [
                (
                    f"resource.{key}",
                    f"no controller writes a {kind}'s status locally (only {', '.join(CONTROLLED)} "
                    "run here), so the condition would never change",
                )
            ]
    return []


# -- the executor ----------------------------------------------------------------------------
def _manifest(run: cx.Run, node: Node, res: dict) -> str:
    text = to_str(res.get("manifest") or "")
    if res.get("manifestFrom"):
        name = ((res["manifestFrom"] or {}).get("artifact") or {}).get("name")
        found = [a for a in node.input_artifacts or [] if a.get("name") == name]
        if not found:
            raise ResourceError(f"manifestFrom.artifact {name!r} is not an input artifact")
        text = _read_artifact(run, node, found[0])
    if len(text.encode()) > MAX_MANIFEST_BYTES:
        raise ResourceError(f"the manifest is over {MAX_MANIFEST_BYTES} bytes")
    return text


def _read_artifact(run: cx.Run, node: Node, art: dict) -> str:
    """The text of an input artifact, staged into the node's directory first (artifacts.py)."""
    dest = Path(run.workdir) / "pods" / node.id / "manifest-from" / "manifest"
    dest.parent.mkdir(parents=True, exist_ok=True)
    form = {"inputs": {"artifacts": [{"name": art["name"], "path": str(dest)}]}}
    problem = arts.stage_inputs(run.artifacts, [art], form, dest.parent)
    if problem or not dest.is_file():
        raise ResourceError(f"manifestFrom: {problem or 'the artifact is not a file'}")
    if dest.stat().st_size > MAX_MANIFEST_BYTES:
        raise ResourceError(f"the manifest is over {MAX_MANIFEST_BYTES} bytes")
    return dest.read_text(errors="replace")


def _load(text: str):
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ResourceError(f"the manifest is not valid YAML: {str(exc).splitlines()[0]}") from None
    if len(docs) > 1:
        raise ResourceError("the manifest holds more than one object; give one per template")
    return docs[0] if docs else None


def _target(obj, flags: dict) -> tuple[str, str | None]:
    """(kind, name) a command acts on: the manifest's, else the flags' `KIND [NAME]`."""
    if isinstance(obj, dict) and obj.get("kind"):
        return str(obj["kind"]), (obj.get("metadata") or {}).get("name")
    if not flags["args"]:
        raise ResourceError("the manifest has no kind and the flags name none")
    args = flags["args"]
    kind, _, name = args[0].partition("/")
    return kind, (args[1] if len(args) > 1 else name or None)


def act(run: cx.Run, res: dict, text: str) -> dict | None:
    """Run the template's kubectl command on the store; the object acted on (None for delete).
    ResourceError with the API server's words when it refuses."""
    action = res["action"]
    flags = parse_flags(res.get("flags") or [])
    ns = flags["namespace"]
    obj = _load(text)
    if obj is not None and not isinstance(obj, dict | list):
        raise ResourceError("the manifest is not an object")
    store = run.objects
    try:
        if action in ("create", "apply", "replace"):
            if not isinstance(obj, dict):
                raise ResourceError(f"{action} needs a manifest object")
            if ns:
                obj.setdefault("metadata", {})["namespace"] = ns
            if res.get("setOwnerReference"):
                meta = obj.setdefault("metadata", {})
                meta["ownerReferences"] = [
                    *(meta.get("ownerReferences") or []),
                    owner_reference(run),
                ]
            return {"create": store.create, "apply": store.apply, "replace": store.replace}[action](
                obj
            )
        if action == "patch":
            strategy = res.get("mergeStrategy") or "strategic"
            kind, name = _target(obj if strategy != "json" else None, flags)
            if not name:
                raise ResourceError("patch needs a NAME (in the manifest or the flags)")
            return store.patch(kind, name, obj, strategy, ns)
        kind, name = _target(obj, flags)
        if action == "get":
            if not name:
                raise ResourceError("get needs a NAME (in the manifest or the flags)")
            found = store.get(kind, name, ns)
            if found is None:
                raise ob.NotFound(f'{canonical_kind(kind)} "{name}" not found')
            return found
        # delete: --ignore-not-found is always added (getKubectlArguments)
        names = [name] if name else [
            o["metadata"]["name"] for o in store.list(kind, flags["selector"] or None, ns)
        ]  # fmt: skip
        if not name and not flags["selector"]:
            raise ResourceError("delete needs a NAME or --selector")
        for n in names:
            with contextlib.suppress(ob.NotFound):
                store.delete(kind, n, ns)
        return None
    except ob.ObjectError as exc:
        reason = {ob.AlreadyExists: "AlreadyExists", ob.NotFound: "NotFound"}.get(
            type(exc), "Invalid"
        )
        raise ResourceError(f"Error from server ({reason}): {exc}") from None


def _wait(run: cx.Run, obj: dict, res: dict, scope: cx.Scope) -> str | None:
    """Wait until the conditions hold (None), or why not (a scope's end message)."""
    success, failure = (
        to_str(res.get("successCondition") or ""),
        to_str(res.get("failureCondition") or ""),
    )
    if not success and not failure:
        return None
    kind, name, ns = obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"]
    while True:
        version = run.objects.version
        current = run.objects.get(kind, name, ns)
        if current is None:
            raise ResourceError(
                "The resource has been deleted while its status was still being checked. "
                "Will not be retried"
            )
        if conditions_met(current, success, failure):
            return None
        reason = scope.reason()
        if reason is not None:
            return reason[1]
        run.objects.wait_change(version, POLL_S)


def _outputs(run: cx.Run, obj: dict | None, body: dict) -> dict:
    params = []
    current = (
        run.objects.get(obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"])
        if obj
        else None
    )
    current = current or obj
    for p in (body.get("outputs") or {}).get("parameters") or []:
        vf = p.get("valueFrom") or {}
        if current is None:  # SaveResourceParameters: no object, the default
            value = to_str(vf.get("default") or "")
        elif vf.get("jsonPath") is not None:
            value = json_path(current, to_str(vf["jsonPath"]))
        elif vf.get("jqFilter") is not None:
            value = jq_filter(current, to_str(vf["jqFilter"]))
        else:
            continue
        params.append({"name": p["name"], "value": value})
        if p.get("globalName"):
            run.global_outputs[p["globalName"]] = value
    return {"parameters": params} if params else {}


def _own_pod(run: cx.Run, node: Node) -> None:
    """The pod Argo runs the resource template in (`{{pod.name}}`), visible to patches."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": node.id,
            "labels": {"workflows.argoproj.io/workflow": run.name},
            "annotations": {"workflows.argoproj.io/node-name": node.name},
            "ownerReferences": [owner_reference(run)],
        },
        "status": {"phase": "Running"},
    }
    # a node id that is no object name: nothing can name this pod then
    with contextlib.suppress(ob.ObjectError):
        run.objects.apply(pod)


def run_template(
    run: cx.Run, node: Node, tmpl: dict, values: dict[str, str], scope: cx.Scope, on_daemon
) -> None:
    """One attempt of a resource template as `node` (its Kind `run`)."""
    body = substitute(tmpl, values)
    res = body["resource"]
    missing = unresolved(res)
    if missing:
        run.store.update(node, phase=ERROR, message=f"failed to resolve {missing[0]}")
        return
    problems = resource_problems(body)
    if problems:
        field, why = problems[0]
        run.store.update(node, phase=ERROR, message=f"{field}: {why}")
        return
    try:  # the pod's activeDeadlineSeconds / timeout bound the wait for the conditions
        deadline = cx.template_deadline(body)
    except ValueError as exc:
        run.store.update(node, phase=ERROR, message=str(exc))
        return
    if deadline is not None:
        scope = scope.child(deadline, cx.TEMPLATE_DEADLINE)
    _own_pod(run, node)
    run.store.update(node, phase=RUNNING)
    try:
        obj = act(run, res, _manifest(run, node, res))
        stopped = (
            _wait(run, obj, res, scope) if obj is not None and res["action"] != "delete" else None
        )
        if stopped is not None:
            run.store.update(node, phase=FAILED, message=stopped)
            return
        outputs = _outputs(run, obj, body)
    except ResourceError as exc:
        run.store.update(node, phase=FAILED, message=str(exc))
        return
    finally:
        with contextlib.suppress(ob.ObjectError):
            run.objects.patch("Pod", node.id, {"status": {"phase": "Completed"}}, "merge")
    run.store.update(node, phase=SUCCEEDED, message="", outputs=outputs or None)
