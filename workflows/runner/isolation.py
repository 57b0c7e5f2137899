"""Tasks as pods: the glue between the runner's leaves and `pods` (`run_workflow(isolate=True)`,
`ckptflow run FILE --isolate`).

Under isolation each container/script attempt (daemons too) becomes a pod of one `Node`
per run: its own network namespace and IP on the node's bridge (a new one per attempt, known
before the start so `status.podIP` and `{{tasks.X.ip}}` are that address), its own hostname
(the pod name), its own `/tmp`, `/dev/shm` and volumes as real mounts at their `mountPath`, and
the memory/cpu limits of `resources.limits`. Nothing is rewritten: the template's paths mean
what they mean in a container. Outputs are read from the pod's storage after it ended
(`Pod.path`), then the pod is released. What a process-mode task inherits from the runner's
environment a pod gets too (there is no image), except the variables the manifest delivers by
`secretKeyRef`/`configMapKeyRef`: a pod sees those only where its own `env` asks for them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ckptflow.workflows.runner import placement, pod_containers, refs, volumes
from ckptflow.workflows.runner.context import DEADLINE
from ckptflow.workflows.runner.nodes import ERROR, FAILED
from ckptflow.workflows.runner.pods import (
    NetError,
    Node,
    PodError,
    Volume,
    available,
    parse_quantity,
)
from ckptflow.workflows.runner.substitution import to_str

__all__ = [
    "Isolation",
    "IsolationError",
    "bind_pod",
    "new_node",
    "open_isolation",
    "pod_hostname",
    "pod_probe",
    "watch_pod",
]

# Paths a pod has of its own: a runner directory there (a script, the cwd) must be shared
# explicitly or the pod does not see it.
POD_OWN = ("/tmp", "/dev/shm")
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"


class IsolationError(RuntimeError):
    """`--isolate` cannot work here; the message is one line naming what is missing."""


@dataclass
class Isolation:
    """The pods backend of one run: the node, and whether the run owns (closes) it."""

    node: Node
    owned: bool
    secret_names: frozenset[str]  # delivered only through a template's own env entry
    lifecycle: object = None  # nodelifecycle.NodeLifecycle of `--fail-node`, else None

    def close(self) -> None:
        """Release every pod and, when the run created it, the node (bridge, cgroups, mounts);
        pods frozen on a lost node (nodelifecycle.py) are thawed and killed with the rest."""
        if self.lifecycle is not None:
            self.lifecycle.stop()  # it freezes nothing more while the pods go
        if self.owned:
            self.node.close()
        else:
            for pod in self.node.pods():
                pod.release()


def _secret_names(spec: dict) -> frozenset[str]:
    names = set()
    for tmpl in spec.get("templates") or []:
        for key in ("container", "script"):
            for e in (tmpl.get(key) or {}).get("env") or []:
                vf = e.get("valueFrom") or {}
                if "secretKeyRef" in vf or "configMapKeyRef" in vf:
                    names.add(e["name"])
    return frozenset(names)


def new_node() -> Node:
    """A pod node for one run; IsolationError (one line) where pods cannot work here."""
    why = available()
    if why:
        raise IsolationError(f"--isolate: {why} (without --isolate tasks run as processes)")
    try:
        return Node()
    except (OSError, PodError, NetError) as exc:
        raise IsolationError(f"--isolate: cannot create the pod node: {exc}") from exc


def open_isolation(spec: dict, node: Node | None = None) -> Isolation:
    """The isolation of a run: `node` if given (the caller closes it), else a new Node."""
    if node is None:
        return Isolation(new_node(), True, _secret_names(spec))
    return Isolation(node, False, _secret_names(spec))


def pod_hostname(pod_name: str) -> str:
    """The pod's hostname: its name cut to 63 characters, as Kubernetes does."""
    name = re.sub(r"[^A-Za-z0-9.-]", "-", pod_name)[:63].strip("-.")
    return name or "pod"


def pod_metadata(run, tmpl: dict, node_name: str) -> tuple[dict, dict]:
    """(labels, annotations) of a pod: spec.podMetadata, then the template's metadata."""
    labels = {WORKFLOW_LABEL: run.name}
    annotations = {"workflows.argoproj.io/node-name": node_name}
    for meta in ((run.spec.get("podMetadata") or {}), (tmpl.get("metadata") or {})):
        labels.update({k: to_str(v) for k, v in (meta.get("labels") or {}).items()})
        annotations.update({k: to_str(v) for k, v in (meta.get("annotations") or {}).items()})
    return labels, annotations


def _hidden(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in POD_OWN)


def _below(path: str, top: str | None) -> bool:
    return top is not None and (path == top or path.startswith(top.rstrip("/") + "/"))


def pod_volumes(
    run, body: dict, extra: list[str], shared: list[str] = (), host: str | None = None
) -> list[Volume]:
    """The pod's mounts: the template's volumeMounts at their mountPath (emptyDir as its own
    storage, gone with the pod; a claim's directory shared by the run; a hostPath the
    directory of the pod's node `host`, volumes.node_host_path), the `shared` runner directories
    read-write at their own path (the node's directory, where its artifacts and the `/` it
    works in lie, leaf.working_dir; the caller's `cwd`): the pod's own root is an overlay whose
    writes never reach the host (podinit.overlay_root); plus `extra` runner directories at
    their own path (read-only: a script, or a cwd the pod's /tmp would cover)."""
    known = volumes.declared(run.spec, body)
    out = []
    for m in pod_containers.volume_mounts(body):  # its sidecars' and init containers' too
        vol, name = known[m["name"]], m["name"]
        read_only = bool(m.get("readOnly"))
        if "emptyDir" in vol:
            if m.get("subPath"):
                raise ValueError(f"volume {name}: an emptyDir subPath is not supported in a pod")
            empty = vol.get("emptyDir") or {}
            size = empty.get("sizeLimit")
            out.append(
                Volume(
                    str(m["mountPath"]),
                    memory=empty.get("medium") == "Memory",
                    size_limit=None if size is None else parse_quantity(size, "sizeLimit"),
                    read_only=read_only,
                    name=name,
                )
            )
            continue
        if any(k in vol for k in volumes.PROJECTED):  # its object's keys as files (refs.py)
            local = Path(run.workdir) / "projected" / name
            refs.project_volume(vol, run.objects, local)  # ValueError: the object is gone
            read_only = True
        elif "hostPath" in vol:  # the node's own directory: per node, outlives the pod
            local = volumes.node_host_path(run.workdir, host or "", vol["hostPath"])
        else:
            local = Path(run.workdir) / "volumes" / vol["persistentVolumeClaim"]["claimName"]
        if m.get("subPath"):
            local = volumes.subpath(local, str(m["subPath"]))  # ValueError: leaves the volume
        local.mkdir(parents=True, exist_ok=True)
        out.append(Volume(str(m["mountPath"]), host_path=str(local), read_only=read_only))
    taken = {v.target for v in out}
    for path in shared:
        if path not in taken:
            out.append(Volume(path, host_path=path, read_only=False, name="node"))
            taken.add(path)
    for path in extra:
        if path not in taken and not any(_below(path, s) for s in shared):
            out.append(Volume(path, host_path=path, read_only=True, name="runner"))
    return out


def _limits(container: dict) -> tuple[str | None, str | None]:
    limits = (container.get("resources") or {}).get("limits") or {}
    memory, cpu = limits.get("memory"), limits.get("cpu")
    return (None if memory is None else to_str(memory)), (None if cpu is None else to_str(cpu))


def start(
    run, node, body: dict, argv, env, cwd: str, log_path: str, ip: str, script: str | None,
    own_dir: str | None = None,
):  # fmt: skip
    """Start one attempt of `node` as a pod with address `ip`; register it with the run's
    process registry (so Ctrl-C and deadlines stop it). PodError/ValueError if it cannot.
    `own_dir`: the node's directory (its script, its artifact paths, the `/` it works in:
    leaf.working_dir), shared read-write: the pod's own `/` keeps what it writes elsewhere."""
    container = body.get("container") or body.get("script")
    shared = [own_dir] if own_dir else []
    if run.cwd not in (None, "/") and not _below(run.cwd, own_dir):
        shared.append(run.cwd)  # run_workflow(cwd=): what tasks write there is the caller's
    extra = [os.path.dirname(script)] if script else []
    if _hidden(cwd) and not any(_below(cwd, d) for d in shared):
        extra.append(cwd)  # a workingDir of this machine under /tmp: seen, read-only
    security = container.get("securityContext") or {}
    memory, cpu = _limits(container)
    pod = run.isolation.node.start_pod(
        node.id,
        argv,
        env,
        cwd,
        hostname=pod_hostname(node.id),
        volumes=pod_volumes(run, body, extra, shared, node.host_node_name),
        memory_limit=memory,
        cpu_limit=cpu,
        log_path=log_path,
        ip=ip,
        containers=pod_containers.container_specs(body, env, cwd, run.registry.grace),
        read_only_root=security.get("readOnlyRootFilesystem") is True,
    )
    try:
        run.registry.add(pod)
    except RuntimeError:
        pod.release()
        raise
    return pod


def bind_pod(run, node, body: dict, scope) -> bool:
    """Ask the run's scheduler (scheduler.py) for a node for `node`'s pod and wait, Pending with
    the scheduler's message, until it is bound (True, `hostNodeName` set) or `scope` ends (False,
    the node Failed with the scope's reason, as a pending pod past its deadline is; a gang's pod
    keeps its last Pending line after it). A pod the scheduler cannot read is Error."""
    try:
        request = placement.pod_request(node.id, body, run.spec, run.namespace, node.created)
    except ValueError as exc:
        run.store.update(node, phase=ERROR, message=str(exc))
        return False
    pending = [""]

    def on_pending(message: str) -> None:
        pending[0] = message
        run.store.update(node, message=message)

    host = run.scheduler.bind(node.id, request, lambda: scope.reason() is not None, on_pending)
    if host is None:  # a Pending pod past a deadline fails as a running one does (leaf._record)
        kind, text = scope.reason()
        message = "Step exceeded its deadline" if kind == DEADLINE else text
        if request.gang is not None and pending[0]:
            # the one line that says which gang did not fit and what capacity it lacked
            message = f"{message}: {pending[0]}"
        run.store.update(node, phase=FAILED, message=message)
        return False
    run.store.update(node, host_node_name=host, message="")
    return True


def watch_pod(run, node, body: dict, pod):
    """Tell the run's node lifecycle (`--fail-node`, nodelifecycle.py) that `node`'s pod runs
    on its host with its tolerations (its own, else the workflow's, as workflowpod.go builds
    the pod); return how to ask whether it was evicted, or None when no node is failed."""
    lifecycle = run.isolation.lifecycle if run.isolation is not None else None
    if lifecycle is None:
        return None
    tolerations = body.get("tolerations") or run.spec.get("tolerations") or []
    lifecycle.pod_started(node.name, node.host_node_name, pod, tolerations)
    return lambda: lifecycle.evicted(node.name)


def pod_probe(probe: dict, pod) -> dict:
    """A readiness probe aimed at the pod: TCP/HTTP at its IP, exec inside its namespaces."""
    out = dict(probe)
    for key in ("tcpSocket", "httpGet"):
        if key in out and not out[key].get("host"):
            out[key] = {**out[key], "host": pod.ip}
    if "exec" in out:
        command = [to_str(a) for a in out["exec"].get("command") or []]
        out["exec"] = {**out["exec"], "command": pod.enter_argv(command)}
    return out


def output_reader(pod):
    """How the runner reads a pod's output file: from the pod's storage (its /tmp, /dev/shm or
    a volume); a path outside them is the host's, which the pod shares (there is no image)."""

    def read(path: str) -> str:
        where = pod.path(path)
        return Path(path if where is None else where).read_text()

    return read


def exit_message(pod, rc: int | None) -> str:
    """The message of a failed pod, as a node reports it (OOMKilled over its memory limit)."""
    if pod.oom_killed():
        return f"OOMKilled (exit code {rc})"
    return f"Error (exit code {rc})"
