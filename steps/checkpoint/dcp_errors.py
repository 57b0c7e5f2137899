"""DCP's failure wrapper undone: the one place saves and loads turn a `CheckpointException`
(DCP gathers every rank's exception into one) back into the first rank's own exception, which
carries our clear message (a corrupt object, a mismatched state dict) for the user.
"""

from __future__ import annotations

from torch.distributed.checkpoint.api import CheckpointException


def unwrap(exc: CheckpointException) -> BaseException:
    """The first rank's original exception from DCP's wrapper (it carries our clear message)."""
    for _rank, failure in sorted(exc.failures.items()):
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, BaseException):
            return inner
    return exc
