"""benchmarks/scale.py's report: the docs section (scale-ranks, or scale-ranks-raw for a run of
uncompressed saves) from its timing rows and request counts."""

from __future__ import annotations

import os

BEGIN, END = "<!-- scale-ranks: begin -->", "<!-- scale-ranks: end -->"


def markdown(
    timing: list[dict],
    requests: list[dict],
    before: list[dict],
    host: str,
    title: str = "## Scale: many ranks (issue 36)",
) -> str:
    lines = [BEGIN, title, "", host, ""]
    if timing:
        lines += [
            "Written by `benchmarks/scale.py`: gloo ranks on this host, each with its own small "
            f"fp32 tensors ({timing[0]['numel'] * 4 // 1024} KiB each), ckptflow (defaults but "
            f"compress={timing[0].get('compress', 'auto')!r}; the load a fresh `Checkpointer`'s, "
            "newest step) "
            "and DCP side by side in one run, phase order shuffled per round; a phase runs from "
            "a barrier to a barrier, each begun on a collected heap (`gc.collect()`, untimed); "
            "medians of the rounds, ratio = median of per-round ratios.",
            "",
            "manifests: the `Checkpointer`'s option, and what it wrote (rank: one manifest per "
            "rank and an index, format 5; step: one manifest, format 4).",
            "",
            "| ranks × tensors/rank | manifests | save ckptflow / DCP | load ckptflow / DCP "
            "| save s ckptflow, DCP | load s ckptflow, DCP | before: save, load ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        prior = {(b["world"], b["tensors"]): b for b in before}
        for r in timing:
            m, b = r["median_s"], prior.get((r["world"], r["tensors"]))
            was = f"{b['save']:.2f}, {b['load']:.2f}" if b else "–"
            mode = r.get("manifests", "auto")
            wrote = r.get("written", "step")
            lines.append(
                f"| {r['world']} × {r['tensors']} | {mode if mode == wrote else f'{mode}: {wrote}'} "
                f"| {r['ratio']['save']:.2f} "
                f"| {r['ratio']['load']:.2f} "
                f"| {m['ckptflow-save']:.2f}, {m['dcp-save']:.2f} "
                f"| {m['ckptflow-load']:.2f}, {m['dcp-load']:.2f} | {was} |"
            )
        lines.append("")
    if requests:
        lines += [
            "### Requests per rank on S3",
            "",
            "Counted by moto's server (`benchmarks/s3_requests.py`: each rank signs with an "
            "access key of its own), a save and then a fresh `Checkpointer`'s load of the "
            f"newest step, {requests[0]['tensors']} tensors per rank (an object each).",
            "",
            "| ranks | manifests | save: rank 0 | save: other ranks | load: rank 0 "
            "| load: other ranks | load kinds (last rank) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in requests:
            s, ld = r["save"], r["load"]
            span = lambda p: (  # noqa: E731
                f"{p['others_min']}"
                if p["others_min"] == p["others_max"]
                else f"{p['others_min']}–{p['others_max']}"
            )
            kinds = ", ".join(f"{k} {n}" for k, n in ld["other_kinds"].items())
            lines.append(
                f"| {r['world']} | {r.get('manifests', 'auto')} | {s['rank0']} | {span(s)} "
                f"| {ld['rank0']} | {span(ld)} "
                f"| {kinds} |"
            )
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def write_docs(section: str, name: str = "scale-ranks") -> None:
    """Replace this script's section `name` of docs/benchmarks.md (or append it)."""
    from benchmarks import docs_section

    body = section.split(BEGIN, 1)[1].rsplit(END, 1)[0].strip("\n")
    docs_section.write_section(name, body)


def host() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"Host: {os.cpu_count()} cores, load average at the end {load}."
