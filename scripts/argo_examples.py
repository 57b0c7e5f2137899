"""Run Argo's own `examples/*.yaml` with the local runner and tally the outcomes.

    .venv/bin/python scripts/argo_examples.py [--examples DIR] [--jobs 2] [--timeout 120]
        [--only NAME ...] [--json FILE] [-- RUNNER OPTIONS...]

Each example runs as `python -m ckptflow.run_cli FILE --workdir TMP/NAME` (at most `--jobs`
at a time, each within `--timeout` seconds, longer for the slow ones in `SLOW`, with the
semaphore limits its comments give in `RUNNER_OPTIONS`, and `--isolate` for those that need a
pod, `POD_EXAMPLES`) and is classified as

- `ran`: the workflow Succeeded;
- `expected`: it Failed/Errored as it does in Argo (labelled `no-test: "expected-failure"`, or
  in `EXPECTED_FAILURE` below: failing by design, at random, or reaching an outside service),
  or it runs until stopped (`EXPECTED_TIMEOUT`);
- `refused`: the runner refused it before anything ran (exit code 3), with the field;
- `failed`: anything else (an unexpected phase, a timeout): a runner gap or a bug.

The table lists every example with its class and a one-line reason; the tally follows.
Default examples directory: `../shared/argo/examples` beside the repository (Argo v4.1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EXAMPLES = ROOT.parent / "shared" / "argo" / "examples"
OBJECTS = ROOT / "tests" / "workflows" / "fixtures" / "argo-objects"

# Examples that end Failed/Error in Argo too (besides those labelled
# `workflows.argoproj.io/no-test: "expected-failure"`): by design, at random, or because they
# reach a service this machine has not. name -> why.
EXPECTED_FAILURE: dict[str, str] = {
    "status-reference": "the flakey step exits 1 at random",
    "retry-container": "random exit codes; the retries can run out",
    "retry-script": "random exit codes; the retries can run out",
    "retry-with-steps": "random exit codes; the retries can run out",
    "retry-backoff": "random exit codes; the retries can run out",
    "retry-on-error": "retryPolicy OnError: the step's plain failure is not retried",
    "retry-conditional": "retries while the exit code is 2, then fails",
    "resubmit": "the step exits 1 (to show `argo resubmit`)",
    "pod-gc-strategy": "the fail step exits 1 (to show pod GC of failed pods)",
    "pod-gc-strategy-with-label-selector": "the fail step exits 1 (to show pod GC)",
    "exit-handler-slack": "environment: the exit handler posts to hooks.slack.com, no network here",
    "variables-showcase": "environment: its daemon runs `nc`, which this machine has not",
    "conditionals": "environment: its steps run `cowsay` (argosay's image), not installed here",
    "fun-with-gifs": "environment: downloads from the public bucket s3://ax-public, no network here",
    "dag-enhanced-depends": "random exits on the branches",
    "custom-metrics": "the flakey step fails with a 66% probability",
    "timeouts-workflow": "the workflow sleeps past its activeDeadlineSeconds",
    "step-level-timeout": "the steps sleep past their timeout",
    "loops-arbitrary-sequential-steps": "its 4th item exits 1 by design; failFast stops the rest",
}
# Examples that run until stopped: a timeout is their outcome (name -> seconds to watch them).
EXPECTED_TIMEOUT = {"forever": 20.0}
# Examples that take longer than the default timeout by design (seconds).
SLOW = {
    "colored-logs": 200.0,
    "parallelism-nested-dag": 240.0,
    "parallelism-nested-workflow": 300.0,
    "parallelism-nested": 240.0,
    "synchronization-mutex-tmpl-level": 330.0,
    "synchronization-db-mutex-tmpl-level": 330.0,
}
# Runner options an example needs: the ConfigMaps its comments describe (semaphore limits).
RUNNER_OPTIONS = {
    "synchronization-tmpl-level": ["--semaphore", "my-config/template=3"],
    "synchronization-wf-level": ["--semaphore", "my-config/workflow=3"],
    "synchronization-db-tmpl-level": ["--semaphore", "template=3"],
    "synchronization-db-wf-level": ["--semaphore", "workflow=3"],
    # the objects their comments ask to create first (ConfigMap, Secret, WorkflowTemplate),
    # vendored in tests/workflows/fixtures/argo-objects/ (needs.json: example -> file, which
    # tests/workflows/test_runner_examples_resources.py reads too), put in the object store
    **{
        name: ["--objects", str(OBJECTS / f)]
        for name, f in json.loads((OBJECTS / "needs.json").read_text()).items()
    },
}

# Examples that need a pod (sidecars, init containers, a mount namespace of their own): run with
# `--isolate`. Where pods cannot work the runner refuses them naming why (IsolationError).
POD_EXAMPLES = {
    "init-container": "init containers run in the task's pod",
    "pod-resources-template-override": "its large step has a sidecar",
    "sidecar": "a sidecar beside the main container",
    "sidecar-dind": "a sidecar beside the main container",
    "sidecar-nginx": "a sidecar beside the main container",
    "volumes-emptydir": "it looks for its mount in /proc/mounts, which only a pod has",
}


def runner_options(name: str, extra: list[str]) -> list[str]:
    """The `ckptflow run` options of one example: its own, then the caller's."""
    opts = list(RUNNER_OPTIONS.get(name, []))
    if name in POD_EXAMPLES and "--isolate" not in extra:
        opts.append("--isolate")
    return [*opts, *extra]


def _labelled_failure(path: Path) -> bool:
    return 'workflows.argoproj.io/no-test: "expected-failure"' in path.read_text()


def _first_reason(stderr: str) -> str:
    """The first refused field of a SpecError message (one line)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    body = [ln for ln in lines if not ln.startswith("ckptflow run:")]
    if body:
        return body[0]
    return lines[0].removeprefix("ckptflow run: ") if lines else "(no message)"


def _phase_and_message(status_file: Path) -> tuple[str, str]:
    try:
        doc = json.loads(status_file.read_text())
    except (OSError, ValueError):
        return "?", "no status file"
    st = doc.get("status") or {}
    return str(st.get("phase")), str(st.get("message") or "")


def _failed_node(status_file: Path) -> str:
    try:
        nodes = json.loads(status_file.read_text())["status"]["nodes"].values()
    except (OSError, ValueError, KeyError):
        return ""
    for n in nodes:
        if n.get("type") == "Pod" and n.get("phase") in ("Failed", "Error"):
            return f"{n['displayName']}: {n.get('message', '')}"
    return ""


# What a task's own failure looks like on its node (an exit code, a kill, a deadline): an Error
# node with any other message is the runner's (a variable it could not resolve, a start that
# failed), not the example's design.
_TASK_FAILURES = ("Error (exit code", "OOMKilled", "Step exceeded its deadline", "Pod was active")


def _runner_error(status_file: Path) -> str:
    """The first Pod (or Skipped) node in Error for a reason other than its task's own."""
    try:
        nodes = json.loads(status_file.read_text())["status"]["nodes"].values()
    except (OSError, ValueError, KeyError):
        return ""
    for n in nodes:
        message = str(n.get("message") or "")
        own = message.startswith(_TASK_FAILURES)
        if n.get("type") in ("Pod", "Skipped") and n.get("phase") == "Error" and not own:
            return f"{n['displayName']}: {message}"
    return ""


def run_one(path: Path, workroot: Path, timeout: float, extra: list[str]) -> dict:
    """Run one example; return {name, class, phase, reason, seconds}."""
    name = path.stem
    work = workroot / name
    opts = runner_options(name, extra)
    cmd = [sys.executable, "-m", "ckptflow.run_cli", str(path), "--workdir", str(work), *opts]
    limit = EXPECTED_TIMEOUT.get(name) or max(timeout, SLOW.get(name, 0.0))
    # its own temporary directory: its synchronization locks are its own (sync.DEFAULT_LOCK_DIR),
    # so two examples using mutex `test` at once do not wait for each other
    (work / "tmpdir").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TMPDIR=str(work / "tmpdir"))
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=limit, cwd=work.parent, check=False,
            env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        row = {"name": name, "phase": "Running", "seconds": limit}
        if name in EXPECTED_TIMEOUT:
            return row | {
                "class": "expected",
                "reason": f"runs until stopped (watched {limit:.0f}s)",
            }
        return row | {"class": "failed", "reason": f"still running after {limit:.0f}s"}
    seconds = round(time.monotonic() - t0, 1)
    row = {"name": name, "seconds": seconds}
    if done.returncode == 3:
        return row | {"class": "refused", "phase": "-", "reason": _first_reason(done.stderr)}
    if done.returncode == 2 and "--isolate:" in done.stderr:  # pods cannot work here
        return row | {"class": "refused", "phase": "-", "reason": _first_reason(done.stderr)}
    phase, message = _phase_and_message(work / "status.json")
    if phase == "Succeeded":
        return row | {"class": "ran", "phase": phase, "reason": ""}
    why = EXPECTED_FAILURE.get(name)
    if not why and _labelled_failure(path):
        # the label says it fails in Argo; an error of the runner's own is still a failure here
        runner = _runner_error(work / "status.json")
        why = "" if runner else "labelled expected-failure"
    if phase in ("Failed", "Error") and why:
        return row | {"class": "expected", "phase": phase, "reason": why}
    reason = (
        _runner_error(work / "status.json")
        or _failed_node(work / "status.json")
        or message
        or done.stderr.strip()[-200:]
    )
    return row | {"class": "failed", "phase": phase, "reason": reason}


def tally(rows: list[dict]) -> dict[str, int]:
    counts = {"ran": 0, "expected": 0, "refused": 0, "failed": 0}
    for r in rows:
        counts[r["class"]] += 1
    return counts


def top_reasons(rows: list[dict], n: int = 12) -> list[tuple[str, int]]:
    """The most frequent refusal reasons, by the field (the part after `template 'x': `)."""
    counts: dict[str, int] = {}
    for r in rows:
        if r["class"] != "refused":
            continue
        parts = r["reason"].split(": ")
        key = ": ".join(parts[1:]) if len(parts) > 2 else r["reason"]
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])[:n]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", default=str(DEFAULT_EXAMPLES))
    p.add_argument("--jobs", type=int, default=2, help="examples run at once (at most 2)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per example")
    p.add_argument("--only", nargs="*", default=None, help="example names (without .yaml)")
    p.add_argument("--json", help="also write the rows as JSON here")
    p.add_argument("runner", nargs=argparse.REMAINDER, help="-- options for `ckptflow run`")
    args = p.parse_args(argv)
    extra = [a for a in args.runner if a != "--"]
    files = sorted(Path(args.examples).glob("*.yaml"))
    if args.only:
        files = [f for f in files if f.stem in set(args.only)]
    if not files:
        print(f"no examples under {args.examples}", file=sys.stderr)
        return 2
    jobs = max(1, min(args.jobs, 2))
    with (
        tempfile.TemporaryDirectory(prefix="argo-examples-") as tmp,
        ThreadPoolExecutor(jobs) as pool,
    ):
        rows = list(pool.map(lambda f: run_one(f, Path(tmp), args.timeout, extra), files))
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['class']:<8}  {r['phase']:<9}  {r['reason'][:150]}")
    counts = tally(rows)
    print(f"\n{len(rows)} examples: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    print("top refusal reasons:")
    for reason, count in top_reasons(rows):
        print(f"  {count:3d}  {reason[:140]}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
