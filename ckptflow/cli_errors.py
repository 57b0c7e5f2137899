"""The CLI's error table: failures a user's input causes, classified by type and error code
(never by message text), wherever in a command they surface.

A path the user gave that is a file where a folder is needed (`run --workdir FILE`), in a
folder that does not exist (`run --status-file nodir/s.json`, `render -o nodir/x.yaml`), a
folder where a file is needed (`render -o DIR`), or a file that is not UTF-8 text (`run
bad.yaml`) is a usage error: one line naming the path and the fix, and the usage exit code 2
that every command shares (argparse's), so a script tells a typo from a failed run (exit 1).
What the table does not name is a bug: the dispatcher reports it as an unexpected error.
"""

from __future__ import annotations

import errno

__all__ = ["USAGE_EXIT", "TABLE", "user_error"]

USAGE_EXIT = 2

# (exception type, errno (None: any), what it means and the fix). The first match wins, so a
# specific errno comes before its type's general entry.
TABLE: tuple[tuple[type[BaseException], int | None, str], ...] = (
    (OSError, errno.EILSEQ, ""),  # its own words: not UTF-8 text (runner document.read_text)
    (OSError, errno.ENAMETOOLONG, "the name is too long: give a shorter path"),
    (IsADirectoryError, None, "is a folder: give a file's path"),
    (NotADirectoryError, None, "a part of this path is a file, not a folder: give a folder"),
    (FileExistsError, None, "is a file, not a folder: give a folder"),
    (FileNotFoundError, None, "no such file or folder: create the folder or give another path"),
    (PermissionError, None, "permission denied: give a path you may use"),
)


def user_error(exc: BaseException) -> str | None:
    """The one line for a failure that `TABLE` classifies as the user's input, or None."""
    for kind, code, fix in TABLE:
        if not isinstance(exc, kind) or (code is not None and exc.errno != code):
            continue
        where = getattr(exc, "filename", None)
        what = fix or exc.strerror or str(exc)
        line = f"{where}: {what}" if where is not None else what
        return line.replace("\n", " ")
    return None
