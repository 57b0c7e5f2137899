"""The container structure of a torch.save'd state dict, kept beside its entries so an export
as torch gives back the same object (issue 37).

DCP's flattening, which names a checkpoint's entries, loses structure: it names every dict key
by `str(key)` (an optimizer's `state` keys 0, 1 came back as "0", "1", and
`optimizer.load_state_dict` then gave no parameter its Adam moments) and drops empty dicts.
`record` walks the original object beside DCP's paths and writes its containers in order, as
plain JSON (kept in the imported step's metadata under KEY):

    [["d", []], ["d", ["optim"]], ["d", ["optim", "state"]], ["d", ["optim", "state", 0]],
     ["v", ["optim", "state", 0, "exp_avg"], "optim.state.0.exp_avg"], ...]

"d" a dict, "o" an OrderedDict, "l" a list, each at its path of original keys (ints stay ints,
list positions are ints); "v" a leaf, named by its entry. Values (tuples among them) keep their
own exact types in the engine's safe value encoding. `rebuild` reads a record back, checked
(a step's metadata may be hostile): a record that does not match the step's entries exactly
(a step slimmed after its import) is ignored, and the export falls back to DCP's naming.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from ckptflow.steps.checkpoint.interop.base import MAX_NAME, MAX_TENSORS, fail

KEY = "torch_structure"  # the step metadata key that holds the record
MAX_DEPTH = 64  # containers nested in a state dict (as deep as the engine's values)
MAX_KEY = 2**63  # an int dict key's magnitude
_KINDS = {"d": dict, "o": OrderedDict, "l": list}


def _kind(obj) -> str:
    if isinstance(obj, OrderedDict):
        return "o"
    return "d" if isinstance(obj, Mapping) else "l"


def _key(k, where: str, path: tuple):
    """A dict key kept as it is: a string, or an int (never a bool)."""
    if isinstance(k, str) and len(k) <= MAX_NAME:
        return k
    if type(k) is int and abs(k) < MAX_KEY:
        return k
    shown = "/".join(map(str, path)) or "(top)"
    fail(
        where,
        f"dict key {k!r:.60} under {shown!r:.200} is a {type(k).__name__}: ckptflow keeps "
        "string and integer keys; rename it",
    )


def record(obj: dict, paths: dict[str, tuple], where: str) -> list:
    """The structure of `obj`, whose entries DCP named `paths` (fqn -> DCP path)."""
    by_path = {tuple(p): fqn for fqn, p in paths.items()}
    out: list = []
    # an explicit stack, not recursion: the depth is bounded here, not by the interpreter
    stack = [((), (), obj)]  # (original path, DCP path, node)
    while stack:
        path, dpath, node = stack.pop()
        if dpath in by_path:
            out.append(["v", list(path), by_path[dpath]])
            continue
        if len(path) > MAX_DEPTH:
            fail(where, f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, Mapping):
            items = [(_key(k, where, path), str(k), v) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(i, i, v) for i, v in enumerate(node)]
        else:  # DCP names every leaf it visits; a node it passed over holds nothing
            continue
        out.append([_kind(node), list(path)])
        for k, dk, v in reversed(items):  # popped in order: the record keeps key order
            stack.append(((*path, k), (*dpath, dk), v))
    return out


def _entry(e, where: str) -> tuple[str, tuple, str | None]:
    ok = isinstance(e, list) and len(e) in (2, 3) and isinstance(e[1], list)
    ok = ok and isinstance(e[0], str)  # a list there is unhashable: no `in _KINDS` for it
    ok = ok and (e[0] in _KINDS if len(e) == 2 else e[0] == "v" and isinstance(e[2], str))
    if not ok or len(e[1]) > MAX_DEPTH + 1:
        fail(where, "an entry must be [kind, path] or ['v', path, name]")
    for k in e[1]:
        if not (isinstance(k, str) and len(k) <= MAX_NAME) and not (
            type(k) is int and abs(k) < MAX_KEY
        ):
            fail(where, f"key {k!r:.60} is neither a string nor an integer")
    return e[0], tuple(e[1]), e[2] if len(e) == 3 else None


def rebuild(doc, flat: dict, where: str) -> dict | None:
    """The state dict `doc` (a record) describes, its leaves taken from `flat` (fqn -> leaf);
    None when the record names other entries than `flat` holds. A malformed record is a
    ForeignFormatError naming `where`."""
    where = f"{where}: metadata {KEY}"
    if not isinstance(doc, list) or not 1 <= len(doc) <= 4 * MAX_TENSORS:
        fail(where, "expected a list of entries")
    entries = [_entry(e, where) for e in doc]
    leaves = [name for _, _, name in entries if name is not None]
    if len(set(leaves)) != len(leaves) or set(leaves) != set(flat):
        return None
    if entries[0][:2] != ("d", ()) and entries[0][:2] != ("o", ()):
        fail(where, "the first entry must be the top-level dict")
    nodes: dict[tuple, object] = {(): _KINDS[entries[0][0]]()}
    for kind, path, name in entries[1:]:
        if not path:
            fail(where, "a second top-level entry")
        parent = nodes.get(path[:-1])
        key = path[-1]
        if isinstance(parent, list):
            if key != len(parent):
                fail(where, f"list entry {list(path)!r:.200} out of order")
        elif not isinstance(parent, dict) or key in parent:
            fail(where, f"entry {list(path)!r:.200} has no container or comes twice")
        value = flat[name] if kind == "v" else _KINDS[kind]()
        if isinstance(parent, list):
            parent.append(value)
        else:
            parent[key] = value
        if kind != "v":
            nodes[path] = value
    return nodes[()]
