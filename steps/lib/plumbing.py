"""Step plumbing: what a step reports besides MLflow (Argo output files, log lines, progress)."""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger("ckptflow.progress")


def write_outputs(output_dir: str | None, values: dict) -> None:
    """One small text file per value in --output-dir: Argo reads them as output parameters."""
    if not output_dir:
        return
    os.makedirs(output_dir, exist_ok=True)
    for name, value in values.items():
        text = value if isinstance(value, str) else json.dumps(value)
        with open(os.path.join(output_dir, name), "w") as f:
            f.write(text)


def setup_logging(rank: int = 0) -> None:
    """Plain timestamped lines on stderr, prefixed with the rank (logs, not terminals)."""
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [rank{rank}] %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    # its SQLAlchemy store logs a full traceback per failed call; our own warning says enough
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


class Progress:
    """A one-line progress display on a terminal; plain log lines (every `every` steps) otherwise."""

    def __init__(self, total: int, *, enabled: bool = True, every: int = 10, stream=None):
        import sys

        self.total, self.enabled, self.every = total, enabled, every
        self.stream = stream or sys.stderr
        self.tty = enabled and self.stream.isatty()

    def update(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        text = f"step {step}/{self.total} " + " ".join(
            f"{k} {v:.4g}" for k, v in metrics.items() if k in ("train_loss", "lr", "tokens_per_s")
        )
        if self.tty:
            self.stream.write("\r" + text.ljust(80))
            self.stream.flush()
        elif step % self.every == 0 or step == self.total:
            log.info("%s", text)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
