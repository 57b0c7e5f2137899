"""Argo Prometheus metrics of the templates that save checkpoints and of the drill (template
`metrics.prometheus`): emitted by the workflow controller when the pod ends, from the output
parameters the step writes, so a cluster's Prometheus scrapes checkpoint health without an
exporter. Names follow Prometheus conventions (unit suffixes, `_total` for counters)."""

from __future__ import annotations

from hera.workflows import Counter, Gauge, Label

# output parameter -> (metric, help); written by ckptflow.steps.lib.loop (rank 0 only)
SAVE_OUTPUTS = {
    "save_seconds": ("ckptflow_save_duration_seconds", "mean save time (encode, upload, commit)"),
    "stall_seconds": ("ckptflow_save_stall_seconds", "mean time training waited per save"),
    "ckpt_bytes": ("ckptflow_checkpoint_bytes", "stored bytes of the last committed checkpoint"),
    "saves": ("ckptflow_saves", "checkpoints committed by this pod"),
}


def _has(name: str) -> str:
    # Under torchrun only rank 0 writes outputs; the other pods' default "" is no number.
    return f"{{{{status}}}} == Succeeded && '{{{{outputs.parameters.{name}}}}}' != ''"


def save_metrics(template: str) -> list:
    """The save metrics of a training template, and a counter of its failed pods (a failed
    save fails the pod)."""
    labels = [Label(key="template", value=template)]
    out: list = [
        Gauge(
            name=metric,
            help=text,
            labels=labels,
            when=_has(param),
            value=f"{{{{outputs.parameters.{param}}}}}",
            realtime=False,
        )
        for param, (metric, text) in SAVE_OUTPUTS.items()
    ]
    out.append(
        Counter(
            name="ckptflow_step_failures_total",
            help="pods of this template that failed (a failed save fails its pod)",
            labels=labels,
            when="{{status}} == Failed",
            value="1",
        )
    )
    return out


def drill_metrics() -> list:
    """A drill's outcome: corrupt checkpoints found (a failed drill) and drills run."""
    labels = [Label(key="template", value="drill")]
    return [
        Counter(
            name="ckptflow_drill_failures_total",
            help="verification drills that found a corrupt checkpoint (now marked CORRUPT)",
            labels=labels,
            when="{{status}} == Failed",
            value="1",
        ),
        Counter(
            name="ckptflow_drills_total",
            help="verification drills run",
            labels=labels,
            value="1",
        ),
    ]
