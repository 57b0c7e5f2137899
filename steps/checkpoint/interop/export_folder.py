"""The export folder's contract: a folder holds exactly one checkpoint, and an export writes
only into a folder that is empty or an earlier export of ours (issue 37 defects 3-4, issue 38
point 7).

Loaders pick a folder's entry point by name: transformers opens `model.safetensors` before
the index, stock DCP reads `.metadata`, torch a `model.pt`. A new export written over an
earlier one used to leave the earlier `model.safetensors` (or `__N_0.distcp`) beside the new
files, and the folder then loaded as the old step. So an export:

1. refuses a `--to` that is its source or lies inside or around it (an export into a root
   became, for every later reader, a foreign checkpoint hiding the root's steps);
2. refuses a folder with files unless it holds MARKER, the record of an earlier export; even
   then it refuses checkpoint files the record does not name (somebody else's weights);
3. writes MARKER (in progress, naming the old files and the new ones), deletes the old files
   (entry points first), writes the new files (the writers put the entry point last) and
   writes MARKER again (complete) naming exactly the new files.

A crash at any point leaves a folder with no entry point, or one whose entry point is the new
step's; never the old step's beside new files. Files of others beside an export (a README)
are left as they are. A later export into the crashed folder finishes the job.
"""

from __future__ import annotations

import json
import posixpath
import re

from ckptflow.steps.checkpoint.interop import safetensors_io as sft
from ckptflow.steps.checkpoint.interop.base import MAX_TENSORS, check_file_name, read_json

from ckptflow.core.errors import CheckpointError
from ckptflow.core.storage import Storage, is_temporary

MARKER = "ckptflow-export.json"
FORMAT = "ckptflow-export"
ENTRY_POINTS = (sft.SINGLE, sft.INDEX, ".metadata", "model.pt")  # what a loader opens first
AUXILIARY = {  # files a writer may add beside its data files, by format
    "hf": (sft.INDEX, "config.json"),
    "dcp": (".metadata",),
    "torch": (),
}
# Names a loader could take for a checkpoint (a file of ours the record does not name, or
# somebody else's weights): never left beside an export, never deleted unasked.
CHECKPOINT_FILE = re.compile(
    r"(\.safetensors|\.safetensors\.index\.json|\.bin|\.bin\.index\.json|\.pt|\.pth|\.ckpt"
    r"|\.distcp|\.gguf|\.h5|\.msgpack)$|^\.metadata$"
)


class ExportFolderError(CheckpointError):
    """An export's target folder is not one an export may write (the message names the fix)."""


def _file_name(name, where: str) -> str:
    return name if name == ".metadata" else check_file_name(name, where)


def _recorded(dest: Storage) -> list[str]:
    """The files the folder's MARKER names (the record is checked: it may be hostile)."""
    where = dest.url(MARKER)
    doc = read_json(dest, MARKER, 64 << 20, max_depth=4)
    doc = doc if isinstance(doc, dict) else {}
    files = doc.get("files")
    if doc.get("format") != FORMAT or not isinstance(files, list) or len(files) > MAX_TENSORS:
        raise ExportFolderError(f"{where}: not a record of a ckptflow export; remove it")
    return [_file_name(f, where) for f in files]


def check_apart(dest: Storage, source: Storage | None) -> None:
    """Refuse an export into its own source, inside it or around it: it would write files
    into a ckptflow root (or delete the source as an earlier export's files)."""
    if source is None:
        return
    if source.contains(dest):
        raise ExportFolderError(
            f"--to {dest.url()} is inside the checkpoint it exports ({source.url()}): "
            "export to a folder outside it"
        )
    if dest.contains(source):
        raise ExportFolderError(
            f"--to {dest.url()} holds the checkpoint it exports ({source.url()}): "
            "export to a folder outside it"
        )


def claim(dest: Storage, source: Storage | None, fmt: str, new_files: list[str]) -> None:
    """Make `dest` ready for an export of `fmt` writing `new_files`: checked (see the module
    doc), recorded as in progress, and emptied of the earlier export's files."""
    check_apart(dest, source)
    if dest.is_file():
        raise ExportFolderError(f"--to {dest.url()} is a file: give a folder")
    top = dest.listdir()  # one level first: `--to ~` must not walk a whole home folder
    old: list[str] = []
    if top:
        if MARKER not in top:
            raise ExportFolderError(
                f"--to {dest.url()} is not empty and holds no earlier export of ckptflow "
                f"(found: {', '.join(top[:5])}): export into a new or empty folder"
            )
        present = [e.path for e in dest.walk() if not is_temporary(posixpath.basename(e.path))]
        old = _recorded(dest)
        theirs = sorted(
            p
            for p in present
            if p not in old and p != MARKER and CHECKPOINT_FILE.search(posixpath.basename(p))
        )
        if theirs:
            raise ExportFolderError(
                f"--to {dest.url()} holds checkpoint files no export of ours wrote "
                f"({', '.join(theirs[:5])}): remove them or export elsewhere"
            )
    planned = [*new_files, *AUXILIARY[fmt]]
    _write_record(dest, sorted(set(old) | set(planned)), complete=False)
    first = [f for f in ENTRY_POINTS if f in old]  # a loader's way in goes first
    dest.delete(first + sorted(set(old) - set(first)))


def finish(dest: Storage, fmt: str, files: list[str], about: dict) -> None:
    """Record the export as complete: exactly `files` (every file it wrote) and `about`."""
    _write_record(dest, sorted(files), complete=True, export_format=fmt, **about)


def _write_record(dest: Storage, files: list[str], **fields) -> None:
    doc = {"format": FORMAT, **fields, "files": files}
    blob = json.dumps(doc, indent=1, sort_keys=True, default=str).encode()
    dest.write(MARKER, blob, atomic=True)
