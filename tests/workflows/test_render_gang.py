"""Gang scheduling of the ranks (`platform.gang_scheduler`, workflows/gang_scheduling.py): golden
files per scheduler, Argo's schema, markings on the rank pods only, the PodGroup task, and
bad settings as one line.

Regenerate the golden files after an intended change with
`CKPTFLOW_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/workflows/test_render_gang.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides, validate
from ckptflow.workflows.render import main as render_main
from ckptflow.workflows.render import manifests, to_yaml
from ckptflow.workflows.runner.gang import Gang, gang_of, podgroup_min_member

from tests.workflows.argo_schema import errors

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("CKPTFLOW_UPDATE_GOLDEN") == "1"
KINDS = ("kueue", "volcano", "coscheduling")
GANG_KEYS = (
    "kueue.x-k8s.io/queue-name",
    "kueue.x-k8s.io/pod-group-name",
    "kueue.x-k8s.io/pod-group-total-count",
    "scheduling.k8s.io/group-name",
    "scheduling.x-k8s.io/pod-group",
)


def render(name: str, *overrides: str) -> list[dict]:
    return manifests(name, apply_overrides(PipelineConfig(), overrides))


def templates(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["spec"]["templates"]}


def tasks(doc: dict, dag: str) -> dict[str, dict]:
    return {t["name"]: t for t in templates(doc)[dag]["dag"]["tasks"]}


@pytest.mark.parametrize("kind", KINDS)
def test_golden(kind):
    text = to_yaml(render("pretrain", f"platform.gang_scheduler={kind}"))
    path = GOLDEN / f"pretrain-gang-{kind}.yaml"
    if UPDATE:
        path.write_text(text)
    assert path.is_file(), f"{path} missing: run with CKPTFLOW_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), (
        f"pretrain ({kind}) renders differently from {path}; if intended, regenerate with "
        "CKPTFLOW_UPDATE_GOLDEN=1"
    )


def test_none_is_the_default_and_changes_nothing():
    assert PipelineConfig().platform.gang_scheduler == "none"
    assert to_yaml(render("pipeline", "platform.gang_scheduler=none")) == to_yaml(
        render("pipeline")
    )


@pytest.mark.parametrize("builder", ["pretrain", "pipeline"])
@pytest.mark.parametrize("kind", KINDS)
def test_schema_valid_and_only_rank_pods_carry_the_markings(builder, kind):
    (doc,) = [d for d in render(builder, f"platform.gang_scheduler={kind}") if d["kind"]]
    assert errors(doc) == []
    for name, tmpl in templates(doc).items():
        meta = tmpl.get("metadata") or {}
        keys = {*(meta.get("labels") or {}), *(meta.get("annotations") or {})}
        if name == "pretrain-rank":
            assert keys & set(GANG_KEYS), kind
        else:
            assert not keys & set(GANG_KEYS), name
            assert "schedulerName" not in tmpl, name
    assert "schedulerName" not in doc["spec"]  # the other pods keep the default scheduler


def test_kueue_plain_pod_group_on_the_ranks():
    (doc,) = render("pretrain", "platform.gang_scheduler=kueue", "platform.gang_queue=team-a")
    rank = templates(doc)["pretrain-rank"]
    assert rank["metadata"] == {
        "labels": {
            "kueue.x-k8s.io/queue-name": "team-a",
            "kueue.x-k8s.io/pod-group-name": "{{workflow.name}}",
        },
        "annotations": {"kueue.x-k8s.io/pod-group-total-count": "{{workflow.parameters.ranks}}"},
    }
    assert "schedulerName" not in rank  # Kueue gates pods for the default scheduler
    assert "rank-podgroup" not in templates(doc)  # Kueue makes the group's Workload itself
    # the runner reads the same markings back: a gang of the ranks' count
    body = yaml.safe_load(
        yaml.safe_dump(rank)
        .replace("{{workflow.parameters.ranks}}", "2")
        .replace("{{workflow.name}}", "wf")
    )
    assert gang_of(body, doc["spec"], "ckptflow") == Gang("kueue", "wf", "ckptflow", 2)


@pytest.mark.parametrize(
    "kind, api, scheduler",
    [
        ("volcano", "scheduling.volcano.sh/v1beta1", "volcano"),
        ("coscheduling", "scheduling.x-k8s.io/v1alpha1", "scheduler-plugins-scheduler"),
    ],
)
def test_podgroup_is_made_before_the_ranks_and_owned_by_the_workflow(kind, api, scheduler):
    (doc,) = render("pretrain", f"platform.gang_scheduler={kind}", "pretrain.ranks=4")
    rank = templates(doc)["pretrain-rank"]
    assert rank["schedulerName"] == scheduler
    resource = templates(doc)["rank-podgroup"]["resource"]
    assert resource["action"] == "apply" and resource["setOwnerReference"] is True
    # Argo substitutes the parameter in the text before it parses the manifest
    text = resource["manifest"].replace("{{workflow.parameters.ranks}}", "4")
    group = yaml.safe_load(text.replace("{{workflow.name}}", "wf"))
    assert group["apiVersion"] == api and group["kind"] == "PodGroup"
    assert group["metadata"] == {"name": "wf"}
    assert podgroup_min_member(group, "PodGroup wf") == 4
    assert group["spec"].get("queue") == ("default" if kind == "volcano" else None)
    dag = tasks(doc, "pretrain")
    assert dag["podgroup"]["template"] == "rank-podgroup"
    assert dag["rank"]["depends"] == "podgroup"  # no rendezvous daemon (issue 34)
    body = {**rank, "metadata": {k: {n: "wf" for n in v} for k, v in rank["metadata"].items()}}
    assert gang_of(body, doc["spec"]) == Gang(kind, "wf", "default")


def test_queue_and_scheduler_names_are_settings():
    (doc,) = render(
        "pretrain",
        "platform.gang_scheduler=volcano",
        "platform.gang_queue=research",
        "platform.gang_scheduler_name=volcano-gpu",
    )
    assert templates(doc)["pretrain-rank"]["schedulerName"] == "volcano-gpu"
    assert "queue: research" in templates(doc)["rank-podgroup"]["resource"]["manifest"]


# A bad value of one gang setting: tests/workflows/test_config.py BAD_SETTINGS.
CLASHES = [
    (("platform.gang_queue=q",), "--set platform.gang_queue=q: platform.gang_scheduler=none"),
    (
        ("platform.gang_scheduler=coscheduling", "platform.gang_queue=q"),
        "--set platform.gang_queue=q: platform.gang_scheduler=coscheduling has no queue",
    ),
    (
        ("platform.gang_scheduler=kueue", "platform.gang_scheduler_name=volcano"),
        "--set platform.gang_scheduler_name=volcano: only volcano and coscheduling",
    ),
    (
        ("platform.gang_scheduler=kueue", "platform.gpu_pod_labels=kueue.x-k8s.io/queue-name=x"),
        "--set platform.gpu_pod_labels=kueue.x-k8s.io/queue-name=x: kueue.x-k8s.io/queue-name is "
        "written by platform.gang_scheduler=kueue",
    ),
    (
        (
            "platform.gang_scheduler=volcano",
            "platform.gpu_pod_annotations=scheduling.k8s.io/group-name=g",
        ),
        "is written by platform.gang_scheduler=volcano",
    ),
]


@pytest.mark.parametrize(("overrides", "line"), CLASHES, ids=[c[1][:40] for c in CLASHES])
def test_gang_settings_that_do_not_go_together_are_one_line(overrides, line):
    cfg = apply_overrides(PipelineConfig(), overrides)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert "\n" not in str(info.value) and line in str(info.value)


def test_render_refuses_a_bad_gang_scheduler_with_one_line_and_exit_2(capsys, tmp_path):
    out = tmp_path / "p.yaml"
    code = render_main(["pretrain", "--set", "platform.gang_scheduler=slurm", "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "platform.gang_scheduler=slurm" in err[0]
    assert not out.exists()
