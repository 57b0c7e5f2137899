"""docs/contracts.md's Checkpointer API block states the engine's real signature and fields."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import fields
from pathlib import Path

from ckptflow.steps.checkpoint import Checkpointer, LoadInfo, SaveStats

DOC = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"


def _api_block() -> str:
    text = DOC.read_text()
    start = text.index("## Checkpointer API")
    return text[text.index("```python", start) : text.index("```\n", start + 20)]


def test_constructor_defaults_are_the_real_ones():
    block = _api_block()
    call = re.search(r"Checkpointer\(root_uri, \*,(.*?)\)\n", block, re.S).group(1)
    documented = {
        k.strip(): ast.literal_eval(v.strip())
        for k, v in (item.split("=") for item in call.replace("\n", " ").split(","))
    }
    real = {
        name: p.default
        for name, p in inspect.signature(Checkpointer.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert documented == real


def test_stats_and_load_info_fields_are_all_named():
    block = _api_block()
    stats = block[block.index("h.wait()") : block.index("h.done()")]
    for name in [f.name for f in fields(SaveStats)] + ["gib_per_s"]:
        assert re.search(rf"\b{name}\b", stats), name
    load = block[block.index("ck.last_load") : block.index("ck.committed_steps")]
    for name in (f.name for f in fields(LoadInfo)):
        assert re.search(rf"\b{name}\b", load), name


def test_verify_returns_a_summary_and_every_public_method_is_listed():
    block = _api_block()
    assert "ck.verify(step) -> dict" in block
    assert inspect.signature(Checkpointer.verify).return_annotation == "dict"
    public = [n for n, _ in inspect.getmembers(Checkpointer, inspect.isfunction)]
    for name in (n for n in public if not n.startswith("_")):
        assert f"ck.{name}(" in block, name
