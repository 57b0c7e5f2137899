"""A safe encoding for the non-tensor values of a state dict (never pickle).

Step counters, RNG states, scheduler state and data positions round-trip through tagged JSON.
Decoding builds only plain Python values, numpy arrays and CPU tensors of allow-listed dtypes:
a crafted blob can fail to decode, but it can never execute code or allocate unboundedly.
"""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import torch

from ckptflow.core import jsonfile

MAGIC = "ckptflow-value-v1"
MAX_BLOB = 256 * 1024 * 1024
MAX_DEPTH = 64
# JSON levels of a value nested MAX_DEPTH deep: a dict level is {"$dict": [[k, v]]} (3 levels)
MAX_JSON_DEPTH = 3 * MAX_DEPTH + 4

_TORCH_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}
_NP_DTYPES = {
    "float64",
    "float32",
    "float16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint64",
    "uint32",
    "uint16",
    "uint8",
    "bool",
}


class UnsafeValueError(ValueError):
    """The value cannot be encoded safely, or a stored blob is not a safe encoding."""


def _enc(obj, depth: int):
    if depth > MAX_DEPTH:
        raise UnsafeValueError("value nested too deeply")
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, int):
        return obj if abs(obj) < 2**53 else {"$int": str(obj)}
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"$float": repr(obj)}
    if isinstance(obj, list):
        return [_enc(v, depth + 1) for v in obj]
    if isinstance(obj, tuple):
        return {"$tuple": [_enc(v, depth + 1) for v in obj]}
    if isinstance(obj, dict):
        return {"$dict": [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in obj.items()]}
    if isinstance(obj, bytes | bytearray):
        return {"$bytes": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _TORCH_DTYPES:
            raise UnsafeValueError(f"tensor dtype {t.dtype} is not supported in values")
        # reshape first: a 0-dim tensor cannot be viewed as bytes of another element size
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"$tensor": [name, list(t.shape), base64.b64encode(data).decode()]}
    if isinstance(obj, np.ndarray):
        if obj.dtype.name not in _NP_DTYPES:
            raise UnsafeValueError(f"numpy dtype {obj.dtype} is not supported in values")
        data = np.ascontiguousarray(obj).tobytes()
        return {"$ndarray": [obj.dtype.name, list(obj.shape), base64.b64encode(data).decode()]}
    if isinstance(obj, np.generic):
        return _enc(obj.item(), depth)
    raise UnsafeValueError(
        f"cannot store a {type(obj).__name__} safely: use plain values, tensors or numpy arrays"
    )


def encode_value(obj) -> bytes:
    """Encode a value as tagged JSON bytes."""
    return json.dumps({"$": MAGIC, "v": _enc(obj, 0)}, separators=(",", ":")).encode()


def _shape(shape, nbytes_per, data_len: int) -> tuple:
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise UnsafeValueError("bad shape")
    n = math.prod(shape)
    if n * nbytes_per != data_len:
        raise UnsafeValueError("array data does not match its shape")
    return tuple(shape)


def _dec(obj, depth: int):
    if depth > MAX_DEPTH:
        raise UnsafeValueError("value nested too deeply")
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, list):
        return [_dec(v, depth + 1) for v in obj]
    if not isinstance(obj, dict) or len(obj) != 1:
        raise UnsafeValueError("unknown value node")
    ((tag, val),) = obj.items()
    if tag == "$int" and isinstance(val, str):
        return int(val)
    if tag == "$float" and val in ("nan", "inf", "-inf"):
        return float(val)
    if tag == "$tuple" and isinstance(val, list):
        return tuple(_dec(v, depth + 1) for v in val)
    if tag == "$dict" and isinstance(val, list):
        out = {}
        for pair in val:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise UnsafeValueError("bad dict entry")
            out[_dec(pair[0], depth + 1)] = _dec(pair[1], depth + 1)
        return out
    if tag == "$bytes" and isinstance(val, str):
        return base64.b64decode(val, validate=True)
    if tag in ("$tensor", "$ndarray") and isinstance(val, list) and len(val) == 3:
        name, shape, b64 = val
        if not isinstance(b64, str):
            raise UnsafeValueError("bad array data")
        data = base64.b64decode(b64, validate=True)
        if tag == "$tensor":
            if name not in _TORCH_DTYPES:
                raise UnsafeValueError(f"tensor dtype {name!r} not allowed")
            dtype = _TORCH_DTYPES[name]
            shape = _shape(shape, torch.empty(0, dtype=dtype).element_size(), len(data))
            flat = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8)
                if data
                else torch.empty(0, dtype=torch.uint8)
            )
            return flat.view(dtype).reshape(shape).clone()
        if name not in _NP_DTYPES:
            raise UnsafeValueError(f"numpy dtype {name!r} not allowed")
        shape = _shape(shape, np.dtype(name).itemsize, len(data))
        return np.frombuffer(data, dtype=name).reshape(shape).copy()
    raise UnsafeValueError(f"unknown value tag {tag!r}")


def decode_value(blob: bytes):
    """Decode bytes made by encode_value; anything else (a pickle, say) is refused."""
    if len(blob) > MAX_BLOB:
        raise UnsafeValueError("value blob too large")
    try:
        doc = jsonfile.loads(
            blob, what="stored value", max_bytes=MAX_BLOB, max_depth=MAX_JSON_DEPTH
        )
    except jsonfile.BadJsonFile as exc:
        raise UnsafeValueError(
            f"stored value is not ckptflow's safe encoding ({exc.reason}; a pickle or foreign "
            "data?); refusing to load it"
        ) from exc
    if not isinstance(doc, dict) or doc.get("$") != MAGIC or set(doc) != {"$", "v"}:
        raise UnsafeValueError("stored value is not ckptflow's safe encoding; refusing to load it")
    try:
        return _dec(doc["v"], 0)
    except (ValueError, TypeError, RecursionError) as exc:
        if isinstance(exc, UnsafeValueError):
            raise
        raise UnsafeValueError(f"malformed stored value: {exc}") from exc
