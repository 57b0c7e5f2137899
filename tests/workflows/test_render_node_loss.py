"""Rank and fine-tune pods tolerate a lost node only `platform.gpu_node_loss_toleration_s`
(issue 34): Kubernetes' DefaultTolerationSeconds would otherwise keep a silently lost rank
"Running" for 300 s after its node turns NotReady, and the gang could not restart before."""

from __future__ import annotations

import pytest
from ckptflow.workflows.render import main as render_main

from tests.workflows.argo_schema import errors
from tests.workflows.test_render import render, templates

GPU = ("pretrain-rank", "finetune-variant")


def node_loss(seconds: int) -> list[dict]:
    return [
        {"effect": "NoExecute", "key": k, "operator": "Exists", "tolerationSeconds": seconds}
        for k in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
    ]


def test_gpu_pods_tolerate_a_lost_node_for_the_setting_and_light_steps_keep_the_default():
    doc = render("pipeline", "platform.gpu_node_loss_toleration_s=75")[0]
    assert errors(doc) == []
    tpl = templates(doc)
    for name in GPU:
        assert tpl[name]["tolerations"] == node_loss(75), name
    light = [n for n, t in tpl.items() if "container" in t and n not in GPU]
    assert light and all("tolerations" not in tpl[n] for n in light)


def test_the_workflows_tolerations_stay_on_gpu_pods_beside_the_node_loss_ones():
    # a template's tolerations replace the workflow's in Argo (workflowpod.go): carry them
    doc = render("pipeline", "platform.tolerations=pool=cpu:NoSchedule")[0]
    for name in GPU:
        tol = templates(doc)[name]["tolerations"]
        assert tol[0] == {
            "effect": "NoSchedule",
            "key": "pool",
            "operator": "Equal",
            "value": "cpu",
        }
        assert tol[1:] == node_loss(60)


def test_a_user_toleration_of_the_taint_wins_and_zero_leaves_kubernetes_default():
    given = '[{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":500}]'
    tol = templates(render("pipeline", f"platform.gpu_tolerations={given}")[0])["pretrain-rank"]
    assert tol["tolerations"] == [{**node_loss(500)[0]}]
    tpl = templates(render("pipeline", "platform.gpu_node_loss_toleration_s=0")[0])
    assert all("tolerations" not in tpl[n] for n in GPU)


@pytest.mark.parametrize("seconds", ["10", "49"])
def test_a_toleration_below_the_node_grace_period_is_one_line_at_render(seconds, capsys):
    argv = ["pipeline", "--set", f"platform.gpu_node_loss_toleration_s={seconds}"]
    assert render_main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    (line,) = out.err.strip().splitlines()
    assert "node_monitor_grace_s=50" in line and "at least the grace period" in line


def test_a_lost_rendezvous_host_is_noticed_within_the_process_group_timeout():
    doc = render("pretrain", "pretrain.pg_timeout_s=45")[0]
    rank = templates(doc)["pretrain-rank"]["container"]
    ours = rank["command"][: rank["command"].index("--")]
    assert float(ours[ours.index("--host-lost-s") + 1]) == 45  # the same bound as a lost peer
    assert rank["args"][rank["args"].index("--pg-timeout-s") + 1] == "45"
