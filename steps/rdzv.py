"""`python -m ckptflow.steps.rdzv`: the TCP store where torchrun's c10d rendezvous of N rank pods meets.

The pretraining DAG runs this as an Argo daemon task; each rank's torchrun connects to
`{{tasks.rdzv.ip}}:PORT` with `--rdzv-conf=is_host=false` (workflows/pretrain_dag.py explains
why a separate daemon rather than rank 0). The store holds only rendezvous bookkeeping: no
training state, so it needs no storage, credentials or MLflow. It serves until stopped
(Argo stops daemons when their DAG ends) or until `--timeout-seconds`.
"""

from __future__ import annotations

import signal
import sys
import threading
from datetime import timedelta

from ckptflow.contract import RdzvArgs, parse


def parse_args(argv: list[str] | None) -> RdzvArgs:
    """Build the config from the command line."""
    return parse(RdzvArgs, argv, description=__doc__.split("\n")[0])


def serve(cfg: RdzvArgs, stop: threading.Event) -> None:
    """Host the store until `stop` is set or the timeout passes."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore(
            cfg.host,
            cfg.port,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=60),
        )
    except (RuntimeError, OSError) as exc:
        # The usual cause is a port already taken (another run's store on this host).
        raise SystemExit(
            f"ckptflow.steps.rdzv: cannot listen on {cfg.host}:{cfg.port}: {exc}"
        ) from exc
    print(f"rendezvous store listening on {cfg.host}:{cfg.port}", flush=True)
    stop.wait(cfg.timeout_seconds or None)
    del store
    print("rendezvous store stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Serve the rendezvous store; SIGTERM/SIGINT stop it cleanly (exit 0)."""
    cfg = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(cfg, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
