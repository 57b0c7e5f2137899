"""A benchmark's own section of docs/benchmarks.md, between its begin and end markers: written
in place when it is there, appended otherwise (other scripts' sections are left alone)."""

from __future__ import annotations

import os

DOCS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks.md"
)


def write_section(name: str, text: str, path: str = DOCS) -> None:
    """Put `text` between `<!-- NAME: begin -->` and `<!-- NAME: end -->` in `path`."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    section = f"{begin}\n{text.rstrip()}\n{end}"
    with open(path) as f:
        doc = f.read()
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + section + rest.split(end, 1)[1]
    else:
        doc = doc.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(doc)
