"""Snapshot a state dict into reusable host buffers: the only part of an async save that stalls.

Tensors (plain and DTensor) are copied into CPU buffers kept across saves, keyed by their
path in the state dict, so resident memory does not grow from save to save. With CUDA the
buffers are pinned and the copies non-blocking, followed by one synchronize. Non-tensor values
are deep-copied, so training may mutate its own objects while the background save runs.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch without distributed
    DTensor = ()  # type: ignore[assignment]


class Stager:
    """Copies state dicts into host buffers it owns and reuses."""

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}
        self._pin = torch.cuda.is_available()

    def _buffer(self, path: str, src: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=self._pin)
            self._buffers[path] = buf
        # A conjugate or negative view holds its values only lazily: its bytes are not them.
        src = src.detach().resolve_conj().resolve_neg()
        if src.device.type == "cpu" and src.is_contiguous() and src.numel():
            # One memcpy on the calling thread: torch's copy_ splits CPU copies over its
            # intra-op threads, which contend with training's threads and stall longer.
            np.copyto(
                buf.reshape(-1).view(torch.uint8).numpy(), src.reshape(-1).view(torch.uint8).numpy()
            )
        else:
            buf.copy_(src, non_blocking=self._pin and src.is_cuda)
        return buf

    def _stage(self, obj, path: str):
        if isinstance(obj, DTensor):
            local = self._buffer(path, obj._local_tensor)
            # A CPU DTensor with the same mesh and placements: DCP plans the same chunks.
            return DTensor(local, obj._spec, requires_grad=False)
        if isinstance(obj, torch.Tensor):
            return self._buffer(path, obj)
        if isinstance(obj, dict):
            return {k: self._stage(v, f"{path}/{k}") for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._stage(v, f"{path}/{i}") for i, v in enumerate(obj)]
        return copy.deepcopy(obj)

    def stage(self, state_dict: dict) -> dict:
        """A host copy of `state_dict`, complete when this returns."""
        staged = self._stage(state_dict, "")
        if self._pin:
            torch.cuda.synchronize()
        return staged

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())
