"""The engine's own process group, with the default group's timeout (issue 34).

Background saves run their collectives over a gloo group of the engine's own, so they never
interleave with the training's. torch's `new_group` does not inherit the timeout the default
group was made with (`init_process_group(timeout=...)`, the steps' --pg-timeout-s): it takes the
backend's default, 30 min for gloo (torch/distributed/distributed_c10d.py
`_new_group_with_tag`: `timeout = _get_default_timeout(backend)`). A save in flight when a
peer's node went silent then held the survivor 30 min: its collective waited, and the
interpreter's exit waited for the save thread, although the training had already left with
PEER_LOST_EXIT, so the gang's restart waited on it.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import torch
import torch.distributed as dist


def default_timeout() -> timedelta | None:
    """The timeout of the default group's collectives; None when torch does not say (the
    group made then takes torch's default, as before)."""
    world = dist.group.WORLD
    if world is None:
        return None
    # no public getter: each backend's options hold the timeout it was made with
    for device in (torch.device("cpu"), *getattr(world, "_device_types", ())):
        with contextlib.suppress(Exception):
            timeout = world._get_backend(device).options._timeout
            if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
                return timeout
    return None


def own_gloo_group():
    """A new gloo group of every rank (a collective call) that gives up when the default
    group's collectives do."""
    return dist.new_group(backend="gloo", timeout=default_timeout())
