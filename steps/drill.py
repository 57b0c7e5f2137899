"""`python -m ckptflow.steps.drill`: a verification drill of one checkpoint root.

Reads every byte of the newest `--newest` committed steps (ckptflow.core.drill) and test-loads
the latest valid one into its model (built from the manifest's `model_config`), then runs one
forward pass and checks the output is finite. A step that fails either check is marked corrupt
for every reader (loads fall back past it, retention does not count it as valid) and the step
exits 1, so the CronWorkflow run fails and someone sees it. Outputs: `verified` and `corrupt`
(JSON lists of steps) and `loaded_step`.
"""

from __future__ import annotations

import json
import logging
import time
import warnings

import torch
from ckptflow.steps.checkpoint import Checkpointer
from ckptflow.steps.lib import plumbing
from ckptflow.steps.lib.model import GPT, ModelConfig

from ckptflow import env
from ckptflow.contract.argv import parse
from ckptflow.contract.stepargs import DrillArgs
from ckptflow.core import drill, health, rootreader
from ckptflow.core.errors import CheckpointError

log = logging.getLogger("ckptflow.drill")


def parse_args(argv=None) -> DrillArgs:
    return parse(DrillArgs, argv, description=__doc__.split("\n")[0])


def test_load(ck: Checkpointer, step: int) -> None:
    """Load `step`'s weights into a model built from its manifest and run it once; raise
    CheckpointError when it does not load or gives non-finite output."""
    meta = ck.manifest(step).get("metadata") or {}
    if "model_config" not in meta:
        raise CheckpointError(f"step {step} has no model_config in its metadata: cannot test-load")
    cfg = ModelConfig.from_dict(meta["model_config"])
    torch.manual_seed(0)
    model = GPT(cfg)
    state = {"model": model.state_dict()}
    ck.load(state, step=step)
    model.load_state_dict(state["model"])
    with torch.no_grad():
        ids = torch.zeros(1, min(8, cfg.seq_len), dtype=torch.long)
        out = model(ids)
    logits = out[0] if isinstance(out, tuple) else out
    if not torch.isfinite(logits).all():
        raise CheckpointError(f"step {step} loads but its model gives non-finite output")


def run_drill(cfg: DrillArgs, run: plumbing.StepRun) -> None:
    """The drill; fails the run (exit 1) when a step was found corrupt."""
    st = env.open_storage(cfg.ckpt_root)
    if not rootreader.committed_steps(st):  # a wrong root must not pass as a clean drill
        raise plumbing.StepError(
            f"{st.uri} holds no committed checkpoint (or does not exist): nothing to drill; "
            "check the root URI"
        )
    report = drill.verify_newest(st, cfg.newest)
    loaded = None
    if cfg.test_load:
        ck = Checkpointer(cfg.ckpt_root, storage=st)
        try:
            step = ck.latest()
            if step is not None:
                t0 = time.time()
                try:
                    test_load(ck, step)
                    loaded = step
                except Exception as exc:  # noqa: BLE001 - any failure to load is the finding
                    why = f"test-load: {type(exc).__name__}: {exc}"
                    report.corrupt[step] = [why]
                    drill.fail(st, step, why[:1500], "drill")
                health.record(
                    st,
                    "drill",
                    step=step,
                    outcome="ok" if loaded is not None else "failed",
                    duration_s=time.time() - t0,
                )
        finally:
            ck.close()
    run.outputs.update(
        verified=json.dumps(report.verified),
        corrupt=json.dumps(sorted(report.corrupt)),
        loaded_step="" if loaded is None else str(loaded),
    )
    for step, bad in sorted(report.corrupt.items()):
        log.error("step %d is corrupt and now marked so: %s", step, "; ".join(bad)[:500])
    log.info(
        "drill of %s: verified %s, test-loaded %s, corrupt %s",
        st.uri,
        report.verified,
        loaded,
        sorted(report.corrupt) or "none",
    )
    if report.corrupt:
        run.fail(1)


def main(argv=None) -> int:
    cfg = parse_args(argv)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    with plumbing.step_run("drill", cfg, log, attach="") as run:
        run_drill(cfg, run)
    return run.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
