"""The run report: one picture of what a pipeline run did, written under the run and logged to
MLflow (`ckptflow.steps.select` draws it once it has chosen).

Four panels on one step axis (a fine-tune's steps continue from its base step): training and
validation loss, exact match on held-out problems (each fine-tune's base on the fine-tune task
as a hollow marker at the base step), and per checkpoint the save stall (how long training
waited) and the stored size, full and delta saves in their own colours, the selected checkpoint
starred. Everything comes from storage (manifests, eval.json); the denser training loss and the
stalls come from the MLflow runs that logged them, when MLflow is there.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field

from ckptflow import env
from ckptflow.core import rootreader, runroot
from ckptflow.core.storage import Storage

log = logging.getLogger("ckptflow.report")
NAME = "report.png"


@dataclass
class Series:
    """One training run's checkpoints, as the report draws them."""

    label: str  # "pretrain (add)", "lr0.001-freeze1 (rev)"
    offset: int  # added to its steps (a fine-tune starts at its base step)
    steps: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "full" | "delta"
    stored: list[int] = field(default_factory=list)  # bytes this checkpoint added
    val_loss: list[float | None] = field(default_factory=list)
    exact: list[float | None] = field(default_factory=list)
    train: list[tuple[int, float]] = field(default_factory=list)  # (step, train_loss)
    stall: dict[int, float] = field(default_factory=dict)  # step -> save stall seconds
    base_metrics: dict = field(default_factory=dict)  # a fine-tune's base on its task
    run_id: str | None = None


def read_series(ckpt: Storage, name: str, offset: int = 0) -> Series:
    """A run's checkpoints from its checkpoint root: kind, size, eval metrics, train loss;
    labelled `name (task)`."""
    s = Series(name, offset)
    steps = rootreader.committed_steps(ckpt)
    evals = runroot.read_evals(ckpt, steps, [])
    for step in steps:
        m = rootreader.read_manifest(ckpt, step)
        meta = m.get("metadata") or {}
        rec = evals.get(step)
        s.steps.append(step)
        s.kinds.append(str(m.get("kind", "full")))
        s.stored.append(int((m.get("stats") or {}).get("new_bytes", 0)))
        s.val_loss.append(rec.metric("val_loss") if rec else None)
        s.exact.append(rec.metric("exact_match") if rec else None)
        loss = (meta.get("metrics") or {}).get("train_loss")
        if isinstance(loss, int | float):
            s.train.append((step, float(loss)))
        s.run_id = s.run_id or (meta.get("mlflow") or {}).get("run_id")
        if meta.get("task") and "(" not in s.label:
            s.label = f"{name} ({meta['task']})"
        if rec and rec.base_metrics:
            s.base_metrics = dict(rec.base_metrics)
    return s


def add_mlflow_history(s: Series, client) -> None:
    """The denser train_loss and the save stalls from the run that logged them (if any)."""
    if client is None or not s.run_id:
        return
    try:
        train = client.get_metric_history(s.run_id, "train_loss")
        stall = client.get_metric_history(s.run_id, "save_stall_s")
    except Exception as exc:  # noqa: BLE001 - the report draws what storage has
        log.warning("report: no MLflow history for run %s (%s)", s.run_id, exc)
        return
    if train:
        s.train = sorted((int(m.step), float(m.value)) for m in train)
    s.stall = {int(m.step): float(m.value) for m in stall}


def _panel_curves(ax_loss, ax_em, series: list[Series]) -> None:
    for i, s in enumerate(series):
        color = f"C{i}"
        if s.train:
            ax_loss.plot(
                [st + s.offset for st, _ in s.train],
                [v for _, v in s.train],
                color=color,
                alpha=0.45,
                lw=1,
                label=f"{s.label} train",
            )
        pts = [
            (st + s.offset, v) for st, v in zip(s.steps, s.val_loss, strict=True) if v is not None
        ]
        if pts:
            ax_loss.plot(*zip(*pts, strict=True), "o-", color=color, ms=3, label=f"{s.label} val")
        em = [(st + s.offset, v) for st, v in zip(s.steps, s.exact, strict=True) if v is not None]
        if em:
            ax_em.plot(*zip(*em, strict=True), "o-", color=color, ms=3, label=s.label)
        if s.base_metrics.get("val_loss") is not None:
            ax_loss.plot([s.offset], [s.base_metrics["val_loss"]], "o", mfc="none", color=color)
        if s.base_metrics.get("exact_match") is not None:
            ax_em.plot(
                [s.offset],
                [s.base_metrics["exact_match"]],
                "o",
                mfc="none",
                color=color,
                ms=8,
                label=f"base on {s.label.split('(')[-1].rstrip(')')}",
            )
    ax_loss.set(
        title="loss (train, validation; hollow: the base on the fine-tune task)",
        xlabel="step",
        ylabel="cross-entropy",
        yscale="log",
    )
    ax_em.set(title="exact match on held-out problems", xlabel="step", ylim=(-0.03, 1.03))
    for ax in (ax_loss, ax_em):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)


def _panel_checkpoints(ax_stall, ax_size, series: list[Series], chosen: tuple[str, int]) -> None:
    from matplotlib.patches import Patch

    colors = {"full": "tab:blue", "delta": "tab:orange"}
    gaps = [s.steps[1] - s.steps[0] for s in series if len(s.steps) > 1] or [10]
    width = max(1.0, min(gaps) / (len(series) + 1))
    for i, s in enumerate(series):  # side by side: fine-tunes share their steps
        xs = [st + s.offset + (i - len(series) / 2) * width for st in s.steps]
        cs = [colors.get(k, "tab:gray") for k in s.kinds]
        ax_stall.bar(xs, [s.stall.get(st, 0.0) for st in s.steps], width=width, color=cs)
        ax_size.bar(xs, [b / 2**20 for b in s.stored], width=width, color=cs)
        for st, x, b in zip(s.steps, xs, s.stored, strict=True):
            if (s.label, st) == chosen:
                ax_size.plot([x], [b / 2**20], "*", color="red", ms=14)
    handles = [Patch(color=c, label=k) for k, c in colors.items()]
    handles.append(ax_size.plot([], [], "*", color="red", ms=10, ls="", label="selected")[0])
    ax_stall.set(title="save stall per checkpoint", xlabel="step", ylabel="seconds")
    ax_size.set(title="stored per checkpoint (new bytes)", xlabel="step", ylabel="MiB")
    ax_size.legend(handles=handles, fontsize=7)
    for ax in (ax_stall, ax_size):
        ax.grid(alpha=0.3, axis="y")


def render(series: list[Series], chosen: tuple[str, int], title: str) -> bytes:
    """The PNG (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    _panel_curves(axes[0][0], axes[0][1], series)
    _panel_checkpoints(axes[1][0], axes[1][1], series, chosen)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def collect(candidates: list[tuple[str, str]], client=None) -> list[Series]:
    """The pretraining run (the candidates' base) and each candidate (name, checkpoint root)."""
    out: list[Series] = []
    bases: dict[str, int] = {}
    for name, ckpt_uri in candidates:
        ckpt = env.open_storage(ckpt_uri)
        parent = rootreader.read_parent(ckpt)
        offset = int(parent["step"]) if parent else 0
        if parent and parent["uri"] not in bases:
            bases[parent["uri"]] = offset
            out.append(read_series(env.open_storage(parent["uri"]), "pretrain"))
        out.append(read_series(ckpt, name, offset))
    for s in out:
        add_mlflow_history(s, client)
    return out


def chosen_label(series: list[Series], name: str) -> str:
    """The label `read_series` gave candidate `name`."""
    return next((s.label for s in series if s.label.split(" (")[0] == name), name)
