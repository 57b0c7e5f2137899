"""Regenerate docs/reliability.md from the fault-injection suite's results.

    .venv/bin/python scripts/reliability_report.py            # default suite (about 2 min)
    .venv/bin/python scripts/reliability_report.py --slow     # also the slow cases (long)
    .venv/bin/python scripts/reliability_report.py --from-json results.json   # re-render only

It runs pytest on tests/faults in this process with a small plugin that collects, for every
test, what it injected (the `fault(...)` records of tests/faults/conftest.py: category,
injection, number of cases, detail) and the outcome, then renders the table. `--json-out`
keeps the raw results. Exit code: 0 when every case survived, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "reliability.md"
CATEGORIES = {
    "crash": "Crashes (SIGKILL at every phase of a save)",
    "corruption": "Corruption of stored files",
    "storage": "Storage faults",
    "concurrency": "Concurrency",
    "hostile": "Hostile input",
    "secrets": "Secrets",
    "adversary": "Adversarial sequences (stateful model of the storage)",
}
THREAT_MODEL = REPO / "tests" / "faults" / "adversary" / "threat_model.py"


class Collector:
    """pytest plugin: one row per test with its fault records and outcome."""

    def __init__(self):
        self.rows: list[dict] = []
        self._started = time.monotonic()

    def pytest_runtest_logreport(self, report) -> None:
        done = report.when == "call" or (report.when == "setup" and report.outcome != "passed")
        if not done:
            if report.when == "teardown" and report.outcome == "failed" and self.rows:
                self.rows[-1]["outcome"] = "failed"
            return
        faults = [v for k, v in report.user_properties if k == "fault"]
        reason, outcome = "", report.outcome
        if hasattr(report, "wasxfail") and report.outcome == "skipped":
            outcome, reason = "xfail", str(report.wasxfail)
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.outcome == "failed":
            reason = str(getattr(report.longrepr, "reprcrash", None) or report.longrepr)
            reason = reason.strip().splitlines()[-1][:300] if reason.strip() else "failed"
        self.rows.append(
            {
                "test": report.nodeid,
                "outcome": outcome,
                "seconds": round(report.duration, 2),
                "faults": faults,
                "reason": reason,
            }
        )


def run_suite(slow: bool, extra: list[str]) -> dict:
    """Run tests/faults and return {"rows", "command", "seconds", ...}."""
    import pytest

    marks = "not minio and not cluster" if slow else "not slow and not minio and not cluster"
    args = ["-q", "-p", "no:cacheprovider", "-m", marks, "tests/faults", *extra]
    collector = Collector()
    t0 = time.monotonic()
    os.chdir(REPO)
    code = pytest.main(args, plugins=[collector])
    return {
        "rows": collector.rows,
        "pytest_args": args,
        "exit_code": int(code),
        "seconds": round(time.monotonic() - t0, 1),
        "slow": slow,
        "generated_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git_commit(),
    }


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except OSError:
        return ""


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(results: dict) -> str:
    """The Markdown page: a summary, then one table per category."""
    rows = results["rows"]
    entries = []  # (category, injection, cases, outcome, detail)
    for r in rows:
        survived = r["outcome"] == "passed"
        outcome = {"passed": "survived", "skipped": "skipped", "xfail": "known bug (xfail)"}.get(
            r["outcome"], "**FAILED**"
        )
        if not r["faults"]:
            if r["outcome"] == "passed":
                continue  # a plain unit check with nothing injected
            name = r["test"].split("::")[-1]
            category = _category_of(r["test"])
            entries.append((category, name, "-", outcome, r["reason"]))
            continue
        for f in r["faults"]:
            detail = f.get("detail") or ""
            if not survived:
                detail = r["reason"] or detail
            entries.append((f["category"], f["injection"], f["cases"], outcome, detail))
    total_cases = sum(e[2] for e in entries if isinstance(e[2], int) and e[3] == "survived")
    failed = [e for e in entries if e[3] == "**FAILED**"]
    skipped = [e for e in entries if e[3] == "skipped"]
    known = [e for e in entries if e[3].startswith("known bug")]
    lines = [
        "# Reliability: what was injected, and what survived",
        "",
        "<!-- generated by scripts/reliability_report.py; do not edit by hand -->",
        "",
        '"Corrupted checkpoints are worse than no checkpoints." The fault-injection suite',
        "(`tests/faults/`) crashes saves at every phase, corrupts every kind of stored file,",
        "injects S3 faults through a real HTTP proxy, races writers, GC and evaluators, feeds",
        "hostile manifests and fuzzes the parser, and scans everything for credentials. Each row",
        "is one injection; *survived* means the test's invariant held for every case: the previous",
        "checkpoint stayed the newest valid one and loaded bitwise, nothing committed was lost,",
        "damage was refused with an error naming the file, and nothing was read outside the root,",
        "allocated without bound or executed.",
        "",
        f"Generated {results['generated_at']} at commit `{results['commit'] or '?'}` by "
        f"`python scripts/reliability_report.py{' --slow' if results['slow'] else ''}` "
        f"({len(rows)} tests, {results['seconds']:.0f} s"
        f"{'' if results['slow'] else '; the slow cases are not included'}).",
        "",
        f"**{len(entries)} injections, {total_cases} cases: "
        + (
            "all survived, nothing lost.**"
            if not failed
            else f"{len(failed)} FAILED (see below).**"
        )
        + (f" {len(skipped)} skipped." if skipped else "")
        + (f" {len(known)} known bug(s), marked xfail (see the rows)." if known else ""),
        "",
        _adversary_totals(entries),
        "",
        *_threat_model(),
    ]
    for key, title in CATEGORIES.items():
        group = [e for e in entries if e[0] == key]
        if not group:
            continue
        cases = sum(e[2] for e in group if isinstance(e[2], int))
        lines += [f"## {title}", "", f"{len(group)} injections, {cases} cases.", ""]
        lines += ["| injected | cases | outcome | detail |", "| --- | ---: | --- | --- |"]
        lines += [
            f"| {_cell(inj)} | {cases_} | {out} | {_cell(det)} |"
            for _, inj, cases_, out, det in group
        ]
        lines.append("")
    other = [e for e in entries if e[0] not in CATEGORIES]
    if other:
        lines += [
            "## Other",
            "",
            "| injected | cases | outcome | detail |",
            "| --- | ---: | --- | --- |",
        ]
        lines += [f"| {_cell(i)} | {c} | {o} | {_cell(d)} |" for _, i, c, o, d in other]
        lines.append("")
    lines += [
        "## How the faults are made",
        "",
        "- **Crashes**: the save runs in a process forked from the test; its injected `Storage`",
        "  (`tests/faults/harness.py`) SIGKILLs its own process at the chosen write: before the",
        "  first data file, after N data files, before the manifest, before the commit marker, or",
        "  after writing half of the marker's bytes (locally into the hidden temporary file that",
        "  an exclusive create links into place; on S3 as a half-written COMMIT object, which a",
        "  real interrupted PUT cannot leave: stricter than reality). Async saves die in their",
        "  background thread. Multi-rank: forked gloo ranks, one SIGKILLs itself mid-data and",
        "  the others are torn down as torchrun does. Afterwards `gc` runs with a grace period",
        "  the leftovers have outlived, and the root must hold exactly the survivor's objects.",
        "- **Corruption**: bit flips at seeded random positions, truncation, emptying, deletion,",
        "  swaps of data files, manifests or whole step folders between steps, and a manifest",
        "  from another run. Every step is then loaded and verified; `load(step=None)` must land",
        "  on the newest intact step and log that it fell back; `ckptflow ckpt verify` must exit",
        "  1 naming the file.",
        "- **Storage faults**: `tests/faults/proxy.py` sits between s3fs/botocore and the moto",
        "  server and answers with 500 InternalError, 503 SlowDown, a reset connection, a lost",
        "  response (applied, then reset), a slow response, 403 AccessDenied or NoSuchBucket.",
        "  A full disk is a 2 MiB tmpfs mounted by the test.",
        "- **Hostile input**: crafted manifests re-committed with a matching checksum, loaded",
        "  through a filesystem that records every path, under `tracemalloc`, next to pickles",
        "  that would create a file if ever unpickled; hypothesis mutates a real manifest",
        "  (subtrees replaced by hostile values, keys dropped or added, bytes flipped, truncated).",
        "- **Adversarial sequences**: a hypothesis state machine (`tests/faults/adversary/`)",
        "  interleaves saves, loads, the `ckptflow ckpt` tools, crashes and the damage of the",
        "  threat model above, checking invariants (a)-(f) against its own ground truth after",
        "  every operation; each minimal sequence it found is replayed as a regression test.",
        "",
    ]
    return "\n".join(lines)


def _threat_model() -> list[str]:
    """The "Threat model" section, from tests/faults/adversary/threat_model.py (loaded by path:
    the adversary package itself imports torch)."""
    spec = importlib.util.spec_from_file_location("threat_model", THREAT_MODEL)
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    lines = ["## Threat model", "", "What the adversary (`tests/faults/adversary/`) attacks:", ""]
    lines += [f"- **{what}**: {how}." for what, how in tm.ATTACKS]
    lines += ["", f"What it runs between the damage: {tm.OPERATIONS}.", ""]
    lines += ["What must hold after every operation:", ""]
    lines += [f"- ({key}) {text}." for key, text in tm.INVARIANTS]
    return [*lines, ""]


_ADV = re.compile(r"(\d+) sequences, (\d+) operations; \d+ damage kinds: (.*)")


def _adversary_totals(entries: list) -> str:
    """One line: sequences, operations and distinct damage kinds over the adversary's rows."""
    seqs = ops = 0
    kinds: set[str] = set()
    for category, _, _, _, detail in entries:
        m = _ADV.fullmatch(str(detail)) if category == "adversary" else None
        if m:
            seqs, ops = seqs + int(m[1]), ops + int(m[2])
            kinds |= {k.rsplit(" x", 1)[0] for k in m[3].split(", ") if k != "none"}
    return (
        f"**Adversary: {seqs} random sequences, {ops} operations, {len(kinds)} kinds of damage**"
        " (the variants' rows below; replays of the minimal sequences it found are the rows"
        " named `replay:`)."
    )


def _category_of(nodeid: str) -> str:
    for key, part in (
        ("crash", "test_crash"),
        ("corruption", "test_corruption"),
        ("corruption", "test_pretrain_resume"),
        ("storage", "test_storage"),
        ("concurrency", "test_concurrency"),
        ("hostile", "test_hostile"),
        ("hostile", "test_fuzz"),
        ("secrets", "test_secrets"),
        ("adversary", "test_adversary"),
    ):
        if part in nodeid:
            return key
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slow", action="store_true", help="include the slow cases")
    ap.add_argument("--from-json", help="render saved results instead of running the suite")
    ap.add_argument("--json-out", help="also write the raw results here")
    ap.add_argument("--out", default=str(DOC), help="the page to write (docs/reliability.md)")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        results = run_suite(args.slow, args.pytest_args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    Path(args.out).write_text(render(results))
    print(f"wrote {args.out}", file=sys.stderr)
    bad = [r for r in results["rows"] if r["outcome"] == "failed"]
    return 1 if bad or results.get("exit_code", 0) not in (0, 5) else 0


if __name__ == "__main__":
    sys.exit(main())
