"""A save's intent while it runs: the heartbeat that keeps it live for GC, and the removal of
debris an uncommitted step folder must not carry into the save (writer.py uses both)."""

from __future__ import annotations

import logging
import threading

from ckptflow.core import intent, layout
from ckptflow.core.storage import Storage

HEARTBEAT_S = layout.SAVE_LEASE_S / 4  # how often a save in progress refreshes its intent
log = logging.getLogger("ckptflow.checkpoint")


class Heartbeat:
    """Refreshes a save's intent every HEARTBEAT_S until stopped, so GC sees the save live
    (ckptflow.core.intent) however long it runs and whatever GC's grace period."""

    def __init__(self, storage: Storage, rel: str, blob: bytes):
        self.storage, self.rel, self.blob = storage, rel, blob
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.storage.touch(self.rel, self.blob)
            except Exception as exc:  # the commit's object check still guards the save
                log.warning("could not refresh the save intent %s: %s", self.rel, exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def end(self) -> None:
        """Mark the intent ended (a failed save); best effort: a lapsed lease ends it too."""
        try:
            intent.end_intent(self.storage, self.rel, self.blob)
        except Exception as exc:
            log.warning("could not mark the save intent %s ended: %s", self.rel, exc)


def clear_stray_archived(st, step: int) -> None:
    """Remove an ARCHIVED marker from the folder of a step that is not committed: the archiver
    marks only committed steps and never removes COMMIT, so such a marker is debris or forged,
    and left in place it would send every load of the new step to another root (which holds
    no copy of it): the save would report success for a step that never loads."""
    rel = f"{layout.step_dir(step)}/{layout.ARCHIVED}"
    if st.exists(rel):
        log.warning("removing %s: an archive marker in an uncommitted step folder", st.url(rel))
        st.delete([rel])
