"""Every user mistake on the command line is one line on stderr naming the fix, exit code 2,
never a traceback; an unexpected failure is one line too (CKPTFLOW_DEBUG=1 shows the traceback).
Driven through the top-level `ckptflow` dispatcher, as a user runs it."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from ckptflow.steps.checkpoint import Checkpointer
from fsspec.implementations.local import LocalFileSystem

from ckptflow import cli

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

PLAN = [
    "plan",
    "--params",
    "7B",
    "--gpus",
    "8",
    "--write-gib-s",
    "4",
    "--mtbf",
    "48h",
    "--run-length",
    "30d",
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    root = tmp / "ckpt"
    ck = Checkpointer(str(root))
    ck.save(1, {"w": torch.ones(4)})
    ck.save(2, {"w": torch.zeros(4)})
    ck.close()
    (tmp / "file.txt").write_text("a regular file")
    run = tmp / "runs" / "ckptflow-abcde"  # a pipeline run, as `ckptflow run --local` leaves
    for part in ("pretrain", "finetune/lr0.001-freeze1"):
        ck = Checkpointer(str(run / part / "ckpt"))
        ck.save(1, {"w": torch.ones(4)})
        ck.close()
    torch.save({"w": torch.ones(4)}, tmp / "model.pt")
    from safetensors.torch import save_file

    save_file({"w": torch.ones(4)}, str(tmp / "model.safetensors"))
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(4)}, checkpoint_id=str(tmp / "dcp"))
    return {
        "root": str(root),
        "file": str(tmp / "file.txt"),
        "tmp": str(tmp),
        "run": str(run),
        "pt": str(tmp / "model.pt"),
        "st": str(tmp / "model.safetensors"),
        "dcp": str(tmp / "dcp"),
    }


# (argv, a phrase of the fix the one line must name)
CASES = {
    "policy last=² (a superscript digit)": (
        ["ckpt", "gc", "{root}", "--policy", "last=²"],
        "last=",
    ),
    "policy last=-1": (["ckpt", "gc", "{root}", "--policy", "last=-1"], "last="),
    "policy thin= empty": (["ckpt", "gc", "{root}", "--policy", "thin="], "thinning"),
    "policy best mode sideways": (
        ["ckpt", "gc", "{root}", "--policy", "best=x:sideways:2"],
        "'min' or 'max'",
    ),
    "policy best k=²": (["ckpt", "gc", "{root}", "--policy", "best=x:min:²"], "best="),
    "policy empty": (["ckpt", "gc", "{root}", "--policy", ""], "policy"),
    "pin a negative step": (["ckpt", "pin", "{root}", "-1"], "step"),
    "pin a step that is not a number": (["ckpt", "pin", "{root}", "abc"], "step"),
    "pin a superscript step": (["ckpt", "pin", "{root}", "²"], "step"),
    "unpin a negative step": (["ckpt", "unpin", "{root}", "-1"], "step"),
    "verify a negative step": (["ckpt", "verify", "{root}", "--step", "-3"], "step"),
    "ls a root that is a regular file": (["ckpt", "ls", "{file}"], "{file}"),
    "verify a root that is a regular file": (["ckpt", "verify", "{file}"], "{file}"),
    "pin in a root that is a regular file": (["ckpt", "pin", "{file}", "1"], "{file}"),
    "gc a root that is a regular file": (
        ["ckpt", "gc", "{file}", "--policy", "last=1"],
        "{file}",
    ),
    "archive a root that is a regular file": (
        ["ckpt", "archive", "{file}", "--older-than", "1d", "--to", "{tmp}/arch"],
        "{file}",
    ),
    "archive --to a regular file": (
        ["ckpt", "archive", "{root}", "--older-than", "1s", "--to", "{file}", "--yes"],
        "{file}",
    ),
    "a root below a regular file": (["ckpt", "ls", "{file}/ckpt"], "{file}"),
    "gc --grace -5m": (["ckpt", "gc", "{root}", "--policy", "last=1", "--grace", "-5m"], "grace"),
    "archive --older-than 7x": (
        ["ckpt", "archive", "{root}", "--older-than", "7x", "--to", "{tmp}/a"],
        "older-than",
    ),
    "archive --grace soon": (
        ["ckpt", "archive", "{root}", "--older-than", "7d", "--to", "{tmp}/a", "--grace", "soon"],
        "grace",
    ),
    "a root that does not exist": (["ckpt", "ls", "{tmp}/nothing/here"], "check the root URI"),
    "an unknown subcommand": (["ckpt", "frobnicate", "{root}"], "frobnicate"),
    "a missing argument": (["ckpt", "pin", "{root}"], "step"),
    "an unknown option": (["ckpt", "ls", "{root}", "--colour"], "--colour"),
    "plan: policy last=²": ([*PLAN, "--policy", "last=²"], "last="),
    "plan: params abc": ([*PLAN[:2], "abc", *PLAN[3:]], "parameter count"),
    "plan: mtbf 7x": ([*PLAN[:7], "--mtbf", "7x", *PLAN[9:]], "duration"),
    "plan: interval -5m": ([*PLAN, "--interval", "-5m"], "duration"),
    "plan: gpus -1": ([*PLAN[:4], "-1", *PLAN[5:]], "gpus"),
    "plan: gpus abc": ([*PLAN[:4], "abc", *PLAN[5:]], "gpus"),
    "plan: weights fp7": ([*PLAN, "--weights", "fp7"], "precision"),
    "plan: restart soon": ([*PLAN, "--restart", "soon"], "duration"),
    "plan: missing --gpus": ([*PLAN[:3], *PLAN[5:]], "--gpus"),
    "plan: mtbf-per rack": ([*PLAN, "--mtbf-per", "rack"], "mtbf-per"),
    "plan: full-every 0": ([*PLAN, "--full-every", "0"], "full_every"),
    "an unknown top-level command": (["frobnicate"], "frobnicate"),
    # the wrong folder: the message says what it is and which root to give
    "ls a run root": (
        ["ckpt", "ls", "{run}/pretrain"],
        "is a run root; its checkpoints are in {run}/pretrain/ckpt",
    ),
    "verify a run root": (
        ["ckpt", "verify", "{run}/pretrain"],
        "`ckptflow ckpt ls {run}/pretrain/ckpt`",
    ),
    "gc a run root": (
        ["ckpt", "gc", "{run}/pretrain", "--policy", "last=1"],
        "{run}/pretrain/ckpt",
    ),
    "pin in a run root": (["ckpt", "pin", "{run}/pretrain", "1"], "{run}/pretrain/ckpt"),
    "archive a run root": (
        ["ckpt", "archive", "{run}/pretrain", "--older-than", "1d", "--to", "{tmp}/arch"],
        "{run}/pretrain/ckpt",
    ),
    "repair a run root": (["ckpt", "repair", "{run}/pretrain"], "{run}/pretrain/ckpt"),
    "ls a pipeline run": (
        ["ckpt", "ls", "{run}"],
        "its checkpoint roots: {run}/finetune/lr0.001-freeze1/ckpt, {run}/pretrain/ckpt",
    ),
    "ls a runs directory": (["ckpt", "ls", "{tmp}/runs"], "{run}/pretrain/ckpt"),
    "ls a step folder": (
        ["ckpt", "ls", "{root}/step-00000001"],
        "is one step of the checkpoint root {root}",
    ),
    "ls the root marker": (["ckpt", "ls", "{root}/ckptflow-root.json"], "give its folder, {root}"),
    "ls a torch.save file": (["ckpt", "ls", "{pt}"], "is a torch.save file"),
    "verify a torch.save file": (["ckpt", "verify", "{pt}"], "is a torch.save file"),
    "ls a safetensors file": (["ckpt", "ls", "{st}"], "is a safetensors file"),
    "ls a DCP folder": (["ckpt", "ls", "{dcp}"], "torch.distributed.checkpoint (DCP) folder"),
    # the other commands' flags and settings
    "version with an argument": (["--versions"], "unknown command"),
    "render: a bad --set": (
        ["render", "pipeline", "--set", "platform.image_pull_policy=Sometimes"],
        "not one of Always, IfNotPresent, Never",
    ),
    "render: tolerations not a list": (
        ["render", "pipeline", "--set", "platform.tolerations=[{{"],
        "not valid YAML/JSON",
    ),
    "render: a bad -p": (["render", "pipeline", "-p", "ranks=two"], "-p ranks=two: expected int"),
    "render: an unknown workflow": (["render", "pipelines"], "invalid choice"),
    "submit: a bad --set": (["submit", "pipeline", "--set", "pretrain.model=huge"], "not one of"),
    "submit: a bad -p": (["submit", "pipeline", "-p", "mode=up"], "not one of min, max"),
    "run: finetune without a base": (
        ["run", "finetune", "--local", "--runs-dir", "{tmp}/lr"],
        "finetune needs a base",
    ),
    "run: a bad --set": (
        ["run", "pipeline", "--local", "--runs-dir", "{tmp}/lr", "--set", "finetune.mode=max2"],
        "not one of min, max",
    ),
    "run: a bad -p": (
        ["run", "pipeline", "--local", "--runs-dir", "{tmp}/lr", "-p", "ckpt_every=-5"],
        "-p ckpt_every=-5: must be at least 1",
    ),
    "run: a bad --name": (
        ["run", "pipeline", "--local", "--runs-dir", "{tmp}/lr", "--name", "My Run"],
        "--name",
    ),
    "run: an unknown option": (["run", "pipeline", "--locl"], "--locl"),
    "run: a missing manifest": (["run", "{tmp}/none.yaml"], "no such manifest file"),
}
# `ckptflow run FILE` refuses a manifest it cannot run with exit code 3 (documented).
EXIT = {"run: a missing manifest": 3}


@pytest.mark.parametrize("name", list(CASES))
def test_a_user_mistake_is_one_line_and_exit_2(places, name, capsys):
    argv, fix = CASES[name]
    argv = [a.format(**places) for a in argv]
    rc = cli.main(argv)
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert rc == EXIT.get(name, 2), (rc, out.err, out.out)
    assert len(lines) == 1, out.err
    assert "Traceback" not in out.err + out.out
    assert fix.format(**places) in lines[0], lines[0]


def test_an_unexpected_failure_is_one_line_with_a_debug_hint(places, capsys, monkeypatch):
    """A bug in a subcommand: one line naming the error and how to see the traceback."""
    from ckptflow import ckpt_cli

    def broken(args):
        raise KeyError("some internal key")

    monkeypatch.setitem(ckpt_cli.COMMANDS, "ls", broken)
    monkeypatch.delenv("CKPTFLOW_DEBUG", raising=False)
    rc = cli.main(["ckpt", "ls", places["root"]])
    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "KeyError" in err and "some internal key" in err and "CKPTFLOW_DEBUG=1" in err
    assert "Traceback" not in err
    monkeypatch.setenv("CKPTFLOW_DEBUG", "1")
    with pytest.raises(KeyError):
        cli.main(["ckpt", "ls", places["root"]])


def test_gc_of_a_root_with_nothing_is_an_error_in_one_line(places, capsys):
    """A wrong root must not look like retention that ran (issue 33): the retention
    CronWorkflow collects only roots `ckptflow ckpt roots` found with a committed step."""
    assert cli.main(["ckpt", "gc", places["tmp"] + "/not-yet", "--policy", "last=1", "--yes"]) == 2
    out, err = capsys.readouterr()
    assert "0 step(s)" not in out and len(err.strip().splitlines()) == 1
    assert "no checkpoints there" in err


def test_the_valid_commands_still_work(places, capsys):
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.startswith("ckptflow ")
    assert cli.main(["--help"]) == 0 and "common paths:" in capsys.readouterr().out
    assert cli.main(["ckpt", "ls", places["run"] + "/pretrain/ckpt"]) == 0
    assert cli.main(["ckpt", "ls", places["root"]]) == 0
    assert cli.main(["ckpt", "pin", places["root"], "1"]) == 0
    assert cli.main(["ckpt", "gc", places["root"], "--policy", "last=1", "--grace", "0"]) == 0
    assert cli.main([*PLAN, "--policy", "last=5"]) == 0
    capsys.readouterr()


class _DeniedFS(LocalFileSystem):
    """A local disk where this user may read nothing (what a root owned by another user is)."""

    cachable = False

    def _deny(self, path, *a, **kw):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    ls = cat_file = info = find = exists = isfile = _deny


@pytest.mark.parametrize(
    "argv",
    [
        ["ckpt", "ls", "{root}"],
        ["ckpt", "verify", "{root}"],
        ["ckpt", "pin", "{root}", "1"],
        ["ckpt", "gc", "{root}", "--policy", "last=1"],
        ["ckpt", "archive", "{root}", "--older-than", "1d", "--to", "{tmp}/arch"],
    ],
)
def test_an_unreadable_root_is_one_line_naming_permissions(places, argv, capsys, monkeypatch):
    from ckptflow import env
    from ckptflow.core.storage import Storage

    monkeypatch.setattr(env, "open_storage", lambda uri: Storage(uri, fs=_DeniedFS()))
    rc = cli.main([a.format(**places) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "permission denied" in err and "AWS" not in err and "Traceback" not in err
