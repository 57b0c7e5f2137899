"""Argo's expression language (workflows/runner/expr.py): expr-lang's operators and the
functions Argo adds, and hostile expressions refused with one line."""

from __future__ import annotations

import contextlib
import random

import pytest
from ckptflow.workflows.runner.expr import (
    MAX_DEPTH,
    MAX_LEN,
    ExprError,
    ExprMissing,
    check,
    evaluate,
    expand,
)
from ckptflow.workflows.runner.expr_check import problems
from ckptflow.workflows.runner.expr_fields import (
    output_expression,
    retry_continues,
    retry_policy,
    retry_scope,
)
from ckptflow.workflows.runner.expr_funcs import go_json
from ckptflow.workflows.runner.nodes import Node
from ckptflow.workflows.runner.substitution import explain, per_item, render, unresolved

CONFIG = '{"employees": [{"name": "Baris", "age":43},{"name": "Mo", "age": 42}, {"name": "Jai", "age" :44}]}'
ENV = expand(
    {
        "workflow.parameters.config": CONFIG,
        "workflow.parameters.weather": '{"weekWeather": "eyJ0ZW1wcyI6IFszNCwgMjcsIDE1LCA1NywgNDZdfQo="}',
        "inputs.parameters.foo": "3",
        "inputs.parameters.should-print": "true",
        "steps.flip-coin.outputs.result": "heads",
        "steps.heads.outputs.result": "it was heads",
    }
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1 + 2 * 3", 7),
        ("1 < 2 < 3", True),  # chained comparisons: 1 < 2 && 2 < 3 (parser.go parseComparison)
        ("3 > 2 > 2", False),
        ("-2 ** 2", -4.0),  # unary minus binds looser than **
        ("not true == false", True),  # not binds tighter than ==
        ("nil ?? nil ?? 3", 3),
        ("2 ** 3 ** 2", 512.0),  # right-associative, a float as in expr-lang
        ("7 / 2", 3.5),
        ("7 % 3", 1),
        ("-7 % 3", -1),  # Go's %: the sign of the dividend
        ("9223372036854775806 % 10", 6),  # exact (math.fmod through a float gave 8)
        ("sprig.div(-7, 2)", -3),  # Go's integer /: toward zero
        ("sprig.div(9223372036854775806, 3)", 3074457345618258602),  # exact, not via float
        ("-2 + +3", 1),
        ("1 == 1.0", True),
        ("'1' == 1", False),
        ("'a' + 'b'", "ab"),
        ("1 < 2 && 'a' < 'b'", True),
        ("false || !false", True),
        ("not true or true", True),
        ("1 in [1, 2]", True),
        ("3 not in [1, 2]", True),
        ("'foo' in {foo: 1}", True),
        ("'abc' contains 'b'", True),
        ("'abc' startsWith 'a' and 'abc' endsWith 'c'", True),
        ("'node shutdown' matches 'imminent node shutdown|node'", True),
        ("'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!' matches '(a+)+$'", False),  # no backtracking
        ("sprig.regexMatch('^(a|a)*b$', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa')", False),
        ("'x' not matches '^y'", True),
        ("true ? 'a' : 'b'", "a"),
        ("1 == 2 ? 'a' : 2 == 2 ? 'b' : 'c'", "b"),
        ("nil ?? 'dflt'", "dflt"),
        ("inputs.parameters.missing ?? 'dflt'", "dflt"),
        ("inputs?.nothing?.deeper", None),
        ("[1, 2, 3][-1]", 3),
        ("[1, 2, 3][1:]", [2, 3]),
        ("'hello'[1:3]", "el"),
        ("1..3", [1, 2, 3]),
        ("len([1, 2]) + len('abc') + len({a: 1})", 6),
        ("filter([1, 2, 3, 4], # % 2 == 0)", [2, 4]),
        ("map([1, 2], {# * 10})", [10, 20]),
        ("map([{a: 1}, {a: 2}], .a)", [1, 2]),
        (
            "all([1, 2], # > 0) && any([1, 2], # > 1) && none([1], # > 1) && one([1, 2], # > 1)",
            True,
        ),
        ("count([1, 2, 3], # > 1)", 2),
        ("find([1, 2, 3], # > 1)", 2),
        ("findIndex([1, 2, 3], # > 5)", -1),
        ("sum([1, 2, 3])", 6),
        ("upper('a') + lower('B') + trim('  c ')", "Abc"),
        ("split('a,b', ',')", ["a", "b"]),
        ("join(['a', 'b'], '-')", "a-b"),
        ("string(1.5) + string(2) + string(true)", "1.52true"),
        ("int('42') + int(2.9)", 44),
        ("float('2.5')", 2.5),
        ("inputs.parameters[\"should-print\"] == 'true'", True),
        (
            "steps['flip-coin'].outputs.result == 'heads' ? steps.heads.outputs.result : steps.tails.outputs.result",
            "it was heads",
        ),
        ("asInt(inputs.parameters.foo) * 10", 30),
        ("asFloat('1.5') * 2", 3.0),
        ("toJson(filter([1, 3], {# > 1}))", "[3]"),
        ("toJson({b: 1, a: [true, nil, 'x<']})", '{"a":[true,null,"x\\u003c"],"b":1}'),
        ("jsonpath(workflow.parameters.config, '$.employees[?(@.name==\"Baris\")].age')", [43.0]),
        (
            "jsonpath(workflow.parameters.config, '$.employees[?(@.age>42 && @.age<44)].age')",
            [43.0],
        ),
        ("jsonpath(workflow.parameters.config, '$.employees[*].name')", ["Baris", "Mo", "Jai"]),
        ("jsonpath(workflow.parameters.config, '$.employees[0].name')", "Baris"),
        ("sprig.add(1, '2', 3.9) + sprig.sub(5, 2) + sprig.mul(2, 3)", 15),
        ("sprig.div(7, 2) + sprig.mod(7, 4) + sprig.max(1, 9, 3) + sprig.min(4, 2)", 17),
        ("sprig.b64dec(sprig.b64enc('hi'))", "hi"),
        ("sprig.replace('a', 'b', 'banana') + sprig.trimPrefix('x', 'xy')", "bbnbnby"),
        ("sprig.upper('a') + sprig.repeat(2, 'z') + sprig.substr(1, 3, 'hello')", "Azzel"),
        ("sprig.default('d', '') + sprig.default('d', 'v')", "dv"),
        ("sprig.join(',', sprig.splitList('-', 'a-b'))", "a,b"),
        ("sprig.date('2006', 0)", "1970"),
        ("len(sprig.date('2006-01-02', 'now'))", 10),
    ],
)
def test_evaluates_as_expr_lang(text: str, value: object) -> None:
    assert evaluate(text, ENV) == value


def test_the_example_that_reuses_a_verbose_snippet() -> None:
    """examples/expression-reusing-verbose-snippets.yaml: map as an alias, sprig math, toJson."""
    text = """
        map([
            jsonpath(sprig.b64dec(jsonpath(workflow.parameters.weather, '$.weekWeather')), '$.temps')
          ], {
            toJson({
              avg: sprig.add(#[0], #[1], #[2], #[3], #[4]) / 5,
              min: sprig.min(#[0], #[1], #[2], #[3], #[4]),
              max: sprig.max(#[0], #[1], #[2], #[3], #[4])
            })
        })[0]"""
    assert evaluate(text, ENV) == '{"avg":35.8,"max":57,"min":15}'


def test_results_are_written_as_go_json() -> None:
    assert go_json(30.0) == "30"
    assert go_json(35.8) == "35.8"
    assert go_json([{"name": "Baris", "age": 43.0}]) == '[{"age":43,"name":"Baris"}]'
    assert go_json("a&b") == '"a\\u0026b"'


def test_a_name_not_in_scope_is_missing_not_an_error() -> None:
    """`{{=...}}` with a name not yet known is left for a later stage (expression_template.go)."""
    with pytest.raises(ExprMissing, match="unknown name item"):
        evaluate("item + 1", ENV)


def test_expand_drops_a_key_that_prefixes_another() -> None:
    """util/expand/expand.go: `{"a": 1, "a.b": 2}` keeps the more specific key."""
    assert expand({"a": "1", "a.b": "2", "c.d.e": "3"}) == {"a": {"b": "2"}, "c": {"d": {"e": "3"}}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 +", "unexpected end"),
        ("(1", "expected '\\)'"),
        ("1 2", "unexpected 2"),
        ("2 1", "unexpected 1"),
        ("if true {1} else {2}", "unexpected true"),  # expr-lang's if/else: not supported
        ("(x - y).Seconds()", "calling a method"),
        ("'unterminated", "unrecognized character"),
        ("@", "unrecognized character"),
        ("let x = 1; x", "'let' is not supported"),
        ("nil ?? 1 + 2", "cannot be mixed"),  # expr-lang refuses ?? beside other operators
        ("1 ! in [1]", "unexpected '!'"),  # only `not in` negates
        ("#index", "#index is not supported"),
        ("sprig.env('HOME')", r"sprig\.env\(\) is not supported"),
        ("sprig.expandenv('$HOME')", r"sprig\.expandenv\(\) is not supported"),
        ("exec('ls')", r"exec\(\) is not supported"),
        ("'' ", None),
        ("   ", "empty expression"),
        ("x" * (MAX_LEN + 1), "longer than"),
        ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "nested deeper"),
        ("[" * 500 + "]" * 500, "nested deeper"),
        ("-" * 500 + "1", "nested deeper"),
    ],
)
def test_bad_or_unsupported_expressions_are_refused_by_check(
    text: str, message: str | None
) -> None:
    if message is None:
        check(text)
        return
    with pytest.raises(ExprError, match=message) as info:
        check(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 + 'a'", "needs a number"),
        ("'a' < 1", "needs a number"),
        ("1 && true", "needs a bool"),
        ("1 ? 2 : 3", "needs a bool"),
        ("1 / 0", "division by zero"),
        ("1 % 0", "divide by zero"),
        ("7.5 % 2", "needs integers"),
        ("[1][5]", "index out of range"),
        ("nil.x", "cannot fetch x from nil"),
        ("asInt('1.5')", r"int\(1.5\)"),
        ("asInt('99999999999999999999')", "invalid operation"),
        ("9223372036854775807 + 1", "integer overflow"),
        ("10.0 ** 400", "out of range"),
        ("1..1000000000", "more than"),
        ("map(1..99999, map(1..99999, #))", "steps"),
        ("sprig.repeat(100000, sprig.repeat(100000, 'x'))", "out of bounds"),
        ("'a' matches '('", "invalid regular expression"),
        ("jsonpath('[\"aaaaaaaaaaaaaaaaaaaaaaaaaaaa!\"]', '$[?@ =~ /(a+)+$/]')", "nests regex"),
        ("jsonpath('{', '$.a')", "invalid JSON"),
        ("jsonpath('{\"a\": 1}', '$.b')", "not found"),
        ("jsonpath('{\"a\": 1}', '$[?(')", "jsonpath"),
        ("toJson(10.0 ** 300 * 10.0 ** 300)", "unsupported value"),
        ("filter(1, # > 0)", "cannot iterate"),
        ("map([1], # + 'a')", "needs a number"),
        ("len(1)", "invalid argument for len"),
        ("inputs()", r"inputs\(\) is not supported"),
    ],
)
def test_runtime_errors_are_one_line_expr_errors(text: str, message: str) -> None:
    with pytest.raises(ExprError, match=message) as info:
        evaluate(text, ENV)
    assert "\n" not in str(info.value)


def test_deep_json_is_an_error_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ExprError):
        evaluate("jsonpath(x, '$')", {"x": deep})


def test_a_non_string_expression_is_refused() -> None:
    with pytest.raises(ExprError, match="must be a string"):
        evaluate(5, {})  # type: ignore[arg-type]


def test_a_wrong_number_of_arguments_is_an_expr_error() -> None:
    with pytest.raises(ExprError, match="invalid call"):
        evaluate("sprig.add1()", {})


# -- `{{=...}}` tags in substitution, the checks before the run, the retry scope ----------------


def test_expression_tags_are_rendered_and_left_while_a_name_is_missing() -> None:
    values = {"inputs.parameters.foo": "3", "inputs.parameters": "[...]"}
    text = "x{{=asInt(inputs.parameters.foo) * 10}}y {{=item}} {{inputs.parameters.foo}}"
    out = render(text, values)
    assert out == "x30y {{=item}} 3"
    assert unresolved(out) == ["{{=item}}"]
    assert render(out, {"item": "7"}) == "x30y 7 3"


def test_a_spaced_equals_sign_is_a_simple_tag_still_reported() -> None:
    """`{{ =x}}` is no expression in Argo (parseTag: the tag must start with `=`), but it is
    still an unresolved tag, never passed through as text."""
    assert render("{{ =x}}", {"x": "1"}) == "{{ =x}}"
    assert unresolved("{{ =x}}") == ["{{=x}}"]


def test_a_tag_ends_at_the_first_closing_braces_as_in_argo() -> None:
    """fasttemplate: `{# > 1}` and a map literal close with one brace, so they nest."""
    assert render("{{=toJson(filter([1, 3], {# > 1}))}}", {}) == "[3]"
    assert render("{{=toJson({a: 1})}}!", {}) == '{"a":1}!'


def test_an_expression_error_is_kept_and_explained() -> None:
    out = render("{{=asInt('x')}}", {})
    assert out == "{{=asInt('x')}}"
    assert explain(out, {}) == "{{=asInt('x')}}: invalid operation: int(x)"
    assert explain("{{=inputs.parameters.nope}}", {"inputs.parameters.a": "1"}).endswith(
        "evaluated to nil"
    )


def test_per_item_tags() -> None:
    assert per_item("{{item}}") and per_item("{{item.a}}") and per_item("{{=item + 'x'}}")
    assert not per_item("{{=inputs.parameters.a}}") and not per_item("{{inputs.parameters.a}}")


def test_expr_check_names_the_template_and_the_field() -> None:
    spec = {
        "arguments": {"parameters": [{"name": "p", "value": "{{=1 +}}"}]},
        "templates": [
            {
                "name": "t",
                "steps": [[{"name": "s", "template": "t", "when": "{{=sprig.env('X')}}"}]],
                "outputs": {
                    "parameters": [{"name": "o", "valueFrom": {"expression": "a b"}}],
                    "artifacts": [{"name": "r", "fromExpression": "{"}],
                },
                "retryStrategy": {"expression": "{{inputs.parameters.x}} == true"},  # fine
            },
            {"name": "u", "container": {"args": ["{{=unclosed"]}},
        ],
        "hooks": {"running": {"expression": "workflow.status ==", "template": "t"}},
    }
    found = problems(spec)
    assert [(w, f) for w, f, _ in found] == [
        ("spec", "arguments.parameters.p.value"),
        ("template 't'", "steps[0].s.when"),
        ("template 't'", "outputs.parameters.o.valueFrom.expression"),
        ("template 't'", "outputs.artifacts.r.fromExpression"),
        ("template 'u'", "container.args[0]"),
        ("spec", "hooks.running.expression"),
    ]
    assert "sprig.env() is not supported" in found[1][2]
    assert "no closing" in found[4][2]


def _node(phase: str, exit_code: int | None, message: str, seconds: float) -> Node:
    node = Node(id="n", name="n", display_name="n", type="Pod", phase=phase, message=message)
    node.exit_code, node.started_at, node.finished_at = exit_code, 100.0, 100.0 + seconds
    return node


def test_retry_scope_and_expression_as_argo_builds_them() -> None:
    """operator.go buildRetryStrategyLocalScope: strings; Go's float64 duration."""
    last = _node("Failed", 2, "boom", 1.5)  # 100.0 .. 101.5: whole seconds 100 .. 101
    assert retry_scope(3, last) == {
        "retries": "2",
        "lastRetry": {"exitCode": "2", "status": "Failed", "duration": "1", "message": "boom"},
    }
    assert retry_continues({"expression": "asInt(lastRetry.exitCode) > 1"}, 1, last)
    assert not retry_continues({"expression": "lastRetry.status == 'Error'"}, 1, last)
    assert retry_continues({}, 1, last)
    assert retry_continues({"expression": "asInt(lastRetry.duration) < 120"}, 1, last)
    with pytest.raises(ExprError, match=r"int\(boom\)"):
        retry_continues({"expression": "asInt(lastRetry.message) < 120"}, 1, last)
    with pytest.raises(ExprError, match="to bool"):
        retry_continues({"expression": "lastRetry.exitCode"}, 1, last)
    assert retry_policy({"expression": "true"}) == "Always"
    assert retry_policy({}) == "OnFailure"
    assert retry_policy({"expression": "true", "retryPolicy": "OnError"}) == "OnError"


def test_output_expression_takes_the_default_on_error_or_nil() -> None:
    scope = {"steps.a.outputs.result": "x"}
    assert output_expression("o", {"expression": "steps.a.outputs.result + '!'"}, scope) == "x!"
    assert (
        output_expression("o", {"expression": "steps.b.outputs.result", "default": "d"}, scope)
        == "d"
    )
    assert output_expression("o", {"expression": "[1, 'a']"}, scope) == "[1 a]"  # Go's %v
    with pytest.raises(ValueError, match="output parameter 'o': valueFrom.expression: .*nil"):
        output_expression("o", {"expression": "steps.b.outputs.result"}, scope)


def test_random_token_soup_gives_a_value_or_an_expr_error() -> None:
    """Hostile input: no other exception, no hang, whatever the tokens."""
    tokens = "1 2.5 'a' nil true x x.y [ ] ( ) { } , : ? ?? ?. . + - * / % ** == < && || ! not in"
    tokens += " matches .. # map filter len sprig.add asInt jsonpath toJson sprig.b64dec 0x1f 1e400"
    tokens += " `raw` | .a [1,2] sprig.substr string sprig.repeat sprig.date keys sum split"
    words = tokens.split()
    rng = random.Random(7)
    for _ in range(3000):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 10)))
        with contextlib.suppress(ExprError):
            evaluate(text, {"x": {"y": [1, 2]}})


def test_a_slow_regular_expression_stops_at_its_time_limit(monkeypatch) -> None:
    from ckptflow.workflows.runner import expr_funcs

    monkeypatch.setattr(expr_funcs, "REGEX_TIMEOUT_S", 0.05)
    with pytest.raises(ExprError, match="took over 0.05 s"):
        evaluate("x matches '(x+x+)+y'", {"x": "x" * 5000})
