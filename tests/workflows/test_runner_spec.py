"""What the local runner refuses before running anything, and the small languages it parses
(`when` conditions, enhanced `depends`)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, load_manifest, run_workflow
from ckptflow.workflows.runner import depends as dep
from ckptflow.workflows.runner.spec import validate
from ckptflow.workflows.runner.when import WhenError, evaluate_when

FIXTURES = Path(__file__).parent / "fixtures" / "runner"


def spec_with(template: dict, **spec) -> dict:
    return {"entrypoint": template["name"], "templates": [template], **spec}


def test_refused_manifest_names_each_field_and_template(tmp_path):
    manifest = load_manifest(str(FIXTURES / "refused.yaml"))
    with pytest.raises(SpecError) as info:
        run_workflow(manifest, workdir=str(tmp_path / "w"), stream=io.StringIO(), name="x")
    text = str(info.value)
    # a configMap volume reads the object store (--objects); a resource template runs against it
    assert "spec: volumes.data: ConfigMap 'settings' is not in the cluster model" in text
    assert "make-configmap" not in text
    assert "template 'with-artifact' inputs: artifacts.data.s3: only s3.key works" in text
    assert "env.TOKEN.valueFrom.secretKeyRef" in text and "export TOKEN" in text
    assert "{{=sprig.env('HOME')}}: function sprig.env() is not supported" in text
    assert not (tmp_path / "w").exists()  # nothing ran, nothing written


def test_secret_env_is_taken_from_the_runner_environment(tmp_path):
    tmpl = {
        "name": "main",
        "container": {
            "image": "busybox",
            "command": ["sh", "-c"],
            "args": ["echo $TOKEN"],
            "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        },
    }
    with pytest.raises(SpecError, match="export TOKEN"):
        validate(spec_with(tmpl), env={})
    validate(spec_with(tmpl), env={"TOKEN": "t0k"})


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ({"name": "t", "container": {"image": "x", "args": ["a"]}}, "command: missing"),
        ({"name": "t", "suspend": {}}, "suspend"),
        (
            {
                "name": "t",
                "container": {"command": ["x"], "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
            },
            "volumeMounts.v: no volume of that name",
        ),
        ({"name": "t", "container": {"command": ["x"]}, "sidecars": []}, "sidecars"),
        (
            {
                "name": "t",
                "container": {"command": ["x"]},
                "synchronization": {"semaphores": [{"configMapKeyRef": {"name": "c", "key": "k"}}]},
            },
            "synchronization.semaphores c/k: its limit is in a ConfigMap",
        ),
        (
            {"name": "t", "container": {"command": ["x"]}, "synchronization": {"lease": {}}},
            "synchronization.lease: not supported",
        ),
        (
            {"name": "t", "dag": {"tasks": [{"name": "a", "template": "nope"}]}},
            "no template named 'nope'",
        ),
        (
            {"name": "t", "dag": {"tasks": [{"name": "a", "template": "t", "depends": "b.Oops"}]}},
            "unknown task result 'Oops'",
        ),
        (
            {"name": "t", "dag": {"tasks": [{"name": "a", "template": "t", "depends": "ghost"}]}},
            "unknown task 'ghost'",
        ),
        (
            {"name": "t", "container": {"command": ["x"]}, "retryStrategy": {"expression": "x +"}},
            "template 't': retryStrategy.expression: expression 'x +': unexpected end",
        ),
    ],
)
def test_unsupported_fields_are_refused(template, needle):
    with pytest.raises(SpecError) as info:
        validate(spec_with(template), env={})
    assert needle in str(info.value)
    assert f"template {template['name']!r}" in str(info.value) or "spec" in str(info.value)


def test_ignored_fields_do_not_block():
    tmpl = {
        "name": "t",
        "metadata": {"labels": {"a": "b"}},
        "nodeSelector": {"gpu": "h100"},
        "container": {"image": "x", "command": ["true"], "resources": {"limits": {"cpu": 1}}},
    }
    validate(spec_with(tmpl, serviceAccountName="argo", podGC={"strategy": "OnPodSuccess"}), env={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("heads == heads", True),
        ("heads == tails", False),
        ("heads != tails", True),
        ("7 > 5", True),
        ("10 < 9", False),
        ("1.0 == 1", True),
        ("5 == '5'", False),
        ("true", True),
        ("true == false || !false", True),
        ("(1 > 2 || 3 >= 3) && 2 <= 2", True),
        ("'hello world' =~ '^hello'", True),
        ("abc !~ 'b'", False),
        ("2 in (1, 2, 3)", True),
        ("Succeeded == Succeeded ? true : false", True),
        ("", True),
        ("3 - 1 == 2", True),
    ],
)
def test_when_uses_govaluate_semantics(text, expected):
    assert evaluate_when(text) is expected


@pytest.mark.parametrize("text", ["1 + ", "heads", "(a == b", "a = b", "5 > x"])
def test_bad_when_is_an_error(text):
    with pytest.raises(WhenError):
        evaluate_when(text)


def facts(**phases) -> dict[str, dep.TaskFacts]:
    return {k.replace("_", "-"): dep.TaskFacts(phase=v) for k, v in phases.items()}


def test_depends_bare_name_means_succeeded_skipped_or_daemoned():
    tree = dep.parse_depends("task-a")
    assert dep.tasks_in(tree) == {"task-a"}
    for phase, ok in [
        ("Succeeded", True),
        ("Skipped", True),
        ("Failed", False),
        ("Omitted", False),
    ]:
        assert dep.evaluate(tree, facts(task_a=phase), {}) is ok
    daemon = {"task-a": dep.TaskFacts(phase="Running", daemoned=True)}
    assert dep.evaluate(tree, daemon, {}) is True
    assert dep.evaluate(tree, facts(task_a="Failed"), {"task-a": {"failed": True}}) is True
    assert dep.evaluate(tree, facts(task_a="Error"), {"task-a": {"failed": True}}) is False


def test_depends_boolean_logic():
    tree = dep.parse_depends("(A.Succeeded || A.Skipped) && !B.Failed || C.Errored")
    assert dep.tasks_in(tree) == {"A", "B", "C"}
    assert dep.evaluate(tree, facts(A="Skipped", B="Succeeded", C="Failed"), {})
    assert not dep.evaluate(tree, facts(A="Succeeded", B="Failed", C="Failed"), {})
    assert dep.evaluate(tree, facts(A="Failed", B="Failed", C="Error"), {})
    group = {"L": dep.TaskFacts(phase="Failed", any_succeeded=True)}
    assert dep.evaluate(dep.parse_depends("L.AnySucceeded && !L.AllFailed"), group, {})


@pytest.mark.parametrize("text", ["A &&", "A.Bogus", "(A", "A B", "&& A"])
def test_bad_depends_is_refused(text):
    with pytest.raises(dep.DependsError):
        dep.parse_depends(text)


def test_a_missing_secret_is_one_line_however_many_templates_use_it():
    """The rendered cluster manifest, run locally, repeated one secretKeyRef message 14 times
    (one per template and variable): one line per missing Secret (issue 38, point 13)."""

    def tmpl(name: str) -> dict:
        ref = {"name": "ckptflow-s3"}
        env = [
            {"name": v, "valueFrom": {"secretKeyRef": {**ref, "key": v}}}
            for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ]
        env.append({"name": "T", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "t"}}})
        return {"name": name, "container": {"image": "x", "command": ["true"], "env": env}}

    steps = [[{"name": f"s{i}", "template": f"t{i}"}] for i in range(7)]
    spec = {
        "entrypoint": "main",
        "templates": [{"name": "main", "steps": steps}, *(tmpl(f"t{i}") for i in range(7))],
    }
    with pytest.raises(SpecError) as info:
        validate(spec, env={"AWS_ACCESS_KEY_ID": "given"})
    lines = str(info.value).splitlines()[1:]
    secret = [s for s in lines if "ckptflow-s3" in s]
    assert len(secret) == 1 and len(lines) == 2, lines
    assert "export AWS_SECRET_ACCESS_KEY" in secret[0] and "7 templates" in secret[0]
    assert "AWS_ACCESS_KEY_ID" not in secret[0]  # given: passed through
    assert any("ConfigMap 'cm'" in s and "export T " in s for s in lines), lines
