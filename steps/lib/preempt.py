"""Preemption saves: a SIGTERM to any rank makes every rank commit the current step, then exit.

Kubernetes preempts a pod by sending SIGTERM to its main process and SIGKILL
`terminationGracePeriodSeconds` later; under torchrun the agent forwards the SIGTERM to its
workers and waits `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` for them. The signal reaches one pod only,
so a flag set by the handler is not enough: at each step boundary every rank contributes its
flag to an all_reduce MAX of one element on the training process group (cheap next to a step's
collectives), and all ranks learn at the same step that one of them was signalled. They then
save that step (unless it was just saved), wait for the commit, and exit with
`PREEMPTED_EXIT`, which the rank template's retryStrategy retries; the resumed run starts
exactly at that step, so no step is lost and none is trained twice.

The handler only sets the flag (no I/O, no locks: it runs between two bytecodes of the main
thread, which may hold any lock).
"""

from __future__ import annotations

import logging
import signal
import threading

import torch
import torch.distributed as dist
from ckptflow.steps.lib.plumbing import Abandon

log = logging.getLogger("ckptflow.preempt")

PREEMPTED_EXIT = 143  # 128 + SIGTERM: what a node reports for a pod that ended on SIGTERM


class Preempted(Abandon):
    """Raised on every rank once a preemption save is committed: leave now, retried.

    Nothing else is written (no outputs, no FINISHED); the MLflow run ends KILLED."""

    exit_code = PREEMPTED_EXIT
    end_status = "KILLED"


class PreemptionFlag:
    """Whether this process was asked to stop (SIGTERM), and the agreement across ranks."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the signal received, None if none
        self._previous = None
        self._installed = False

    @property
    def local(self) -> bool:
        """This process was signalled."""
        return self.signum is not None

    def set(self, signum: int = signal.SIGTERM) -> None:
        """Mark this process as signalled (the handler; tests call it directly)."""
        self.signum = signum

    def _handler(self, signum, frame) -> None:  # noqa: ARG002 - the signal module's signature
        self.set(signum)

    def install(self) -> None:
        """Catch SIGTERM from now on (main thread only: Python delivers signals there)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._handler)
        self._installed = True

    def uninstall(self) -> None:
        """Put back the handler that was there before `install`."""
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)
            self._installed = False

    def agree(self, device: torch.device | None = None) -> bool:
        """True on every rank when any rank was signalled: a collective, every rank calls it
        at the same step boundary. A group of one needs no collective."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.local
        flag = torch.tensor([1.0 if self.local else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


FLAG = PreemptionFlag()  # this process's: installed by `distributed.ranked_step_run`
