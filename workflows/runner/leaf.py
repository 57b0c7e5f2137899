"""Run a container or script template as a local process, and collect its outputs.

The image is ignored; `command` + `args` run with the template's `env` added to the runner's
environment. Output files a template declares under `/tmp` are private to the node, as they
are to a pod (see `map_tmp`). Under isolation (`run.isolation`) the process is a pod instead
(`isolation.py`): nothing is rewritten, the pod has its own /tmp, volumes and IP.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path

from ckptflow.workflows.runner import artifacts as arts
from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import isolation, nodelifecycle, pod_rules, refs, volumes
from ckptflow.workflows.runner.nodes import ERROR, FAILED, RUNNING, SUCCEEDED, Node
from ckptflow.workflows.runner.pods.podspec import downward_env
from ckptflow.workflows.runner.process import wait_ready
from ckptflow.workflows.runner.substitution import explain, substitute, to_str, unresolved

__all__ = ["run_template"]

_PYTHONS = ("python", "python3")


def _safe(name: str) -> str:
    return re.sub(r"[^\w.()\[\]:,=-]+", "_", name)[:200]


def pod_dir(run: cx.Run, node: Node) -> Path:
    """The node's private directory (its /tmp lives under it)."""
    return Path(run.workdir) / "pods" / node.id


def _private_paths(tmpl: dict) -> dict[str, bool]:
    """The `/tmp` paths a template writes its output parameters to: the file itself when it
    lies directly in /tmp, else its directory (an `--output-dir /tmp/outputs` idiom)."""
    found: dict[str, bool] = {}  # path -> is a directory
    for p in (tmpl.get("outputs") or {}).get("parameters") or []:
        path = str((p.get("valueFrom") or {}).get("path") or "")
        if not path.startswith("/tmp/") or "{{" in path:
            continue
        parent = os.path.dirname(path.rstrip("/"))
        if parent == "/tmp":
            found.setdefault(path, False)
        else:
            found[parent] = True
    return found


def map_tmp(tmpl: dict, root: Path) -> dict:
    """A copy of a container/script template whose output paths under /tmp are the node's own.

    In Argo each pod has its own /tmp; here the files a template declares as outputs (and the
    directory they are in, unless that is /tmp itself) move to `<root>/tmp`, so parallel tasks
    writing `/tmp/out.txt` do not collide and a stale file never becomes an output. Other paths,
    including anything substituted from parameters, keep their meaning.
    """
    paths = _private_paths(tmpl)
    if not paths:
        return tmpl
    for p, is_dir in paths.items():
        target = root / p.lstrip("/")
        (target if is_dir else target.parent).mkdir(parents=True, exist_ok=True)
    return volumes.rewrite_paths(tmpl, {p: str(root) + p for p in paths}, keep=("readinessProbe",))


def working_dir(run: cx.Run, node: Node, container: dict) -> str:
    """Where the task runs: Argo's container starts in its `workingDir`, else its image's,
    `/` by default; a missing one is made (runc libcontainer/rootfs_linux.go prepareRootfs:
    MkdirAll of the process cwd, inside the container's root). Locally the node's own
    directory stands in for `/`, as it does for the node's artifact paths (artifact_paths.py),
    so `open("result.txt", "w")` is the output artifact `/result.txt` and nothing is written in
    the host's `/` or the user's folder. A workingDir that is a directory of this machine (not
    `/`) is used where it is, like an image's own; any other is made in the node's directory.
    `run_workflow(cwd=...)` replaces the default (the local pipeline's runs directory)."""
    root = pod_dir(run, node)
    wanted = to_str(container.get("workingDir") or "")
    if not wanted:
        return run.cwd if run.cwd is not None else str(root)
    # relative: from `/` (a container's cwd is absolute); normpath keeps `..` at the root
    clean = "/" + os.path.normpath("/" + wanted).lstrip("/")
    if clean != "/" and os.path.isdir(clean):
        return clean
    # already the node's (artifact_paths.map_paths maps a workingDir holding an output)
    mapped = clean if clean.startswith(f"{root}/") else str(root) + clean.rstrip("/")
    os.makedirs(mapped, exist_ok=True)  # as the runtime makes a missing workingDir
    return mapped


def _env(run: cx.Run, node: Node, body: dict, container: dict, ip: str) -> dict[str, str]:
    """The runner's environment, the template's env and the downward API (`ip`: the pod's).
    A pod gets a variable the manifest hands out by secretKeyRef/configMapKeyRef only when its
    own env asks for it: from the object store (`--objects`), else the runner's environment
    (validated to hold one or the other)."""
    hidden = run.isolation.secret_names if run.isolation is not None else frozenset()
    env = {k: v for k, v in run.env.items() if k not in hidden}
    for e in container.get("env") or []:
        name, vf = e["name"], e.get("valueFrom")
        stored = refs.env_value(run.objects, vf) if vf is not None else None
        if vf is None:
            env[name] = to_str(e.get("value", ""))
        elif stored is not None:
            env[name] = stored
        elif "fieldRef" not in vf and name in run.env:
            env[name] = run.env[name]
    labels, annotations = isolation.pod_metadata(run, body, node.name)
    env.update(
        downward_env(
            node.id,
            run.namespace,
            ip,
            labels,
            annotations,
            container.get("env"),
            node_name=node.host_node_name or socket.gethostname(),  # spec.nodeName
        )
    )
    return env


def _argv(container: dict, script_path: str | None) -> list[str]:
    argv = [to_str(a) for a in container.get("command") or []]
    if script_path is not None:
        argv.append(script_path)
    argv += [to_str(a) for a in container.get("args") or []]
    if argv and argv[0] in _PYTHONS:
        argv[0] = sys.executable  # `python -m ckptflow.steps.x` must run in this venv
    return argv


def _read(path: str) -> str:
    return Path(path).read_text()


def _collect_outputs(body: dict, stdout: str, ok: bool, read=_read) -> tuple[dict, str | None]:
    """Output parameters (from files, `read`) and result (stdout); an error message if one is
    missing."""
    params, problem = [], None
    for p in (body.get("outputs") or {}).get("parameters") or []:
        vf = p.get("valueFrom") or {}
        if "path" in vf:
            path = to_str(vf["path"])
            try:
                value = read(path)
            except (OSError, RuntimeError) as exc:  # RuntimeError: PodError, a link out
                if vf.get("default") is None:
                    problem = problem or f"failed to read output parameter {p['name']!r}: {exc}"
                    continue
                value = to_str(vf["default"])
        elif p.get("value") is not None:
            value = to_str(p["value"])
        elif vf.get("default") is not None:
            value = to_str(vf["default"])
        else:
            problem = problem or f"output parameter {p['name']!r} has no valueFrom.path"
            continue
        params.append({"name": p["name"], "value": value})
    outputs: dict = {}
    if params:
        outputs["parameters"] = params
    outputs["result"] = stdout[:-1] if stdout.endswith("\n") else stdout
    return outputs, (problem if ok else None)


def _declared(body: dict) -> list[dict]:
    return list((body.get("outputs") or {}).get("parameters") or [])


def _wait_slot(run: cx.Run, scope: cx.Scope) -> bool:
    if run.pod_slots is None:
        return True
    while scope.reason() is None:
        if run.pod_slots.acquire(timeout=0.05):
            return True
    return False


def run_template(
    run: cx.Run, node: Node, tmpl: dict, values: dict[str, str], scope: cx.Scope, on_daemon
) -> None:
    """One attempt of a container/script template as `node` (the leaves' Kind `run`): private
    /tmp paths, substitution, volume mounts, then the process."""
    if run.private_tmp and run.isolation is None:
        tmpl = map_tmp(tmpl, pod_dir(run, node))
    try:  # artifact paths are mapped after substitution, so `-p x=../home` stays in the pod
        paths = arts.resolve_paths(tmpl, pod_dir(run, node), values)  # artifacts.py
        body = arts.map_paths(substitute(tmpl, {**values, **paths}), pod_dir(run, node))
        if run.isolation is None:  # a pod mounts its volumes at their mountPath instead
            mapping = volumes.mounts(run.spec, body, run.workdir, pod_dir(run, node), run.objects)
            body = volumes.apply_mounts(body, mapping)
    except ValueError as exc:  # a path that leaves the node's filesystem: one line
        run.store.update(node, phase=ERROR, message=str(exc))
        return
    missing = unresolved(body, skip=("outputs", "metrics"))  # metrics: ignored, may use {{status}}
    if missing:
        why = explain(missing[0], {**values, **paths})  # an expression's error
        run.store.update(node, phase=ERROR, message=f"failed to resolve {why}")
        return
    if body.get("podSpecPatch") and body.get("container"):  # its env (pod_rules.patched_env)
        try:
            env = pod_rules.patched_env(body["container"], to_str(body["podSpecPatch"]))
        except ValueError as exc:
            run.store.update(node, phase=ERROR, message=str(exc))
            return
        body = {**body, "container": {**body["container"], "env": env}}
    try:  # from the substituted body: `timeout: "{{inputs.parameters.timeout}}"`
        deadline = cx.template_deadline(body)
    except ValueError as exc:
        run.store.update(node, phase=ERROR, message=str(exc))
        return
    run_leaf(run, node, body, scope, deadline, on_daemon)


def run_leaf(run: cx.Run, node: Node, body: dict, scope: cx.Scope, deadline_s, on_daemon) -> None:
    """Run the process of a substituted container/script template as `node`."""
    # until the pod is bound it waits in the scope without its own activeDeadlineSeconds
    # (pod_rules.pending_scope); that deadline counts from the pod's start on its node
    pending = pod_rules.pending_scope(body, scope)
    if not _wait_slot(run, pending):
        run.store.update(node, phase=FAILED, message=pending.reason()[1])
        return
    try:
        if run.isolation is None and not pod_rules.bind_this_machine(run, node, body, pending):
            return  # no cluster model: one node, this machine (pod_rules.py)
        # under the cluster model the pod waits Pending until the scheduler binds it
        if run.scheduler is None or isolation.bind_pod(run, node, body, pending):
            own = (
                pending.child(deadline_s, cx.TEMPLATE_DEADLINE)
                if deadline_s is not None
                else pending
            )
            try:
                _run_process(run, node, body, own, on_daemon)
            finally:
                if run.scheduler is not None:
                    run.scheduler.release(node.id)  # its requests return to its node
    finally:
        if run.pod_slots is not None:
            run.pod_slots.release()


def _spawn(run: cx.Run, node: Node, body: dict, container: dict):
    """Start the attempt's process (or pod); (proc, env, cwd), or None when it cannot start
    (the node is then Error)."""
    root = pod_dir(run, node)
    root.mkdir(parents=True, exist_ok=True)
    script_path = None
    if "script" in body:
        script_path = str(root / "script")
        Path(script_path).write_text(to_str(container.get("source", "")))
        # Argo's script file is executable: `command: [sh, -c]` runs it by its path
        os.chmod(script_path, 0o755)
    problem = arts.stage_inputs(run.artifacts, node.input_artifacts, body, root)
    if problem:
        run.store.update(node, phase=ERROR, message=problem)
        return
    argv = _argv(container, script_path)
    iso = run.isolation
    ip = iso.node.new_ip() if iso is not None else cx.LOCAL_IP  # a new IP for every attempt
    cwd = working_dir(run, node, container)
    log_path = str(Path(run.workdir) / "logs" / f"{_safe(node.name)}.log")
    node.log_file = log_path
    try:
        env = _env(run, node, body, container, ip)
        if iso is None:
            proc = run.registry.spawn(argv, env, cwd, log_path)
        else:
            proc = isolation.start(
                run, node, body, argv, env, cwd, log_path, ip, script_path, own_dir=str(root)
            )
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: PodError, stopping
        run.store.update(node, phase=ERROR, message=f"failed to start {argv[0]!r}: {exc}")
        return None
    run.store.update(node, phase=RUNNING, pod_ip=ip)
    return proc, env, cwd


def _run_process(run: cx.Run, node: Node, body: dict, scope: cx.Scope, on_daemon) -> None:
    container = body.get("container") or body.get("script")
    started = _spawn(run, node, body, container)
    if started is None:
        return
    proc, env, cwd = started
    evicted = isolation.watch_pod(run, node, body, proc)  # --fail-node (nodelifecycle.py)
    reason = None
    try:
        try:
            reason = _supervise(
                run, node, body, container, proc, env, cwd, scope, on_daemon, evicted
            )
        finally:
            if proc.poll() is None and not _lost(reason):
                proc.stop(run.registry.grace)
            run.registry.release(proc)
        if _lost(reason):  # Argo saw its pod deleted; no exit code, no outputs
            run.store.update(node, phase=ERROR, message=reason[1])
            return
        _record(run, node, body, proc, reason)
    finally:
        if run.isolation is not None and not _lost(reason):
            proc.release()  # after its outputs were read: processes, mounts, veth, files
        # an evicted pod stays frozen on its lost node until the run ends (Isolation.close)


def _lost(reason) -> bool:
    return reason is not None and reason[0] == nodelifecycle.EVICTED


def _record(run: cx.Run, node: Node, body: dict, proc, reason) -> None:
    """The outcome of an ended process (or pod): phase, message, outputs, exit code."""
    stdout = proc.finish()
    rc = proc.poll()
    rc = 128 - rc if rc is not None and rc < 0 else rc
    pod = run.isolation is not None
    read = isolation.output_reader(proc) if pod else _read
    outputs, problem = _collect_outputs(body, stdout, ok=(rc == 0 and reason is None), read=read)
    failed = isolation.exit_message(proc, rc) if pod else f"Error (exit code {rc})"
    phase, message = pod_rules.pod_succeeded(body) if rc == 0 else (FAILED, failed)
    if reason is not None:
        kind, text = reason
        stopped_daemon = kind == cx.SCOPE_END and node.daemoned
        if kind == cx.DEADLINE:
            text = "Step exceeded its deadline"
        phase, message = (SUCCEEDED, "") if stopped_daemon else (FAILED, text)
    elif problem:
        phase, message = ERROR, problem
    if phase == SUCCEEDED:
        phase, message = _save_artifacts(run, node, body, outputs)
    if phase == SUCCEEDED:
        for spec, got in zip(_declared(body), outputs.get("parameters") or [], strict=False):
            if spec.get("globalName"):
                run.global_outputs[spec["globalName"]] = got["value"]
    if rc is not None:
        outputs["exitCode"] = str(rc)  # where Argo records it
    run.store.update(node, phase=phase, message=message, outputs=outputs, exit_code=rc)


def _save_artifacts(run: cx.Run, node: Node, body: dict, outputs: dict) -> tuple[str, str]:
    """Save the output artifacts of a successful pod (artifacts.py); Error if one is missing."""
    saved, problem = arts.save_outputs(
        run.artifacts, run.name, node.id, body, str(pod_dir(run, node) / ".artifacts")
    )
    if saved:
        outputs["artifacts"] = saved
        arts.export(run.global_artifacts, body, saved)
    return (ERROR, problem) if problem else (SUCCEEDED, "")


def _supervise(run, node, body, container, proc, env, cwd, scope, on_daemon, evicted=None):
    """Wait for the process; return why it was stopped early (kind, message) or None.
    `evicted()`: whether its pod was deleted off a lost node (then it is left as it is)."""
    if body.get("daemon"):
        probe = container.get("readinessProbe")
        if probe is not None and run.isolation is not None:
            probe = isolation.pod_probe(probe, proc)  # the pod's IP, inside its namespaces
        ready = probe is None or wait_ready(
            probe, proc, container.get("ports") or [], env, cwd, lambda: scope.reason() is not None
        )
        if ready and proc.poll() is None:
            run.store.update(node, daemoned=True)
            if on_daemon is not None:
                on_daemon(node)
    while proc.poll() is None:
        reason = scope.reason()
        if reason is not None:
            proc.stop(run.registry.grace)
            return reason
        if evicted is not None and evicted():
            return nodelifecycle.EVICTED, nodelifecycle.ARGO_POD_DELETED
        time.sleep(0.02)
    return None
