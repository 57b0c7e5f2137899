"""Run Argo's own `examples/*.yaml` with the local runner and tally the outcomes.

    .venv/bin/python scripts/argo_examples.py [--examples DIR] [--jobs 2] [--timeout 120]
        [--only NAME ...] [--json FILE] [-- RUNNER OPTIONS...]

Each example runs as `python -m ckptflow.run_cli FILE --workdir TMP/NAME` (at most `--jobs`
at a time, each within `--timeout` seconds) and is classified as

- `ran`: the workflow Succeeded;
- `expected`: it Failed/Errored as Argo's own outcome for it (`EXPECTED` below: examples that
  are meant to fail, e.g. a step exiting 1 under `continueOn`, retries running out);
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

# Examples whose outcome in Argo is not Succeeded: name -> (phases Argo may end in, why).
# Random ones list every phase they can end in.
EXPECTED: dict[str, tuple[tuple[str, ...], str]] = {
    "exit-handlers": (("Failed",), "the intentional-fail step exits 1; the handler reports it"),
    "dag-disable-failFast": (("Failed",), "task A exits 1 and failFast: false runs the rest"),
    "dag-continue-on-fail": (("Succeeded",), "continueOn.failed"),
    "status-reference": (("Failed", "Succeeded"), "flakey step exits 1 at random"),
    "retry-container": (("Failed", "Succeeded"), "random exit codes, 10 retries"),
    "retry-script": (("Failed", "Succeeded"), "random exit codes, 10 retries"),
    "retry-with-steps": (("Failed", "Succeeded"), "random exit codes, 10 retries"),
    "retry-backoff": (("Failed", "Succeeded"), "random exit codes, 10 retries with backoff"),
    "retry-on-error": (("Failed", "Succeeded"), "retries on error only; a failure ends it"),
    "retry-conditional": (("Failed",), "retries while the exit code is 2 (random), then fails"),
    "coinflip": (("Succeeded",), "random branch"),
    "coinflip-recursive": (("Succeeded",), "recurses until heads"),
    "dag-coinflip": (("Succeeded",), "random branch"),
    "resubmit": (("Failed",), "the step exits 1 (to show `argo resubmit`)"),
    "template-defaults": (("Failed", "Succeeded"), "retries a random failure"),
    "timeouts-step": (("Failed",), "the step sleeps past its activeDeadlineSeconds"),
    "timeouts-workflow": (("Failed",), "the workflow sleeps past its activeDeadlineSeconds"),
    "step-level-timeout": (("Failed",), "each step sleeps past its timeout"),
    "dag-task-level-timeout": (("Failed",), "tasks sleep past their timeout"),
    "continue-on-fail": (("Succeeded",), "continueOn.failed"),
    "exit-code-output-variable": (("Succeeded",), "continueOn.failed, then echo the exit code"),
    "dag-enhanced-depends": (("Failed", "Succeeded"), "random exits on the branches"),
}


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


def run_one(path: Path, workroot: Path, timeout: float, extra: list[str]) -> dict:
    """Run one example; return {name, class, phase, reason, seconds}."""
    name = path.stem
    work = workroot / name
    cmd = [sys.executable, "-m", "ckptflow.run_cli", str(path), "--workdir", str(work), *extra]
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=work.parent, check=False
        )
    except subprocess.TimeoutExpired:
        return {"name": name, "class": "failed", "phase": "Timeout", "seconds": timeout,
                "reason": f"still running after {timeout:.0f}s"}  # fmt: skip
    seconds = round(time.monotonic() - t0, 1)
    row = {"name": name, "seconds": seconds}
    if done.returncode == 3:
        return row | {"class": "refused", "phase": "-", "reason": _first_reason(done.stderr)}
    phase, message = _phase_and_message(work / "status.json")
    expected, why = EXPECTED.get(name, (("Succeeded",), ""))
    if phase in expected:
        klass = "ran" if phase == "Succeeded" else "expected"
        reason = why if klass == "expected" else ""
    else:
        klass = "failed"
        reason = _failed_node(work / "status.json") or message or done.stderr.strip()[-200:]
    return row | {"class": klass, "phase": phase, "reason": reason}


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
