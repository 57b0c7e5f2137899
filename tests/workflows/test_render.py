"""Rendered manifests: golden files, Argo v4.1.2's schema (strict), and their structure.

Regenerate the golden files after an intended change with
`CKPTFLOW_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/workflows/test_render.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from ckptflow.workflows.config import PipelineConfig, apply_overrides
from ckptflow.workflows.render import BUILDER_NAMES, manifests, to_yaml
from ckptflow.workflows.render import main as render_main
from hera.workflows import CronWorkflow, Workflow, WorkflowTemplate

from tests.workflows.argo_schema import errors

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("CKPTFLOW_UPDATE_GOLDEN") == "1"


def templates(doc: dict) -> dict[str, dict]:
    spec = doc["spec"].get("workflowSpec", doc["spec"])
    return {t["name"]: t for t in spec["templates"]}


def tasks(doc: dict, dag: str) -> dict[str, dict]:
    return {t["name"]: t for t in templates(doc)[dag]["dag"]["tasks"]}


def arguments(doc: dict) -> dict[str, str]:
    """The workflow parameters' default values."""
    spec = doc["spec"].get("workflowSpec", doc["spec"])
    return {p["name"]: p.get("value") for p in spec["arguments"]["parameters"]}


def pod_patch(doc: dict, name: str) -> dict:
    """Template `name`'s podSpecPatch as Argo applies it with the parameters' defaults (YAML)."""
    text = templates(doc)[name].get("podSpecPatch") or "{}"
    for k, v in arguments(doc).items():
        text = text.replace("{{workflow.parameters." + k + "}}", v or "")
    return yaml.safe_load(text)


def render(name: str, *overrides: str) -> list[dict]:
    return manifests(name, apply_overrides(PipelineConfig(), overrides))


@pytest.mark.parametrize("name", BUILDER_NAMES)
def test_golden(name):
    text = to_yaml(render(name))
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:
        path.write_text(text)
    assert path.is_file(), f"{path} missing: run with CKPTFLOW_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), (
        f"{name} renders differently from {path}; if intended, regenerate with "
        "CKPTFLOW_UPDATE_GOLDEN=1"
    )


@pytest.mark.parametrize("name", BUILDER_NAMES)
@pytest.mark.parametrize(
    "overrides",
    [
        (),
        (
            "pretrain.ranks=4",
            "pretrain.rank_resources.gpu=8",
            "platform.node_selector=pool=gpu,zone=a",
            "platform.tolerations=nvidia.com/gpu:NoSchedule,spot=true:NoExecute",
            "platform.pod_gc=",
            "finetune.lrs=1e-3,3e-4,1e-4",
            "finetune.force=true",
            "retention.roots=s3://b/r1/ckpt,s3://b/r2/ckpt",
        ),
    ],
    ids=["defaults", "overridden"],
)
def test_every_manifest_validates_against_argo_schema(name, overrides):
    for doc in render(name, *overrides):
        assert errors(doc) == [], f"{name} {doc['kind']} is invalid"
        if doc["kind"] == "Sensor":
            for trigger in doc["spec"]["triggers"]:
                embedded = trigger["template"]["argoWorkflow"]["source"]["resource"]
                assert errors(embedded) == []


def test_schema_check_rejects_unknown_and_mistyped_fields():
    doc = render("pipeline")[0]
    doc["spec"]["templates"][0]["container"]["imagePullPolcy"] = "Always"
    doc["spec"]["podGC"]["strategie"] = "OnPodSuccess"
    doc["spec"]["activeDeadlineSeconds"] = "soon"
    found = "\n".join(errors(doc))
    assert "imagePullPolcy" in found and "strategie" in found
    assert "activeDeadlineSeconds" in found
    sensor = render("evaluate")[2]
    sensor["spec"]["triggers"][0]["template"]["argoWorkflw"] = {}
    assert any("argoWorkflw" in e for e in errors(sensor))


def test_builders_return_hera_objects():
    from ckptflow.workflows.evaluate_template import build_evaluate
    from ckptflow.workflows.finetune_dag import build_finetune
    from ckptflow.workflows.pipeline import build_pipeline
    from ckptflow.workflows.pretrain_dag import build_pretrain
    from ckptflow.workflows.retention_cron import build_retention

    cfg = PipelineConfig()
    for build in (build_pipeline, build_pretrain, build_finetune):
        assert type(build(cfg)) is Workflow
    assert isinstance(build_retention(cfg), CronWorkflow)
    assert isinstance(build_evaluate(cfg), WorkflowTemplate)


def test_pretrain_ranks_meet_at_rank_0s_published_rendezvous():
    doc = render("pipeline", "pretrain.ranks=3", "pretrain.procs_per_rank=2")[0]
    tpl = templates(doc)
    assert "rdzv" not in tpl  # no daemon: rank 0 hosts the store (issue 34)
    dag = tasks(doc, "pretrain")
    assert dag["rank"]["withSequence"] == {"count": "{{workflow.parameters.ranks}}"}
    assert arguments(doc)["ranks"] == "3"
    assert "depends" not in dag["rank"]
    args = {p["name"]: p["value"] for p in dag["rank"]["arguments"]["parameters"]}
    assert args["node_rank"] == "{{item}}"
    assert "depends" not in dag["evaluate"]  # concurrent with the ranks
    cmd = tpl["pretrain-rank"]["container"]["command"]
    assert cmd[:3] == ["python", "-m", "ckptflow.steps.rdzv"]
    ours = cmd[3 : cmd.index("--")]
    assert ours == [
        "--run-root", "{{inputs.parameters.run_root}}",
        "--node-rank", "{{inputs.parameters.node_rank}}",
    ]  # fmt: skip
    assert cmd[-2:] == ["-m", "ckptflow.steps.pretrain"]
    assert "--nnodes={{workflow.parameters.ranks}}" in cmd and "--nproc-per-node=2" in cmd
    assert not any(a.startswith("--rdzv-endpoint") for a in cmd)  # the rendezvous step's
    assert "--rdzv-id={{workflow.uid}}" in cmd
    assert any(a.startswith("--rdzv-conf=is_host=false") for a in cmd)
    rank_args = tpl["pretrain-rank"]["container"]["args"]
    assert rank_args[:2] == ["--run-root", "{{inputs.parameters.run_root}}"]
    assert rank_args[-2:] == ["--output-dir", "/tmp/outputs"]
    eval_args = tpl["evaluate-background"]["container"]["args"]
    assert "--forever" in eval_args  # Argo fails a daemon that exits (issue 33)
    assert "--until-finished" in tpl["evaluate-final"]["container"]["args"]
    # A daemon: failed ranks end the DAG at once (stopping it); the final one follows the
    # run to FINISHED after the ranks succeeded (issue 15).
    assert tpl["evaluate-background"]["daemon"] is True
    assert dag["evaluate-final"]["depends"] == "rank"
    assert "daemon" not in tpl["evaluate-final"]
    assert "--until-finished" in tpl["evaluate-final"]["container"]["args"]


def test_rank_agents_publish_their_pod_ip_not_their_hostname():
    # torchrun's c10d rendezvous publishes the agent's address for the workers' store:
    # socket.getfqdn() (the pod's hostname, which no other pod resolves) unless a local
    # address is given. PET_LOCAL_ADDR (= --local-addr) from the downward API gives the IP.
    pod_ip = {"name": "PET_LOCAL_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    tpl = templates(render("pipeline")[0])
    for name in ("pretrain-rank", "finetune-variant"):
        assert pod_ip in tpl[name]["container"]["env"], name


def test_rank_pods_retry_and_are_scheduled_as_configured():
    doc = render(
        "pretrain",
        "pretrain.retries=5",
        "pretrain.timeout=7200",
        "pretrain.shm_size=8Gi",
        "pretrain.rank_resources.gpu=1",
        "platform.node_selector=pool=gpu",
        "platform.tolerations=nvidia.com/gpu:NoSchedule,spot=yes:NoExecute",
        "platform.pod_gc=OnWorkflowSuccess",
    )[0]
    rank = templates(doc)["pretrain-rank"]
    assert rank["retryStrategy"]["limit"] == 5
    assert rank["retryStrategy"]["retryPolicy"] == "Always"
    for name in ("evaluate-background", "evaluate-final"):  # they resume where they were
        assert templates(doc)[name]["retryStrategy"]["retryPolicy"] == "Always"
    assert rank["timeout"] == "{{workflow.parameters.pretrain_timeout}}"
    assert arguments(doc)["pretrain_timeout"] == "7200"
    assert rank["volumes"] == [
        {"emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}, "name": "dshm"}
    ]
    assert rank["container"]["volumeMounts"] == [{"mountPath": "/dev/shm", "name": "dshm"}]
    assert rank["container"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    spec = doc["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [
        {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"},
        {"effect": "NoExecute", "key": "spot", "operator": "Equal", "value": "yes"},
    ]
    assert spec["podGC"] == {"strategy": "OnWorkflowSuccess"}
    assert spec["serviceAccountName"] == "ckptflow-workflow"


def test_pipeline_is_one_workflow_with_one_parent_run():
    doc = render("pipeline")[0]
    meta, spec = doc["metadata"], doc["spec"]
    assert meta["generateName"] == "ckptflow-"
    assert meta["annotations"]["workflows.argoproj.io/title"].startswith("ckptflow pipeline")
    assert meta["annotations"]["workflows.argoproj.io/description"]
    assert meta["labels"]["ckptflow.io/mlflow-experiment"] == "ckptflow"
    run_name = spec["workflowMetadata"]["labelsFrom"]["ckptflow.io/mlflow-run-name"]
    assert run_name == {"expression": "workflow.name"}
    main = tasks(doc, "main")
    assert main["pretrain"]["depends"] == "start-run"
    assert main["finetune"]["depends"] == "pretrain"
    assert spec["onExit"] == "finish-run"
    finish = templates(doc)["finish-run"]["container"]["args"]
    assert finish == [
        "--run-id",
        "{{workflow.outputs.parameters.mlflow_run_id}}",
        "--status",
        "{{workflow.status}}",
    ]
    start = templates(doc)["start-run"]
    assert start["outputs"]["parameters"][0]["globalName"] == "mlflow_run_id"
    start_args = start["container"]["args"]
    assert start_args[start_args.index("--run-name") + 1] == "{{workflow.name}}"
    # The parent run records the workflow parameters as this run got them, not a blob.
    assert start_args[start_args.index("--config-json") + 1] == "{{workflow.parameters.json}}"
    assert arguments(doc)["ranks"] == "2" and "variants" in arguments(doc)
    # Every later step nests under the parent run.
    for name in ("pretrain", "finetune"):
        args = {p["name"]: p["value"] for p in main[name]["arguments"]["parameters"]}
        assert args["parent_run_id"] == "{{tasks.start-run.outputs.parameters.run_id}}"


def test_only_references_pass_between_tasks():
    doc = render("pipeline", "finetune.lrs=1e-3,1e-4", "finetune.freeze_blocks=0,2")[0]
    main = {
        t: {p["name"]: p["value"] for p in v["arguments"]["parameters"]}
        for t, v in tasks(doc, "main").items()
        if "arguments" in v
    }
    root = "s3://ckptflow/runs/{{workflow.name}}"
    assert main["pretrain"]["run_root"] == f"{root}/pretrain"
    assert main["finetune"] == {
        "base_root": f"{root}/pretrain",
        "run_root": root,
        "parent_run_id": "{{tasks.start-run.outputs.parameters.run_id}}",
    }
    ft = tasks(doc, "finetune")
    assert ft["variant"]["withParam"] == "{{workflow.parameters.variants}}"
    grid = json.loads(arguments(doc)["variants"])
    assert grid == [
        {"lr": "0.001", "freeze": "0"},
        {"lr": "0.001", "freeze": "2"},
        {"lr": "0.0001", "freeze": "0"},
        {"lr": "0.0001", "freeze": "2"},
    ]
    variant_args = {p["name"]: p["value"] for p in ft["variant"]["arguments"]["parameters"]}
    assert variant_args["variant_root"] == (
        "{{inputs.parameters.run_root}}/finetune/lr{{item.lr}}-freeze{{item.freeze}}"
    )
    assert ft["variant"]["continueOn"] == {"error": True, "failed": True}
    assert ft["select"]["depends"] == "variant.Succeeded || variant.Failed || variant.Errored"
    select = templates(doc)["select"]["container"]["args"]
    # Every variant folder under the run's finetune/ (the grid is a workflow parameter).
    assert select[select.index("--candidates") + 1] == "{{inputs.parameters.run_root}}/finetune/*"
    assert select[select.index("--metric") + 1] == "{{workflow.parameters.metric}}"
    variant_cmd = templates(doc)["finetune-variant"]["container"]["command"]
    assert "--standalone" in variant_cmd and "--nproc-per-node=1" in variant_cmd


def test_s3_keys_come_from_the_secret_never_inline():
    for name in BUILDER_NAMES:
        for doc in render(name, "platform.s3_secret=team-s3"):
            if doc["kind"] in ("EventSource", "Sensor"):
                continue
            for tpl in templates(doc).values():
                for env in (tpl.get("container") or {}).get("env", []):
                    if env["name"].startswith("AWS_") and "KEY" in env["name"]:
                        assert "value" not in env
                        assert env["valueFrom"]["secretKeyRef"]["name"] == "team-s3"
    es = render("evaluate", "platform.s3_secret=team-s3")[1]
    minio = es["spec"]["minio"]["checkpoint-commits"]
    assert minio["accessKey"] == {"name": "team-s3", "key": "AWS_ACCESS_KEY_ID"}
    # Without a Secret (local runs) no key variable is set at all: the environment passes.
    doc = render("pipeline", "platform.s3_secret=")[0]
    for tpl in templates(doc).values():
        names = {e["name"] for e in (tpl.get("container") or {}).get("env", [])}
        assert "AWS_SECRET_ACCESS_KEY" not in names


def test_mlflow_uri_and_argo_names_reach_every_step():
    doc = render("pipeline", "platform.mlflow_tracking_uri=http://mlflow.example:5000")[0]
    for name, tpl in templates(doc).items():
        if "container" not in tpl:
            continue
        env = {e["name"]: e.get("value") for e in tpl["container"]["env"]}
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.example:5000", name
        assert env["ARGO_WORKFLOW_NAME"] == "{{workflow.name}}"
        assert env["ARGO_WORKFLOW_UID"] == "{{workflow.uid}}"
        assert env["ARGO_WORKFLOW_NAMESPACE"] == "{{workflow.namespace}}"


def test_no_template_carries_inline_source():
    for name in BUILDER_NAMES:
        doc = render(name)[0]
        for tpl in templates(doc).values():
            assert "script" not in tpl
            if "container" in tpl:
                cmd = tpl["container"]["command"]
                assert cmd[:2] == ["python", "-m"], cmd


def test_retention_uses_v4_schedules_and_the_gc_cli():
    doc = render("retention", "retention.schedules=0 * * * *,30 4 * * 0")[0]
    assert doc["kind"] == "CronWorkflow"
    assert doc["spec"]["schedules"] == ["0 * * * *", "30 4 * * 0"]
    assert "schedule" not in doc["spec"]
    gc = templates(doc)["gc"]["container"]
    assert gc["command"] == ["python", "-m", "ckptflow.cli"]
    assert gc["args"] == [
        "ckpt", "gc", "{{inputs.parameters.root}}", "--policy", "2h:all,1d:1h,7d:1d,*:7d", "--yes"
    ]  # fmt: skip
    assert doc["spec"]["concurrencyPolicy"] == "Forbid"


def test_render_cli_writes_a_file_and_rejects_unknown_keys(tmp_path, capsys):
    out = tmp_path / "pipeline.yaml"
    assert render_main(["pipeline", "-o", str(out), "--set", "pretrain.ranks=3"]) == 0
    doc = yaml.safe_load(out.read_text())
    assert arguments(doc)["ranks"] == "3"
    assert render_main(["pipeline", "--set", "pretrain.rnks=3"]) == 2
    assert "did you mean pretrain.ranks" in capsys.readouterr().err
    assert render_main(["evaluate"]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == ["WorkflowTemplate", "EventSource", "Sensor"]


def test_a_json_toleration_renders_as_a_kubernetes_toleration():
    doc = render("pipeline", 'platform.tolerations=[{"key":"nvidia.com/gpu","operator":"Exists"}]')[
        0
    ]
    assert doc["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert errors(doc) == []


@pytest.mark.parametrize(
    "setting",
    ["platform.image_pull_policy=Sometimes", "platform.pod_gc=Sometimes", "pretrain.model=huge"],
)
def test_render_refuses_a_bad_setting_in_one_line(setting, capsys):
    assert render_main(["pipeline", "--set", setting]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and "Traceback" not in out.err
    assert out.err.startswith(f"ckptflow render: --set {setting}: not one of")


def test_per_run_knobs_are_workflow_parameters_with_descriptions_and_enums():
    from ckptflow.workflows.parameters import PIPELINE

    doc = render("pipeline", "pretrain.max_steps=120", "finetune.metric=exact_match")[0]
    params = {p["name"]: p for p in doc["spec"]["arguments"]["parameters"]}
    assert list(params) == [k.name for k in PIPELINE]
    assert all(p["description"] for p in params.values())
    assert params["model"]["enum"][0] == "tiny" and params["mode"]["enum"] == ["min", "max"]
    assert params["pretrain_steps"]["value"] == "120"  # --set renders the default
    assert params["metric"]["value"] == "exact_match"
    # Every parameter is read somewhere, and the steps read no rendered copy of a knob.
    text = to_yaml([doc])
    for name in params:
        assert "{{workflow.parameters." + name + "}}" in text, name
    rank = templates(doc)["pretrain-rank"]["container"]["args"]
    assert rank[rank.index("--max-steps") + 1] == "{{workflow.parameters.pretrain_steps}}"
    assert (
        max(len(a) for t in templates(doc).values() for a in t.get("container", {}).get("args", []))
        < 200
    )


def test_retries_only_where_a_retry_can_help():
    doc = render("pipeline")[0]
    policy = {
        n: t["retryStrategy"]["retryPolicy"]
        for n, t in templates(doc).items()
        if "retryStrategy" in t
    }
    assert policy == {
        "start-run": "OnError",
        "finish-run": "OnError",
        "pretrain-rank": "Always",
        "evaluate-background": "Always",
        "evaluate-final": "Always",
        "finetune-variant": "Always",
        "select": "OnError",  # a failed selection fails again; only a lost pod is retried
    }


def test_template_form_is_a_schema_valid_workflow_template():
    doc = render_form("pipeline", "template")
    assert doc["kind"] == "WorkflowTemplate"
    assert doc["metadata"]["name"] == "ckptflow-pipeline" and "generateName" not in doc["metadata"]
    assert errors(doc) == []
    assert doc["spec"] == render("pipeline")[0]["spec"]


def test_from_template_runs_the_template_with_its_own_parameter_values():
    from ckptflow.workflows.runner import resolve_template_ref

    wf = render_form("pipeline", "from-template", ranks="3", metric="exact_match")
    assert errors(wf) == []
    assert wf["spec"] == {
        "workflowTemplateRef": {"name": "ckptflow-pipeline"},
        "arguments": {
            "parameters": [
                {"name": "ranks", "value": "3"},
                {"name": "metric", "value": "exact_match"},
            ]
        },
    }
    # Resolved as the controller does, it is the plain Workflow with those values.
    resolved = resolve_template_ref(wf, [render_form("pipeline", "template")])
    plain = render_form("pipeline", "workflow", ranks="3", metric="exact_match")
    assert resolved["spec"] == plain["spec"]
    assert arguments(plain)["ranks"] == "3" and arguments(plain)["model"] == "tiny"


def render_form(name: str, form: str, **values: str) -> dict:
    return manifests(name, PipelineConfig(), form, values)[0]


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["pipeline", "-p", "rnks=3"], "no such workflow parameter; did you mean ranks?"),
        (["pipeline", "-p", "ranks=0"], "-p ranks=0: must be at least 1"),
        (["pipeline", "-p", "model=huge"], "-p model=huge: not one of tiny"),
        (["pipeline", "-p", "mode=max2"], "-p mode=max2: not one of min, max"),
        (["pipeline", "-p", "ckpt_every=-5"], "-p ckpt_every=-5: must be at least 1"),
        (["pipeline", "-p", "variants=[]"], "non-empty JSON list"),
        (["pipeline", "-p", 'variants=[{"lr":"0","freeze":"1"}]'], "lr must be above 0"),
        (["pipeline", "-p", "ranks"], "expected NAME=VALUE"),
        (["retention", "-p", "x=1"], "takes no workflow parameters"),
        (["retention", "--template"], "has no template form"),
        (["pipeline", "--template", "--from-template"], "not allowed with"),
        (["pipline"], "invalid choice"),
        (["pipeline", "--set"], "expected one argument"),
    ],
)
def test_render_refuses_bad_parameters_in_one_line(argv, phrase, capsys):
    assert render_main(argv) == 2
    err = capsys.readouterr().err
    assert phrase in err and err.count("\n") == 1 and "Traceback" not in err


def test_gpu_pods_get_their_own_nodes_tolerations_and_env_light_steps_do_not():
    doc = render(
        "pipeline",
        "platform.node_selector=pool=cpu",
        "platform.gpu_node_selector=pool=gpu",
        "platform.gpu_tolerations=nvidia.com/gpu:NoSchedule",
        "platform.gpu_env=NCCL_DEBUG=INFO,NCCL_IB_HCA=mlx5",
        "platform.gpu_extended_resources=rdma/ib=1",
        "platform.gpu_pod_labels=team=ml",
        'platform.gpu_pod_annotations={"k8s.v1.cni.cncf.io/networks": "ib0,ib1"}',
        "platform.priority_class_name=training-high",
        "platform.scheduler_name=volcano",
    )[0]
    assert errors(doc) == []  # Argo's schema (strict)
    tpl, spec = templates(doc), doc["spec"]
    assert spec["nodeSelector"] == {"pool": "cpu"}  # light steps: the workflow's
    # per-run parameters, defaulting to the settings (tests/workflows/test_pod_parameters.py)
    assert spec["podPriorityClassName"] == "{{workflow.parameters.priority_class}}"
    assert arguments(doc)["priority_class"] == "training-high"
    assert spec["schedulerName"] == "volcano"
    gpu = {n for n, t in tpl.items() if t.get("nodeSelector")}
    assert gpu == {"pretrain-rank", "finetune-variant"}
    for name in gpu:
        assert tpl[name]["nodeSelector"] == {"pool": "gpu"}
        # then the node-loss ones (tests/workflows/test_render_node_loss.py)
        assert tpl[name]["tolerations"][0] == {
            "effect": "NoSchedule",
            "key": "nvidia.com/gpu",
            "operator": "Exists",
        }
        (main,) = pod_patch(doc, name)["containers"]
        assert {"name": "NCCL_DEBUG", "value": "INFO"} in main["env"]
        assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in main["env"]
        assert tpl[name]["metadata"]["labels"] == {"team": "ml"}
        assert tpl[name]["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "ib0,ib1"}
        res = tpl[name]["container"]["resources"]
        assert res["requests"]["rdma/ib"] == res["limits"]["rdma/ib"] == "1"
    for name, t in tpl.items():
        if name not in gpu and "container" in t:
            assert "tolerations" not in t and "metadata" not in t, name
            assert "podSpecPatch" not in t, name
            assert "rdma/ib" not in t["container"]["resources"].get("limits", {}), name
            assert all(e["name"] != "NCCL_DEBUG" for e in t["container"].get("env", [])), name


def test_gpu_host_network_is_said_at_render_and_only_rank_pods_get_it(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    rc = render_main(["pipeline", "--set", "platform.gpu_host_network=true", "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 0
    (note,) = [line for line in err if "note:" in line]
    assert "platform.gpu_host_network=true" in note and "Pod Security" in note
    doc = yaml.safe_load(out.read_text())
    for name, t in templates(doc).items():
        patch = pod_patch(doc, name)
        gpu = name in ("pretrain-rank", "finetune-variant")
        assert patch.get("hostNetwork", False) is gpu, name
        if gpu:  # still resolves cluster services; the rest of the context stays restricted
            assert patch["dnsPolicy"] == "ClusterFirstWithHostNet"
            assert t["container"]["securityContext"]["allowPrivilegeEscalation"] is False
    render_main(["pipeline", "-o", str(out)])
    assert "note:" not in capsys.readouterr().err


def test_a_user_pod_spec_patch_is_merged_over_ours_on_gpu_pods_and_said_when_it_leaves_pss(
    tmp_path, capsys
):
    out = tmp_path / "p.yaml"
    user = '{"hostIPC": true, "priority": 7}'
    rc = render_main(["pipeline", "--set", f"platform.gpu_pod_spec_patch={user}", "-o", str(out)])
    assert rc == 0
    assert "gpu_pod_spec_patch sets hostIPC" in capsys.readouterr().err
    doc = yaml.safe_load(out.read_text())
    patch = pod_patch(doc, "pretrain-rank")  # the setting is the per-run parameter's default
    assert patch["hostIPC"] is True and patch["priority"] == 7
    assert patch["terminationGracePeriodSeconds"] > 0  # ours kept beside it
    assert "podSpecPatch" not in templates(doc)["select"]
