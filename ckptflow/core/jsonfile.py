"""The one bounded JSON reader: every JSON file the engine reads is parsed here.

Every file under a checkpoint root may be hostile (truncated, foreign, crafted). Python's
`json.loads` alone fails on such files in ways callers do not expect: deep nesting raises
RecursionError, a 5,000-digit integer ValueError (the interpreter's int/str digit limit), and
whatever parses may still be nested deeper than the code walking it can follow. `loads` bounds
the size, the nesting depth (counted before parsing, without recursion) and the digits of every
integer, and turns every failure into `BadJsonFile` (a CorruptCheckpoint naming the file), so a
bad file is a corrupt step, never a crash.

Standard library only: runroot imports this and must stay cheap to import.
"""

from __future__ import annotations

import gc
import json
import threading
from contextlib import contextmanager
from itertools import accumulate

from ckptflow.core.errors import CorruptCheckpoint

MAX_BYTES = 1 << 20  # a small record (COMMIT, PIN, eval.json, markers): a few KiB in practice
MAX_DEPTH = 64  # deeper than any file we write (manifests nest 6 levels, values as deep as 64)
MAX_INT_DIGITS = 100  # wider than any integer we write (byte counts, steps: < 2**64)

_NOT_BRACKET_OR_QUOTE = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_DEPTH_STEP = [0] * 256
for _c in b"[{":
    _DEPTH_STEP[_c] = 1
for _c in b"]}":
    _DEPTH_STEP[_c] = -1


class BadJsonFile(CorruptCheckpoint):
    """A JSON file is too large, too deep, has a too-long integer, or is not JSON at all."""

    def __init__(self, what: str, reason: str):
        super().__init__(f"{what}: {reason}", [what])
        self.reason = reason


class _IntTooLong(ValueError):
    pass


def nesting_depth(blob: bytes) -> int:
    """The deepest bracket nesting of a JSON text, strings ignored; computed with C-level
    operations only (no recursion, no Python loop per byte)."""
    # Escapes exist only inside strings and parse left to right, as replace() scans: drop
    # escaped backslashes, then escaped quotes; every quote left opens or closes a string.
    unescaped = blob.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = unescaped.translate(None, _NOT_BRACKET_OR_QUOTE)
    brackets = b"".join(kept.split(b'"')[::2])  # the parts outside strings
    if len(brackets) <= 1:
        return len(brackets)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)))


_DIGITS_AS_ZERO = bytes(48 if 48 <= c <= 57 else 46 for c in range(256))  # digits: "0", else "."


def _has_digit_run(blob: bytes, max_int_digits: int) -> bool:
    """Whether a run of more than `max_int_digits` digits is anywhere (strings included);
    C-level operations only (a regex took half as long as parsing the file)."""
    return b"0" * (max_int_digits + 1) in blob.translate(_DIGITS_AS_ZERO)


_pause_lock = threading.Lock()
_pauses = [0, False]  # parses under way, whether the first one found the collector enabled


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused while a JSON text becomes objects.

    A parse builds a tree (no cycles), so no collection during it can free anything; yet
    every 700 objects one ran, moving the new objects toward the oldest generation, and a
    manifest (every rank's entries, on every rank) set off full-heap collections: about
    0.15 s of CPU each in a process that imported torch, on every rank at once (issue 36).
    Nested and concurrent parses (threads) re-enable it once, with the last of them, and
    only if it was enabled before the first."""
    with _pause_lock:
        if _pauses[0] == 0:
            _pauses[1] = gc.isenabled()
            gc.disable()
        _pauses[0] += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses[0] -= 1
            if _pauses[0] == 0 and _pauses[1]:
                gc.enable()


def loads(
    blob: bytes | str,
    *,
    what: str,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_int_digits: int = MAX_INT_DIGITS,
):
    """Parse a JSON file's bytes; `what` names the file (a URL) in the error.

    Raises BadJsonFile when the file is larger than `max_bytes`, nested deeper than
    `max_depth`, holds an integer of more than `max_int_digits` digits, or is not UTF-8 JSON.
    """
    if isinstance(blob, str):
        blob = blob.encode("utf-8", "surrogatepass")
    if len(blob) > max_bytes:
        raise BadJsonFile(what, f"larger than {max_bytes} bytes ({len(blob)})")
    if nesting_depth(blob) > max_depth:
        raise BadJsonFile(what, f"nested deeper than {max_depth} levels")

    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > max_int_digits:
            raise _IntTooLong(f"an integer of {len(text)} digits (at most {max_int_digits})")
        return int(text)

    # Without a digit run that long anywhere, no integer can be: parsed without a Python
    # call per integer (a manifest holds ~10 integers per item: 35% of its parse time).
    checked = _has_digit_run(blob, max_int_digits)
    try:
        with collector_paused():
            return json.loads(blob, parse_int=parse_int if checked else None)
    except _IntTooLong as exc:
        raise BadJsonFile(what, str(exc)) from None
    except RecursionError:  # a depth the pre-scan missed (e.g. inside a broken string)
        raise BadJsonFile(what, "nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limits
        raise BadJsonFile(what, f"not JSON ({type(exc).__name__}: {str(exc)[:80]})") from None


def read(storage, rel: str, *, max_bytes: int = MAX_BYTES, **limits):
    """A small JSON file of a Storage, read bounded (one byte more than accepted, so a huge
    file costs no more than that) and parsed by `loads`. FileNotFoundError passes through.
    Only for small limits: a local read allocates its limit up front."""
    blob = storage.read(rel, limit=max_bytes + 1)
    return loads(blob, what=storage.url(rel), max_bytes=max_bytes, **limits)
