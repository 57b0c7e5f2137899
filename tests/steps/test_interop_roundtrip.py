"""Round trips through import and export, generated (issue 37): nested dicts, lists and tuples
with int and str keys, empty containers, tensors of several dtypes (random bytes: NaNs,
-0.0 and subnormals among them) and scalars. Checked bitwise and structurally:

- torch.save -> `ckpt import` -> `ckpt export --format torch`: the same object back (int keys
  stay ints, empty dicts and lists stay, tuples stay tuples, OrderedDicts stay ordered);
- torch.save -> import -> export dcp -> stock `dcp.load` into the original's structure: every
  tensor bitwise;
- safetensors -> import -> export hf: the same tensors, bitwise, same dtypes;
- a hostile structure record in a step's metadata: rebuilt, ignored or refused naming the
  step, never a crash.

Default run: a few examples per property (derandomized); `-m slow` runs many (SLOW);
`CKPTFLOW_INTEROP_EXAMPLES=N` sets the count.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections import OrderedDict

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ckptflow.steps.checkpoint.interop import (
    ForeignFormatError,
    export_checkpoint,
    import_checkpoint,
)
from ckptflow.steps.checkpoint.interop import structure as st_structure
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from ckptflow.core.errors import CheckpointError
from tests.steps.interop_helpers import assert_same_structure, tensor_bytes

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

DEFAULT = {"torch": 25, "dcp": 10, "hf": 15, "record": 200}
SLOW = {"torch": 600, "dcp": 200, "hf": 300, "record": 5000}
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]


CHECKED: dict[str, int] = {}  # examples that ran a whole round trip, by property


def _run(kind: str, slow: bool, test) -> None:
    """Run the property; most examples must reach the end of a round trip (not be skipped)."""
    CHECKED[kind] = 0
    s = _settings(kind, slow)
    s(test)()
    print(f"{kind}: {CHECKED[kind]} of {s.max_examples} examples round-tripped")
    assert CHECKED[kind] >= s.max_examples // 3, CHECKED


def _settings(kind: str, slow: bool) -> settings:
    env = os.environ.get("CKPTFLOW_INTEROP_EXAMPLES")
    n = int(env) if env else (SLOW if slow else DEFAULT)[kind]
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=not slow,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


@st.composite
def tensors(draw) -> torch.Tensor:
    """Any bytes as a tensor of a drawn dtype and shape (0 to 3 dims, empty ones too)."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    n = math.prod(shape)
    if dtype == torch.bool:  # a bool's bytes must be 0 or 1
        return torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n))).reshape(shape)
    raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    flat = (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if raw
        else torch.empty(0, dtype=torch.uint8)
    )
    return flat.view(dtype).reshape(shape).clone()


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
# str keys are letters (DCP joins keys with "." and names an int key by str(key): a key "1"
# beside 1, or "a.b" beside a -> b, is one name twice, refused at import, not generated here)
keys = st.one_of(st.integers(-5, 40), st.text("abcxyz_", min_size=1, max_size=4))
leaves = st.one_of(tensors(), scalars, st.tuples(scalars, scalars), st.tuples(tensors()))


def _dict(kind):
    return lambda children: st.dictionaries(keys, children, max_size=4).map(kind)


containers = st.recursive(
    leaves,
    lambda children: st.one_of(
        _dict(dict)(children),
        _dict(OrderedDict)(children),
        st.lists(children, max_size=3),
    ),
    max_leaves=12,
)
states = st.dictionaries(keys, containers, max_size=4)


def _terminal(obj) -> bool:
    """DCP's rule: a list is one entry unless it holds a tensor, a dict or such a list."""
    if isinstance(obj, dict):
        return False
    if isinstance(obj, list):
        return not any(
            isinstance(e, torch.Tensor) or (isinstance(e, (dict, list)) and not _terminal(e))
            for e in obj
        )
    return True


def _has_entry(obj) -> bool:
    """True when DCP's flattening finds at least one entry (else nothing can be imported)."""
    if _terminal(obj):
        return True
    return any(_has_entry(v) for v in (obj.values() if isinstance(obj, dict) else obj))


def _import(tmp: str, state: dict) -> str | None:
    torch.save(state, f"{tmp}/src.pt")
    root = f"{tmp}/ckpt"
    if not _has_entry(state):
        with pytest.raises(CheckpointError, match="nothing to import"):
            import_checkpoint(f"{tmp}/src.pt", root, step=1)
        return None
    import_checkpoint(f"{tmp}/src.pt", root, step=1)
    return root


def check_torch_round_trip(state: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = _import(tmp, state)
        if root is None:
            return
        export_checkpoint(root, f"{tmp}/out", fmt="torch")
        assert_same_structure(torch.load(f"{tmp}/out/model.pt", weights_only=True), state)
        CHECKED["torch"] = CHECKED.get("torch", 0) + 1


def _zeroed(obj):
    """The state as stock DCP sees it (every dict key a string: DCP names keys by str(key),
    and sorts the top level's), every tensor it loads in place (not in a tuple) zeroed."""
    if isinstance(obj, dict):
        return {str(k): _zeroed(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_zeroed(v) for v in obj]
    return torch.zeros_like(obj) if isinstance(obj, torch.Tensor) else obj


def _tensors_in_place(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors_in_place(v, (*path, str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _tensors_in_place(v, (*path, i))
    elif isinstance(obj, torch.Tensor):
        yield path, obj


def _at(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def _stock_dcp_round_trips(state: dict, tmp: str) -> bool:
    """Whether stock DCP itself saves and loads back this state (it cannot, for one, load a
    list holding an empty dict: its load names entries its save never wrote)."""
    try:
        dcp.save(_zeroed(state), checkpoint_id=f"{tmp}/stock", no_dist=True)
        dcp.load(_zeroed(state), checkpoint_id=f"{tmp}/stock", no_dist=True)
    except BaseException:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        return False
    return True


def check_dcp_round_trip(state: dict) -> None:
    """Differential: where stock DCP round-trips a state itself, our export of its import
    loads with stock `dcp.load` into the same structure, every tensor bitwise."""
    with tempfile.TemporaryDirectory() as tmp:
        root = _import(tmp, state)
        if root is None or not _stock_dcp_round_trips(state, tmp):
            return
        export_checkpoint(root, f"{tmp}/out", fmt="dcp")
        target = _zeroed(state)
        dcp.load(target, checkpoint_id=f"{tmp}/out", no_dist=True)
        for path, want in _tensors_in_place(state):
            got = _at(target, path)
            assert got.dtype == want.dtype and torch.equal(tensor_bytes(got), tensor_bytes(want)), (
                path
            )
        CHECKED["dcp"] = CHECKED.get("dcp", 0) + 1


@pytest.mark.parametrize("slow", [pytest.param(True, marks=pytest.mark.slow), False])
def test_torch_import_export_gives_the_same_object_back(slow):
    _run("torch", slow, given(states)(check_torch_round_trip))


@pytest.mark.parametrize("slow", [pytest.param(True, marks=pytest.mark.slow), False])
def test_dcp_export_loads_every_tensor_bitwise_with_stock_dcp(slow):
    _run("dcp", slow, given(states)(check_dcp_round_trip))


# safetensors names: no "__metadata__" (refused by its own test), dots as HF names use them
names = st.text("abcdefgh._0123456789", min_size=1, max_size=12).filter(
    lambda n: n != "__metadata__"
)


def check_hf_round_trip(flat: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        save_file(flat, f"{tmp}/w.safetensors")
        import_checkpoint(f"{tmp}/w.safetensors", f"{tmp}/ckpt", step=1)
        rep = export_checkpoint(f"{tmp}/ckpt", f"{tmp}/out", fmt="hf", shard_bytes=64)
        got = {}
        for f in rep.files:
            got.update(load_file(f"{tmp}/out/{f['name']}"))
        assert set(got) == set(flat)
        for k, want in flat.items():
            assert got[k].dtype == want.dtype and got[k].shape == want.shape, k
            assert torch.equal(tensor_bytes(got[k]), tensor_bytes(want)), k
        CHECKED["hf"] = CHECKED.get("hf", 0) + 1


@pytest.mark.parametrize("slow", [pytest.param(True, marks=pytest.mark.slow), False])
def test_hf_import_export_is_bitwise(slow):
    flats = st.dictionaries(names, tensors(), min_size=1, max_size=6)
    _run("hf", slow, given(flats)(check_hf_round_trip))


def _record_of(state: dict) -> tuple[list, dict]:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, paths = flatten_state_dict(state)
    return st_structure.record(state, {k: tuple(v) for k, v in paths.items()}, "x"), flat


json_like = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 50), st.text("dlovx_ab", max_size=3)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=2), c)),
    max_leaves=10,
)


def check_hostile_record(state: dict, edits: list) -> None:
    record, flat = _record_of(state)
    for i, value in edits:
        if record:
            record[i % len(record)] = value
    try:
        out = st_structure.rebuild(record, flat, "step-1")
    except ForeignFormatError as exc:
        assert "step-1" in str(exc)
        CHECKED["record"] = CHECKED.get("record", 0) + 1
        return
    assert out is None or isinstance(out, dict)
    CHECKED["record"] = CHECKED.get("record", 0) + 1


@pytest.mark.parametrize("slow", [pytest.param(True, marks=pytest.mark.slow), False])
def test_a_hostile_structure_record_is_rebuilt_ignored_or_refused(slow):
    edits = st.lists(st.tuples(st.integers(0, 50), json_like), min_size=1, max_size=3)
    _run("record", slow, given(states, edits)(check_hostile_record))


def test_a_record_naming_other_entries_is_ignored():
    """A step slimmed after its import holds fewer entries than its record: the export falls
    back to DCP's naming rather than inventing containers."""
    record, flat = _record_of({"model": {"w": torch.ones(1)}, "optim": {0: torch.ones(2)}})
    del flat["optim.0"]
    assert st_structure.rebuild(record, flat, "step-1") is None
    with pytest.raises(ForeignFormatError, match="step-1"):
        st_structure.rebuild([["v", [], 3]], {}, "step-1")


def test_a_zero_dim_tensor_inside_a_value_round_trips():
    """Found by the generated round trip: a tuple holding a 0-dim tensor (a value, kept by the
    engine's safe value encoding) crashed the import ("cannot view Float as Byte")."""
    check_torch_round_trip({0: (torch.tensor(0.5),), "b": (torch.tensor(7, dtype=torch.int16),)})


def test_an_empty_dict_in_a_list_keeps_the_names_of_its_neighbours():
    """Found by the generated round trip (slow run): [[], {}] is a list DCP walks (it holds a
    dict); nested again without the empty dict it became one value, renamed, and the export
    lost the structure."""
    check_torch_round_trip({1: None, 0: [[], {}]})
