"""Which stored objects a save may reference without writing them (deduplication, delta bases).

An object's name is the xxh3-128 of its bytes, but presence under that name proves nothing: a
local file can rot, be truncated or be overwritten, and a step that references it would be
corrupt the moment it commits. So a save references an existing object only once its bytes
have been read and found to be what their name says, or when this process did exactly that
before and the file has not changed since (`Storage.fingerprint`: one stat or HEAD, no data).

Cost: every reused object is read once per process (the first save that reuses it after it
was written, or after a restart); later saves only look at its fingerprint. Objects that a
load in this process read and verified are noted too, so a restarted job (or a fine-tune that
loaded its base) does not read them a second time. Media errors beneath an unchanged local file
are the one change a fingerprint cannot see; a read-back would mostly be served from the page
cache and miss them too, and the load checks every byte it reads.
"""

from __future__ import annotations

import threading

from ckptflow.core import codec, layout
from ckptflow.core.storage import Storage


class ObjectTrust:
    """Fingerprints of objects this process has read and verified (URL -> fingerprint)."""

    def __init__(self):
        self._seen: dict[str, tuple] = {}
        self._lock = threading.Lock()

    def note(self, storage: Storage, key: str, before: tuple | None) -> None:
        """Record that `key`'s bytes in `storage` were verified, read between a fingerprint
        taken `before` and one taken now; nothing is recorded unless the two agree."""
        rel = layout.object_path(key)
        try:
            after = storage.fingerprint(rel)
        except FileNotFoundError:
            return
        if before is not None and before == after:
            with self._lock:
                self._seen[storage.url(rel)] = after

    def sound(self, stores: list[Storage], key: str, size: int) -> bool:
        """True when the first of `stores` holding object `key` (where a reader finds it)
        holds exactly the `size` bytes its name says; False when it is absent or damaged."""
        rel = layout.object_path(key)
        for st in stores:
            try:
                before = st.fingerprint(rel)
                if before is not None and self._seen.get(st.url(rel)) == before:
                    return True
                blob = st.read(rel)
            except FileNotFoundError:
                continue
            if len(blob) != size or codec.digest(blob) != key:
                return False  # the copy a reader would use is damaged: never reference it
            self.note(st, key, before)
            return True
        return False


TRUST = ObjectTrust()  # one per process: a fingerprint is a fact about a file, not a Checkpointer
