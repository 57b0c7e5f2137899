"""The CLI's error table (#37 point 9): a path or file the user gave that cannot be used is one
line naming it and the fix, with the usage exit code 2, never "unexpected error" and exit 1
(which `run` uses for a Failed workflow). Driven through the `ckptflow` dispatcher; plus
`run --name` (an Argo workflow name) and the table's own classification."""

from __future__ import annotations

import errno

import pytest

from ckptflow import cli, cli_errors

WF = """metadata: {name: hi}
spec:
  entrypoint: t
  templates:
  - name: t
    container: {command: [python, -c, "print(1)"]}
"""


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wf.yaml").write_text(WF)
    (tmp_path / "afile").write_text("a regular file")
    (tmp_path / "bad.yaml").write_bytes(b"metadata: {name: \xff\xfe}\n")
    (tmp_path / "adir").mkdir()
    return tmp_path


# argv, a phrase the one line must hold
CASES = {
    "run --workdir FILE": (["run", "wf.yaml", "--workdir", "afile"], "afile"),
    "run --status-file in a missing folder": (
        ["run", "wf.yaml", "--workdir", "w", "--status-file", "nodir/s.json"],
        "nodir/s.json: no such file or folder",
    ),
    "run a manifest that is not UTF-8": (["run", "bad.yaml"], "bad.yaml: not UTF-8 text"),
    "run --name with a space": (
        ["run", "wf.yaml", "--workdir", "w", "--name", "Bad Name!"],
        "not a Kubernetes name",
    ),
    "run --name of 64 characters": (
        ["run", "wf.yaml", "--workdir", "w", "--name", "a" * 64],
        "at most 63",
    ),
    "render -o into a missing folder": (
        ["render", "pipeline", "-o", "nodir/x.yaml"],
        "nodir/x.yaml: no such file or folder",
    ),
    "render -o onto a folder": (["render", "pipeline", "-o", "adir"], "adir: is a folder"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_path_the_user_gave_is_one_line_and_exit_2(here, capsys, case):
    argv, phrase = CASES[case]
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "\n" not in err and "unexpected error" not in err and "Traceback" not in err, err
    assert phrase in err, err
    assert not (here / "w" / "logs").exists() or not any((here / "w" / "logs").iterdir())


def test_nothing_runs_before_an_unwritable_status_file(here, capsys):
    assert cli.main(["run", "wf.yaml", "--workdir", "w", "--status-file", "no/s.json"]) == 2
    assert not list((here / "w" / "logs").iterdir())  # the task never started
    assert "started" not in capsys.readouterr().err


def test_a_value_error_is_not_the_users_path():
    assert cli_errors.user_error(ValueError("x")) is None  # a bug stays unexpected


@pytest.mark.parametrize(
    "exc, words",
    [
        (IsADirectoryError(errno.EISDIR, "Is a directory", "d"), "d: is a folder"),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory", "f/x"), "f/x: a part"),
        (FileNotFoundError(errno.ENOENT, "No such file", "n/x"), "n/x: no such file"),
        (FileExistsError(errno.EEXIST, "File exists", "f"), "f: is a file"),
        (OSError(errno.EILSEQ, "not UTF-8 text (byte 3): fix", "b.yaml"), "b.yaml: not UTF-8"),
        (OSError(errno.ENAMETOOLONG, "File name too long", "x" * 300), "too long"),
    ],
)
def test_the_table_classifies_by_type_and_code(exc, words):
    assert words in cli_errors.user_error(exc)


def test_an_oserror_the_table_does_not_name_is_a_bug():
    assert cli_errors.user_error(OSError(errno.EIO, "Input/output error", "x")) is None
