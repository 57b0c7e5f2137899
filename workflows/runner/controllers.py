"""The controllers of the cluster model: what makes a stored object run.

A `Workflow` created in the object store (a resource template's, as in workflow-of-workflows)
runs as a child workflow through the runner, its `status.phase` written back as the workflow
controller writes it (workflow/controller/operator.go persistUpdates); deleting the object
(directly, or by garbage collection of its owner) stops it. A batch `Job` runs its pod template
`completions` times, `parallelism` at a time, as the job controller does
(pkg/controller/job/job_controller.go in kubernetes/kubernetes), its pods in the store labelled
`controller-uid` / `job-name` and its `status.active/succeeded/failed` counted.
Other kinds are only stored. The child runner is passed in (`run_child`), so this module never
imports workflow.py (which builds it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ckptflow.workflows.runner import context as cx
from ckptflow.workflows.runner import objects as ob
from ckptflow.workflows.runner.document import SpecError, resolve_template_ref
from ckptflow.workflows.runner.substitution import to_str

__all__ = ["Controllers", "end_run", "job_problem", "register_workflow", "stop_when_set"]

MAX_JOB_PODS = 100  # completions a local Job may run (each is a process)
# child workflows one run may start in all: a workflow that creates itself again (or a loop
# creating workflows) ends here instead of growing without bound
MAX_CHILD_WORKFLOWS = 50


def job_problem(job: dict) -> str | None:
    """Why a Job's pods cannot run here (None when they can)."""
    spec = job.get("spec") or {}
    pod = ((spec.get("template") or {}).get("spec")) or {}
    containers = pod.get("containers") or []
    if len(containers) != 1:
        return "a Job runs here with exactly one container"
    if not containers[0].get("command"):
        return "the Job's container has no command: the image's entrypoint cannot run locally"
    try:
        completions = int(spec.get("completions") or 1)
        parallelism = int(spec.get("parallelism") or 1)
        int(spec.get("backoffLimit", 6))
    except (TypeError, ValueError):
        return "completions, parallelism and backoffLimit must be whole numbers"
    if not 0 < completions <= MAX_JOB_PODS or parallelism < 1:
        return f"completions must be 1..{MAX_JOB_PODS} and parallelism at least 1"
    return None


class Controllers:
    """The controllers of one top-level run; `on_create(obj)` is called for every object a
    resource template creates. `run_child(manifest, name, workdir, stop)` runs a child workflow
    and returns its RunResult; `stop` is a threading.Event it polls."""

    def __init__(self, run: cx.Run, run_child: Callable[..., object]) -> None:
        self.run = run
        self.run_child = run_child
        self.stops: dict[str, threading.Event] = {}  # uid -> stop of a running child/job
        self.lock = threading.Lock()
        self.children = 0  # Workflows started so far (MAX_CHILD_WORKFLOWS)
        run.objects.on_delete.append(self._deleted)
        run.objects.on_create.append(self.on_create)

    def on_create(self, obj: dict) -> None:
        kind, uid = obj["kind"], obj["metadata"]["uid"]
        if kind not in ("Workflow", "Job"):
            return
        stop = threading.Event()
        with self.lock:
            self.stops[uid] = stop
        target = self._workflow if kind == "Workflow" else self._job
        self.run.start_thread(target, obj, stop)

    def _deleted(self, obj: dict) -> None:
        with self.lock:
            stop = self.stops.get(obj["metadata"]["uid"])
        if stop is not None:
            stop.set()

    def detach(self) -> None:
        """Stop watching the store (the run that owns these controllers has ended)."""
        for hooks, fn in (
            (self.run.objects.on_create, self.on_create),
            (self.run.objects.on_delete, self._deleted),
        ):
            if fn in hooks:
                hooks.remove(fn)

    def stop_all(self) -> None:
        """The run ends: stop every child workflow and job still running."""
        with self.lock:
            for stop in self.stops.values():
                stop.set()

    def _status(self, obj: dict, status: dict) -> None:
        meta = obj["metadata"]
        with contextlib.suppress(ob.NotFound):  # deleted meanwhile
            self.run.objects.update_status(obj["kind"], meta["name"], status, meta["namespace"])

    # -- Workflow --------------------------------------------------------------------------
    def _workflow(self, obj: dict, stop: threading.Event) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            self.children += 1
            over = self.children > MAX_CHILD_WORKFLOWS
        if over:
            why = f"refused locally: a run starts at most {MAX_CHILD_WORKFLOWS} child workflows"
            self._status(obj, {"phase": "Error", "message": why})
            return
        self._status(obj, {"phase": "Running"})
        templates = self.run.objects.list("WorkflowTemplate")
        templates += self.run.objects.list("ClusterWorkflowTemplate", namespace="*")
        try:
            manifest = resolve_template_ref(obj, templates)
            workdir = str(Path(self.run.workdir) / "workflows" / name)
            result = self.run_child(manifest, name, workdir, stop)
            status = {"phase": result.phase}
            if result.message:
                status["message"] = result.message
        except SpecError as exc:  # refused: Argo would run it; say why it cannot run here
            status = {
                "phase": "Error",
                "message": f"refused locally: {str(exc).splitlines()[-1].strip()}",
            }
        except Exception as exc:  # never a hang: the child's error is its phase
            status = {"phase": "Error", "message": f"{type(exc).__name__}: {exc}"}
        self._status(obj, status)

    # -- Job -------------------------------------------------------------------------------
    def _job(self, job: dict, stop: threading.Event) -> None:
        problem = job_problem(job)
        if problem:
            self._status(
                job,
                {
                    "failed": 1,
                    "conditions": [{"type": "Failed", "status": "True", "message": problem}],
                },
            )
            return
        spec = job["spec"]
        completions, parallelism = (
            int(spec.get("completions") or 1),
            int(spec.get("parallelism") or 1),
        )
        backoff = int(spec.get("backoffLimit", 6))
        counts = {"active": 0, "succeeded": 0, "failed": 0}
        running: list[tuple[subprocess.Popen, str]] = []
        started = 0
        while not stop.is_set():
            for proc, pod in list(running):
                if proc.poll() is not None:
                    running.remove((proc, pod))
                    counts["succeeded" if proc.returncode == 0 else "failed"] += 1
                    self._pod_phase(pod, "Succeeded" if proc.returncode == 0 else "Failed")
            done = counts["succeeded"] >= completions or counts["failed"] > backoff
            while (
                not done and len(running) < parallelism and started - counts["failed"] < completions
            ):
                running.append(self._start_pod(job))
                started += 1
            counts["active"] = len(running)
            self._status(job, {**counts, **self._conditions(counts, completions, backoff)})
            if done and not running:
                return
            time.sleep(0.05)
        for proc, pod in running:  # stopped: its pods end with it (their process groups)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self._pod_phase(pod, "Failed")

    @staticmethod
    def _conditions(counts: dict, completions: int, backoff: int) -> dict:
        if counts["succeeded"] >= completions:
            return {"conditions": [{"type": "Complete", "status": "True"}]}
        if counts["failed"] > backoff:
            return {
                "conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
                ]
            }
        return {}

    def _pod_phase(self, pod: str, phase: str) -> None:
        with contextlib.suppress(ob.NotFound):
            self.run.objects.update_status("Pod", pod, {"phase": phase})

    def _start_pod(self, job: dict) -> tuple[subprocess.Popen, str]:
        """One pod of the Job: stored with the job controller's labels, run as a process with
        the container's command, args and env (its image ignored, as for any task here)."""
        meta = job["metadata"]
        template = job["spec"]["template"]
        container = template["spec"]["containers"][0]
        labels = {**((template.get("metadata") or {}).get("labels") or {})}
        labels.update({"controller-uid": meta["uid"], "job-name": meta["name"]})
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
        }
        pod = self.run.objects.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": f"{meta['name']}-",
                    "labels": labels,
                    "ownerReferences": [owner],
                },
                "spec": template.get("spec"),
                "status": {"phase": "Running"},
            }
        )
        name = pod["metadata"]["name"]
        argv = [
            to_str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]
        ]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        env = dict(self.run.env)
        env.update(
            {
                e["name"]: to_str(e.get("value", ""))
                for e in container.get("env") or []
                if "value" in e
            }
        )
        log = Path(self.run.workdir) / "logs" / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=self.run.cwd or self.run.workdir, start_new_session=True,
            )  # fmt: skip
        return proc, name


def register_workflow(run: cx.Run, manifest: dict) -> None:
    """The run's Workflow in the object store (a child's exists already: its creator stored
    it), so resource templates can read, patch and own by it; `run.uid` is its uid."""
    own = run.objects.get("Workflow", run.name, run.namespace)
    if own is None:
        meta = manifest.get("metadata") or {}
        obj = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {
                "name": run.name,
                "namespace": run.namespace,
                **{k: meta[k] for k in ("labels", "annotations") if isinstance(meta.get(k), dict)},
            },
            "spec": run.spec,
            "status": {"phase": "Running"},
        }
        try:
            own = run.objects.create(obj)
        except ob.ObjectError:
            return  # a name the API server would refuse: the run keeps its own uid
    run.uid = own["metadata"]["uid"]


def stop_when_set(stop: threading.Event, ended: threading.Event, scope: cx.Scope) -> None:
    """Cancel a child run's scope once `stop` is set (its Workflow deleted); return when the
    run has `ended` first."""
    while not ended.is_set():
        if stop.wait(0.1):
            scope.cancel(cx.INTERRUPT, "Stopped: the Workflow was deleted")
            return


def end_run(run: cx.Run, ctl: Controllers) -> None:
    """The end of a top-level run: its child workflows and jobs stop, and its Workflow is
    deleted, which garbage-collects every object it owns (setOwnerReference), as Kubernetes
    GC does when a workflow is deleted."""
    ctl.stop_all()
    ctl.detach()  # a store that outlives the run (a caller's) no longer calls this run
    with contextlib.suppress(ob.ObjectError):  # never stored (a name the API server refuses)
        run.objects.delete("Workflow", run.name, run.namespace)
