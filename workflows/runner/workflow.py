"""Run a whole Workflow manifest locally: the Python API behind `ckptflow run`.

The top of the runner: it builds the table of template executors (`dispatch`) that the others
reach each other through, so none of them imports another upward.
"""

from __future__ import annotations

import os
import random
import string
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import (
    controllers,
    dag_exec,
    execute,
    hooks,
    isolation,
    leaf,
    memo,
    podgc,
    refs,
    resource,
    steps_exec,
    suspend,
    sync,
    template_forms,
)
from ckptflow.workflows.runner.artifact_repo import DirRepository, Repository
from ckptflow.workflows.runner.cluster import Cluster, default_cluster
from ckptflow.workflows.runner.document import arguments_of, workflow_spec
from ckptflow.workflows.runner.nodelifecycle import FailNode, NodeLifecycle
from ckptflow.workflows.runner.nodes import DONE, ERROR, FAILED, SUCCEEDED, NodeStore, rfc3339
from ckptflow.workflows.runner.objects import ObjectStore
from ckptflow.workflows.runner.process import ProcessRegistry
from ckptflow.workflows.runner.report import Reporter, final_table, write_status
from ckptflow.workflows.runner.scheduler import Scheduler
from ckptflow.workflows.runner.spec import validate
from ckptflow.workflows.runner.substitution import parse_duration, substitute

__all__ = ["RunResult", "run_workflow", "workflow_name", "EXIT_CODES", "REFUSED_EXIT"]

EXIT_CODES = {SUCCEEDED: 0, FAILED: 1, ERROR: 2}
INTERRUPTED_EXIT = 130
REFUSED_EXIT = 3  # SpecError: the manifest was refused before anything ran


@dataclass
class RunResult:
    """The outcome of a local run: the phase Argo would report, and `status` as Argo writes it."""

    name: str
    phase: str
    message: str
    status: dict
    workdir: str
    status_file: str
    table: str
    interrupted: bool = False
    nodes: dict[str, dict] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return INTERRUPTED_EXIT if self.interrupted else EXIT_CODES.get(self.phase, 2)

    def node(self, name: str) -> dict:
        """The node with this full name (`wf.A`, `wf[0].step`), or with this display name
        when exactly one node has it."""
        full = [n for n in self.nodes.values() if n["name"] == name]
        if full:
            return full[0]
        shown = [n for n in self.nodes.values() if n["displayName"] == name]
        if len(shown) != 1:
            raise KeyError(f"{len(shown)} nodes have display name {name!r}")
        return shown[0]

    def phases(self) -> dict[str, str]:
        """Display name -> phase of every node (last one wins for repeated display names)."""
        return {n["displayName"]: n["phase"] for n in self.nodes.values()}


def dispatch() -> cx.Dispatch:
    """The executor of each template kind, in the order a template's kind is looked up."""
    return cx.Dispatch(
        start=execute.start,
        kinds={
            "container": cx.Kind("Pod", leaf.run_template),
            "script": cx.Kind("Pod", leaf.run_template),
            "dag": cx.Kind("DAG", partial(execute.run_group, dag_exec.run_dag)),
            "steps": cx.Kind("Steps", partial(execute.run_group, steps_exec.run_steps)),
            "suspend": cx.Kind("Suspend", suspend.run_suspend),
            "resource": cx.Kind("Pod", resource.run_template),
        },
    )


def workflow_name(manifest: dict) -> str:
    meta = manifest.get("metadata") or {}
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
    if manifest.get("kind") in ("WorkflowTemplate", "ClusterWorkflowTemplate"):
        return f"{meta.get('name', 'workflow')}-{suffix}"
    if meta.get("name"):
        return str(meta["name"])
    return f"{meta.get('generateName', 'workflow-')}{suffix}"


def _wait(run: cx.Run, node, scope: cx.Scope) -> bool:
    """Wait for a node to finish; on Ctrl-C stop everything and return True."""
    interrupted = False
    while node.phase not in DONE:
        gen = run.store.generation
        try:
            run.store.wait_change(gen, 0.1)
        except KeyboardInterrupt:
            interrupted = True
            scope.cancel(cx.INTERRUPT, "Stopped by user (interrupted)")
    return interrupted


def _new_run(manifest: dict, spec: dict, params: dict[str, str], store: NodeStore, **kw) -> cx.Run:
    """The shared state of one run (`kw`: name, workdir, cwd, kill_grace, private_tmp, env)."""
    meta = manifest.get("metadata") or {}
    parallelism = spec.get("parallelism")
    return cx.Run(
        name=kw["name"],
        uid=str(uuid.uuid4()),
        namespace=str(meta.get("namespace") or "default"),
        spec=spec,
        templates={t["name"]: t for t in spec["templates"]},
        parameters=params,
        store=store,
        registry=ProcessRegistry(kw["kill_grace"]),
        workdir=kw["workdir"],
        cwd=str(Path(kw["cwd"]).resolve()) if kw["cwd"] else None,
        pod_slots=threading.BoundedSemaphore(int(parallelism)) if parallelism else None,
        dispatch=dispatch(),
        private_tmp=kw["private_tmp"],
        env=kw["env"],
    )


def _document(run: cx.Run, state: dict) -> dict:
    """The status document as `argo get -o json` shows it (`state`: phase, message, times)."""
    nodes = run.store.to_status()
    podgc.mark_deleted(run.spec, run.templates, nodes, state["phase"])  # podgc.py
    pods = [n for n in nodes.values() if n["type"] == "Pod"]
    done = sum(1 for n in pods if n["phase"] in DONE)
    status = {
        "phase": state["phase"],
        "startedAt": rfc3339(state["started"]),
        "finishedAt": rfc3339(state["finished"]),
        "progress": f"{done}/{len(pods)}",
        "nodes": nodes,
    }
    if state["message"]:
        status["message"] = state["message"]
    lifecycle = run.isolation.lifecycle if run.isolation is not None else None
    if lifecycle is not None:  # --fail-node: what the control plane did, when (runner only)
        events = [{k: v for k, v in e.items() if k != "at"} for e in lifecycle.events]
        status["local"] = {"nodeLifecycle": events}
    if run.global_outputs:
        status["outputs"] = {
            "parameters": [{"name": k, "value": v} for k, v in run.global_outputs.items()]
        }
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": run.name, "uid": run.uid, "namespace": run.namespace},
        "status": status,
    }


def _run_to_end(run: cx.Run, scope: cx.Scope) -> tuple[str, str, bool]:
    """Run the entrypoint, then the exit handler; return (phase, message, interrupted)."""
    spec, params, wf_name = run.spec, run.parameters, run.name
    root = execute.start(
        run, name=wf_name, display=wf_name, template=spec["entrypoint"], args=params,
        boundary_id=None, parents=[], scope=scope,
        artifacts=(spec.get("arguments") or {}).get("artifacts"),
    )  # fmt: skip
    wf_hooks = hooks.WorkflowHooks(run, root, scope)  # spec.hooks but exit (hooks.py)
    run.start_thread(wf_hooks.watch)
    interrupted = _wait(run, root, scope)
    phase, message = root.phase, root.message
    if scope.reason() is not None and scope.reason()[0] == cx.DEADLINE:
        phase, message = FAILED, scope.reason()[1]
    for hook_node in [] if interrupted else wf_hooks.finish(phase):  # they end before onExit
        interrupted = _wait(run, hook_node, scope) or interrupted
    if wf_hooks.error:  # hooks.go: an expression that cannot be evaluated: the root is Error
        phase, message = ERROR, wf_hooks.error
    default_args = {"parameters": [{"name": k, "value": v} for k, v in params.items()]}
    exit_hook = hooks.exit_hook(spec, default_args)  # onExit or hooks.exit
    if exit_hook is not None and not interrupted:
        run.exit_vars = {"workflow.status": phase, "workflow.failures": cx.failures(run.store)}
        args, artifacts = hooks.resolve_arguments(exit_hook["arguments"], run.global_vars())
        exit_scope = cx.Scope()
        handler = execute.start(
            run, name=f"{wf_name}.onExit", display=f"{wf_name}.onExit",
            template=exit_hook["template"], args=args, artifacts=artifacts, boundary_id=None,
            parents=[], scope=exit_scope,
        )  # fmt: skip
        interrupted = _wait(run, handler, exit_scope)
        phase, message = hooks.exit_failure(phase, handler) or (phase, message)
    if interrupted:
        phase, message = FAILED, "Stopped by user (interrupted)"
    return phase, message, interrupted


def _locked_run(run: cx.Run, scope: cx.Scope, state: dict) -> tuple[str, str, bool]:
    """`_run_to_end` holding the workflow-level `synchronization` locks (Pending until then)."""
    values = run.global_vars()
    wf_sync = substitute(run.spec.get("synchronization"), values)
    if not wf_sync:
        return _run_to_end(run, scope)
    state["phase"] = "Pending"

    def waiting(message: str) -> None:  # shown in the status file while Pending
        state["message"] = message

    try:
        with sync.hold(
            wf_sync, lock_dir=run.lock_dir, namespace=run.namespace,
            limits=run.semaphore_limits, waiting=waiting,
            should_stop=lambda: scope.reason() is not None,
        ) as held:  # fmt: skip
            if not held:
                return FAILED, scope.reason()[1], False
            state["phase"], state["message"] = "Running", ""
            return _run_to_end(run, scope)
    except KeyboardInterrupt:
        return FAILED, "Stopped by user (interrupted)", True


def _stop_everything(run: cx.Run) -> None:
    """Stop every process still running and wait for the executors' threads."""
    run.registry.stop_all()
    with run.threads_lock:
        threads = list(run.threads)
    for t in threads:
        t.join(timeout=10)


def _execute(
    run: cx.Run, scope: cx.Scope, reporter: Reporter, state: dict, before_stop=None
) -> bool:
    """Run to the end, then stop what still runs and close the pods, whatever happened; record
    the phase, message and finish time in `state`; return whether the user interrupted.
    `before_stop`: called first at the end (the object store's garbage collection)."""
    try:
        reporter.start(run.store)
        phase, message, interrupted = _locked_run(run, scope, state)
    finally:
        try:
            if before_stop is not None:
                before_stop()
            _stop_everything(run)
        finally:
            if run.isolation is not None:
                run.isolation.close()  # no pod, link, mount or cgroup outlives the run
        state["finished"] = time.time()
    state["phase"], state["message"] = phase, message
    reporter.stop()
    return interrupted


def _result(run: cx.Run, state: dict, status_path: str, interrupted: bool) -> RunResult:
    """What `run_workflow` returns once the run has ended."""
    doc = _document(run, state)
    return RunResult(
        name=run.name,
        phase=state["phase"],
        message=state["message"],
        status=doc,
        workdir=run.workdir,
        status_file=status_path,
        table=final_table(run.store),
        interrupted=interrupted,
        nodes=doc["status"]["nodes"],
    )


def run_workflow(
    manifest: dict,
    *,
    arguments: dict[str, Any] | None = None,
    workdir: str,
    status_file: str | None = None,
    stream: TextIO | None = None,
    name: str | None = None,
    cwd: str | None = None,
    private_tmp: bool = True,
    kill_grace: float = 3.0,
    env: dict[str, str] | None = None,
    isolate: bool = False,
    pod_node=None,
    artifact_repository: Repository | None = None,
    semaphores: dict[str, int] | None = None,
    lock_dir: str | None = None,
    cluster: Cluster | None = None,
    fail_nodes: list[FailNode] | None = None,
    memo_cache: str | None = None,
    objects: ObjectStore | None = None,
    stop: threading.Event | None = None,
) -> RunResult:
    """Run a Workflow/WorkflowTemplate manifest here; raise SpecError before running anything
    if it uses what the local runner refuses.

    arguments: workflow parameters (like `argo submit -p`), overriding spec.arguments.
    workdir: where logs (`logs/`), pod-private directories (`pods/`) and the status file go.
    cwd: the working directory of processes without workingDir (default: the node's own
    directory, which stands in for the container's `/`: leaf.working_dir).
    env: the environment the template `env` is added to (default: this process's); variables of
    `secretKeyRef`/`configMapKeyRef` entries must be set in it.
    isolate: run every container/script task as a pod (`isolation.py`, docs/pods.md); raises
    IsolationError (one line) where pods cannot work. pod_node: a `pods.Node` the caller made
    (and closes) to run the pods on, e.g. to bind shared services to its address first.
    artifact_repository: where artifacts go (`artifact_repo.S3Repository` over a boto3-like
    client, or `DirRepository`); default: the directory `WORKDIR/artifacts`.
    semaphores: limits of `synchronization` semaphores (`configmap/key` -> N; sync.py).
    lock_dir: where the machine's mutex/semaphore locks are (default sync.DEFAULT_LOCK_DIR).
    cluster: the nodes pods are scheduled on under isolation (`cluster.load_profile`); default
    this machine as one node (`cluster.default_cluster`).
    fail_nodes: nodes of `cluster` that fail silently during the run (nodelifecycle.py); needs
    isolation.
    memo_cache: the directory of the memoization caches (memo.py); default `memo-cache` beside
    the workdir, so later runs there find what this one saved.
    objects: the cluster model's object store (objects.py: `--objects` files, ConfigMaps and
    Secrets); default an empty one. The run's Workflow is in it while it runs; what it owns is
    garbage-collected at its end. stop: set to stop this run (a child workflow whose object was
    deleted; controllers.py); a run given one is a child and leaves its object to its parent.
    """
    spec = template_forms.expand(workflow_spec(manifest))  # inline templates, templateDefaults
    base_env = dict(os.environ if env is None else env)
    pods = isolate or pod_node is not None
    # kubectl in Argo's executor pod puts a manifest without a namespace in the pod's own, the
    # workflow's (its service account's namespace): so does the store's default
    namespace = str((manifest.get("metadata") or {}).get("namespace") or "default")
    objects = ObjectStore(namespace) if objects is None else objects
    spec = refs.resolve_parameter_refs(spec, objects)  # configMapKeyRef parameters (refs.py)
    validate(
        spec, env=base_env, arguments=arguments, semaphores=semaphores, isolate=pods,
        objects=objects,
    )  # fmt: skip
    params = arguments_of(spec, arguments)
    wf_name = name or workflow_name(manifest)
    work = Path(workdir).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    status_path = str(Path(status_file).resolve() if status_file else work / "status.json")
    state = {"phase": "Running", "message": "", "started": time.time(), "finished": None}
    reporter = Reporter(stream)
    store = NodeStore(wf_name, on_change=reporter.on_change)
    run = _new_run(
        manifest, spec, params, store, name=wf_name, workdir=str(work), cwd=cwd,
        kill_grace=kill_grace, private_tmp=private_tmp, env=base_env,
    )  # fmt: skip
    run.objects = objects
    controllers.register_workflow(run, manifest)
    # the status file written before anything runs: an unwritable --status-file (a missing
    # folder) is an OSError now, not after the whole workflow ran
    write_status(status_path, _document(run, state))
    if pods:
        run.isolation = isolation.open_isolation(spec, pod_node)
        run.scheduler = Scheduler(cluster or default_cluster(), run.objects)  # scheduler.py
        if fail_nodes:  # frozen, silent pods; NotReady, taint, eviction as Kubernetes does
            run.isolation.lifecycle = NodeLifecycle(
                run.scheduler.cluster, list(fail_nodes), run.scheduler.taint, reporter.say
            ).start()
    run.artifacts = artifact_repository or DirRepository(str(work / "artifacts"))
    run.lock_dir, run.semaphore_limits = lock_dir or sync.DEFAULT_LOCK_DIR, dict(semaphores or {})
    run.memo_cache = memo_cache or memo.default_dir(str(work))
    reporter.status = lambda: write_status(status_path, _document(run, state))
    deadline = spec.get("activeDeadlineSeconds")
    scope = cx.Scope(None, parse_duration(deadline) if deadline is not None else None, cx.DEADLINE)
    ended = threading.Event()
    if stop is not None:  # a child: its object deleted (or its parent ending) stops it
        watch = (stop, ended, scope)
        threading.Thread(target=controllers.stop_when_set, args=watch, daemon=True).start()
        ending = None
    else:  # the top-level run is the cluster's workflow controller for the workflows it creates
        ctl = controllers.Controllers(run, partial(_run_child, run))  # watches run.objects
        ending = partial(controllers.end_run, run, ctl)
    try:
        interrupted = _execute(run, scope, reporter, state, ending)
    finally:
        ended.set()
    return _result(run, state, status_path, interrupted)


def _run_child(parent: cx.Run, manifest: dict, name: str, workdir: str, stop: threading.Event):
    """Run a Workflow a resource template created, in the parent's object store (its status
    goes back to the store: controllers.py). Tasks run as processes, even under --isolate."""
    return run_workflow(
        manifest, workdir=workdir, name=name, cwd=parent.cwd, env=parent.env,
        private_tmp=parent.private_tmp, lock_dir=parent.lock_dir,
        semaphores=parent.semaphore_limits, objects=parent.objects, stop=stop,
    )  # fmt: skip
