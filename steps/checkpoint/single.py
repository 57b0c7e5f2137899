"""DCP calls made without a process group on purpose, without DCP's warning about it.

`dcp.save` / `dcp.load` warn "torch.distributed is disabled, unavailable or uninitialized,
assuming the intent is to save in a single process" on every call without an initialized
group, even when the caller passes `no_dist=True` (torch/distributed/checkpoint/
state_dict_saver.py, state_dict_loader.py): every export, select and single-rank step printed
it. The engine passes `no_dist` itself, so the message says nothing to its user.

One filter for that one message from DCP's modules, installed by each Checkpointer (the same
filter again replaces itself: no growth). `warnings.catch_warnings` around each call would not
do: saves run in a worker thread, and it swaps the process's whole filter list (not
thread-safe: a filter set meanwhile by another thread would be lost).
"""

from __future__ import annotations

import warnings

# DCP's own wording (the save and the load message both start with it), from its modules
_MESSAGE = r"torch\.distributed is disabled, unavailable or uninitialized"
_MODULE = r"torch\.distributed\.checkpoint\."


def quiet_single_process() -> None:
    """Stop DCP's no-process-group message (only it: every other warning still shows)."""
    warnings.filterwarnings("ignore", message=_MESSAGE, category=UserWarning, module=_MODULE)
