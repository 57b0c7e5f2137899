"""The contract's command line both ways: `parse(cls, to_argv(x)) == x` for every step."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import MISSING, dataclass, fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptflow.contract import (
    STEP_ARGS,
    EvaluateArgs,
    FinetuneArgs,
    PretrainArgs,
    SelectArgs,
    arg,
    parse,
    parser,
    specs,
    to_argv,
)


@dataclass(frozen=True)
class Kinds:
    """Every kind of field the contract renders (no step uses optionals or tuples yet)."""

    name: str = arg(doc="a required string")
    count: int = arg(3, "an int with a minimum", at_least=1)
    ratio: float = arg(0.5, "a float")
    mode: str = arg("a", "one of three", choices=("a", "b", "c"))
    on: bool = arg(True, "a bool defaulting to true")
    off: bool = arg(False, "a bool defaulting to false")
    limit: int | None = arg(None, "an optional int")
    label: str | None = arg(None, "an optional string")
    sizes: tuple[int, ...] = arg((), "a list of ints")
    tags: tuple[str, ...] = arg((), "a list of strings")
    weights: tuple[float, ...] = arg((), "a list of floats")


def _scalar(s):
    if s.choices:
        return st.sampled_from(s.choices)
    if s.base is bool:
        return st.booleans()
    if s.base is int:
        return st.integers(min_value=s.at_least)
    if s.base is float:
        return st.floats(min_value=s.at_least, allow_nan=False)
    return st.text().filter(lambda t: t != "--")  # argparse cannot take it (see below)


def instances(cls):
    """Any value of `cls`: every field drawn from what its type, choices and minimum allow."""
    strategies = {}
    for s in specs(cls):
        one = _scalar(s)
        if s.many:
            one = st.lists(one, max_size=4).map(tuple)
        elif s.optional:
            one = st.none() | one
        strategies[s.name] = one
    return st.builds(cls, **strategies)


def required(cls) -> dict:
    return {f.name: "x" for f in fields(cls) if f.default is MISSING}


@pytest.mark.parametrize("cls", [*STEP_ARGS, Kinds], ids=lambda c: c.__name__)
def test_defaults_round_trip_with_only_the_required_flags(cls):
    args = cls(**required(cls))
    argv = to_argv(args)
    assert argv == [x for name in required(cls) for x in ("--" + name.replace("_", "-"), "x")]
    assert parse(cls, argv) == args


@pytest.mark.parametrize("cls", [*STEP_ARGS, Kinds], ids=lambda c: c.__name__)
def test_any_value_round_trips(cls):
    @settings(max_examples=150, deadline=None)
    @given(instances(cls))
    def check(args):
        assert parse(cls, to_argv(args)) == args

    check()


def test_non_defaults_of_each_kind_are_written_as_expected():
    args = Kinds(
        name="-n", count=7, ratio=86400.0, on=False, off=True, limit=-2, sizes=(1, 2), tags=("-t",)
    )
    assert to_argv(args) == [
        "--name=-n", "--count", "7", "--ratio", "86400", "--no-on", "--off", "--limit=-2",
        "--sizes", "1", "--sizes", "2", "--tags=-t",
    ]  # fmt: skip
    assert parse(Kinds, to_argv(args)) == args
    again = to_argv(replace(args, ratio=0.003, label=""))
    assert again[3:5] == ["--ratio", "0.003"]
    assert again[again.index("--label") + 1] == ""  # "" is not None: written


def test_expressions_are_written_verbatim_in_the_fields_place():
    argv = to_argv(
        FinetuneArgs(base_root="", run_root=""),
        run_root="{{inputs.parameters.variant_root}}",
        lr="{{inputs.parameters.lr}}",
        base_root="{{inputs.parameters.base_root}}",
    )
    assert argv == [
        "--base-root", "{{inputs.parameters.base_root}}",
        "--run-root", "{{inputs.parameters.variant_root}}",
        "--lr", "{{inputs.parameters.lr}}",
    ]  # fmt: skip
    with pytest.raises(TypeError, match="no field lrr"):
        to_argv(FinetuneArgs(base_root="", run_root=""), lrr="1")
    with pytest.raises(TypeError, match="bool"):
        to_argv(EvaluateArgs(run_root=""), until_finished="{{x}}")


def test_the_one_value_argparse_drops_is_refused():
    with pytest.raises(ValueError, match="'--' cannot be passed"):
        to_argv(PretrainArgs(run_root="--"))


def test_a_value_of_the_wrong_type_is_refused_when_rendering():
    with pytest.raises(TypeError, match="--max-steps"):
        to_argv(PretrainArgs(run_root="r", max_steps="{{x}}"))
    with pytest.raises(TypeError, match="--seed"):
        to_argv(PretrainArgs(run_root="r", seed=True))


@pytest.mark.parametrize(
    ("cls", "argv", "message"),
    [
        (PretrainArgs, ["--run-root", "r", "--max-steps", "0"], "--max-steps: must be at least 1"),
        (PretrainArgs, ["--run-root", "r", "--max-steps", "ten"], "invalid int value: 'ten'"),
        (SelectArgs, ["--candidates", "c", "--mode", "up"], "invalid choice: 'up'"),
        (FinetuneArgs, ["--freeze-blocks", "-1"], "--freeze-blocks: must be at least 0"),
        (FinetuneArgs, ["--base-root", "b", "--run-root", "r", "--parallel", "tp"], "'tp'"),
        (EvaluateArgs, [], "required: --run-root"),
    ],
)
def test_bad_command_lines_name_the_flag(cls, argv, message, capsys):
    with pytest.raises(SystemExit):
        parse(cls, argv)
    assert message in capsys.readouterr().err


def test_help_is_each_fields_doc():
    text = parser(PretrainArgs).format_help()
    assert "python -m ckptflow.steps.pretrain" in text
    for s in specs(PretrainArgs):
        assert s.flag in text
    assert "optimizer steps to train in total (across resumes) (default: 40)" in " ".join(
        text.split()
    )


def test_a_field_the_command_line_cannot_express_is_refused():
    @dataclass(frozen=True)
    class Bad:
        flag: bool = arg(doc="a required bool")

    @dataclass(frozen=True)
    class Undocumented:
        n: int = arg(1)

    @dataclass(frozen=True)
    class Nested:
        inner: Kinds = arg(Kinds(name="x"), "a dataclass")

    for cls in (Bad, Undocumented, Nested):
        with pytest.raises(TypeError):
            specs(cls)


def test_the_contract_imports_neither_torch_nor_hera():
    probe = (
        "import sys, ckptflow.contract, ckptflow.contract.docs\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'hera', 'fsspec')]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_default_experiment_is_the_one_lineage_uses():
    from ckptflow.steps.lib import lineage

    from ckptflow.contract import EXPERIMENT

    assert lineage.EXPERIMENT == EXPERIMENT
