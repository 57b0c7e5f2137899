"""`ckptflow ckpt import` / `export`: a round trip from the command line, and a hostile or
unknown source is one line naming the problem (exit 2), never a traceback."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from ckptflow.cli import main
from tests.steps.interop_helpers import hf_sharded, model_tensors, raw_safetensors


def test_import_then_export_from_the_command_line(tmp_path, capsys):
    ref = model_tensors()
    hf_sharded(tmp_path / "hf", ref, per_shard=3)
    root = str(tmp_path / "ckpt")
    assert main(["ckpt", "import", str(tmp_path / "hf"), "--to", root, "--step", "5"]) == 0
    assert "as step 5 under" in capsys.readouterr().out
    assert main(["ckpt", "ls", root]) == 0
    assert main(["ckpt", "verify", root]) == 0
    capsys.readouterr()
    out = str(tmp_path / "out")
    argv = ["ckpt", "export", root, "--format", "hf", "--to", out, "--shard-size", "300B"]
    assert main([*argv, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["step"] == 5 and len(rep["files"]) > 1
    got = {}
    for f in rep["files"]:
        got.update(load_file(f"{out}/{f['name']}"))
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)


def test_user_errors_are_one_line(tmp_path, capsys):
    raw_safetensors(tmp_path / "bad.safetensors", {"a": {"dtype": "F32"}})
    (tmp_path / "empty").mkdir()
    cases = [
        (
            ["ckpt", "import", str(tmp_path / "bad.safetensors"), "--to", str(tmp_path / "r")],
            "exactly dtype",
        ),
        (
            ["ckpt", "import", str(tmp_path / "empty"), "--to", str(tmp_path / "r")],
            "no checkpoint ckptflow reads",
        ),
        (
            ["ckpt", "export", str(tmp_path / "empty"), "--format", "hf", "--to", "x"],
            "no checkpoint ckptflow reads",
        ),
        (
            ["ckpt", "export", str(tmp_path), "--format", "hf", "--to", "x", "--shard-size", "0"],
            "bad size",
        ),
        (["ckpt", "export", str(tmp_path), "--format", "onnx", "--to", "x"], "invalid choice"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
