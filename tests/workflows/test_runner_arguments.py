"""Workflow parameters given to a run (`ckptflow run FILE -p`, `run_workflow(arguments=)`) are
bounded before anything runs: their names are Argo's (validate.go paramOrArtifactNameRegex),
their count and sizes are bounded, and a bad one is one line naming it."""

from __future__ import annotations

import io

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.document import MAX_ARGUMENT_BYTES, MAX_ARGUMENTS, arguments_of

SPEC = {"arguments": {"parameters": [{"name": "greeting", "value": "hi"}]}}


@pytest.mark.parametrize(
    "given, why",
    [
        ({"greet ing": "x"}, "-p greet ing: a parameter name is letters, digits, '_' and '-'"),
        ({"": "x"}, "-p : a parameter name is letters, digits, '_' and '-'"),
        ({"a/../b": "x"}, "-p a/../b: a parameter name is letters, digits, '_' and '-'"),
        ({"x" * 300: "x"}, f"-p {'x' * 40}...: a parameter name of at most 253 characters"),
        ({"greeting": "x" * (MAX_ARGUMENT_BYTES + 1)}, f"-p greeting: a value of at most {MAX_ARGUMENT_BYTES} bytes"),
        ({"greeting": "a\x00b"}, "-p greeting: a value without NUL characters"),
        ({f"p{i}": "1" for i in range(MAX_ARGUMENTS + 1)}, f"at most {MAX_ARGUMENTS} parameters"),
    ],
)  # fmt: skip
def test_a_bad_parameter_is_one_line_naming_it(given, why):
    with pytest.raises(SpecError) as err:
        arguments_of(SPEC, given)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_all_parameters_together_are_bounded():
    each = MAX_ARGUMENT_BYTES // 2
    given = {f"p{i}": "x" * each for i in range(9)}
    with pytest.raises(SpecError, match="parameters of at most .* bytes in all"):
        arguments_of(SPEC, given)


def test_good_parameters_pass_and_nothing_runs_with_a_bad_one(tmp_path):
    assert arguments_of(SPEC, {"greeting": "yo", "extra_one-2": "1"}) == {
        "greeting": "yo",
        "extra_one-2": "1",
    }
    marker = tmp_path / "ran"
    manifest = {
        "metadata": {"name": "w"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {
                    "name": "main",
                    "container": {
                        "image": "x",
                        "command": ["python", "-c", f"open({str(marker)!r}, 'w')"],
                    },
                }
            ],
        },
    }
    with pytest.raises(SpecError, match="a parameter name"):
        run_workflow(
            manifest, arguments={"bad name": "1"}, workdir=str(tmp_path / "w"), stream=io.StringIO()
        )
    assert not marker.exists() and not (tmp_path / "w").exists()
