"""Delta kinds in the manifest (format version 3): what the validator accepts and refuses."""

from __future__ import annotations

import copy

import pytest

from ckptflow.core import manifest as mf
from tests.core.test_manifest import _manifest


def _delta_manifest(kind: str | None, version: int = 3) -> dict:
    """A manifest of one float32 tensor stored as one delta part (with `kind`, or none)."""
    m = _manifest([4, 4], [([0, 0], [4, 4])])
    m["format_version"], m["kind"], m["base_step"] = version, "delta", 1
    part = m["items"]["w@0,0"]["parts"][0]
    base_key = "f" * 32
    m["objects"][base_key] = {"size": 64}
    part["base"] = {
        "object": base_key,
        "stored_size": 64,
        "raw_size": 64,
        "width": 4,
        "planes": [["raw", 64]],
    }
    if kind is not None:
        part["delta"] = kind
    return m


def _part(m: dict) -> dict:
    return m["items"]["w@0,0"]["parts"][0]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_delta_without_a_kind_is_xor_in_every_version(version):
    mf.validate(_delta_manifest(None, version))


@pytest.mark.parametrize("kind", ["xor", "sub"])
def test_version_3_names_its_delta_kind(kind):
    mf.validate(_delta_manifest(kind))


def _full_with_kind(m):
    p = _part(m)
    p["base"] = None
    m["kind"], m["base_step"] = "full", None


REFUSED = {
    "a kind in a version 2 manifest": (2, "sub", lambda m: None),
    "an unknown kind": (3, "add", lambda m: None),
    "a kind of the wrong type": (3, ["sub"], lambda m: None),
    "a kind on a full part": (3, "sub", _full_with_kind),
    "sub of 16-byte elements": (3, "sub", lambda m: _part(m).update(width=16)),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_bad_delta_kind_is_refused(name):
    version, kind, change = REFUSED[name]
    m = _delta_manifest(kind, version)
    change(m)
    with pytest.raises(mf.ManifestError, match="delta"):
        mf.validate(copy.deepcopy(m))
