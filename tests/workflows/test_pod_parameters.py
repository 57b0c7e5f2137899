"""Issue 33 point 4: the pod settings that vary per run are workflow parameters of the rendered
pipeline, each defaulting to its setting: extra env of the GPU (rank, fine-tune) pods
(`gpu_env`), their podSpecPatch (`gpu_pod_spec_patch`), and every pod's PriorityClass
(`priority_class`). A bad value is one line naming the parameter; env that ckptflow itself sets
on those pods cannot be overridden."""

from __future__ import annotations

import json

import pytest
import yaml
from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides, validate
from ckptflow.workflows.parameters import PIPELINE, check_values
from ckptflow.workflows.render import main as render_main
from ckptflow.workflows.render import manifests
from ckptflow.workflows.runner.pss import restricted_violations
from ckptflow.workflows.runner.substitution import render as substitute

from tests.workflows.argo_schema import errors

GPU = ("pretrain-rank", "finetune-variant")
# Every setting that adds env to a pod, on: the names ckptflow sets are all there.
EVERYTHING = [
    "platform.gcs_secret=gcs-key",
    "platform.azure_secret=az",
    "platform.argo_ui=http://argo:2746",
]


def _templates(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["spec"]["templates"]}


def _values(doc: dict, given: dict[str, str] | None = None) -> dict[str, str]:
    out = {p["name"]: p["value"] for p in doc["spec"]["arguments"]["parameters"]}
    return {**out, **(given or {})}


def _patch(tmpl: dict, values: dict[str, str]) -> dict:
    """The podSpecPatch Argo applies: workflow parameters substituted, then read as YAML
    (util.ConvertYAMLToJSON: a patch not starting with '{' is YAML)."""
    text = substitute(
        tmpl["podSpecPatch"], {f"workflow.parameters.{k}": v for k, v in values.items()}
    )
    return yaml.safe_load(text)


def _render(*overrides: str) -> dict:
    cfg = apply_overrides(PipelineConfig(), list(overrides))
    validate(cfg)
    return manifests("pipeline", cfg)[0]


def test_gpu_env_cannot_override_the_env_ckptflow_sets_on_gpu_pods():
    doc = _render(*EVERYTHING, "platform.azure_account_name=acct")
    doc2 = _render(*EVERYTHING)  # the connection-string form of the Azure secret
    ours = {
        e["name"]
        for d in (doc, doc2)
        for name, t in _templates(d).items()
        if name in GPU
        for e in t["container"]["env"]
    }
    assert {"PET_LOCAL_ADDR", "AWS_ACCESS_KEY_ID", "MLFLOW_TRACKING_URI"} <= ours
    for name in sorted(ours):
        with pytest.raises(ConfigError) as err:
            apply_overrides(PipelineConfig(), [f"platform.gpu_env={name}=x"])
        assert f"{name!r} is set by ckptflow" in str(err.value), name
    with pytest.raises(ConfigError, match=r"^-p gpu_env=.*'PET_LOCAL_ADDR' is set by ckptflow"):
        check_values(PipelineConfig(), PIPELINE, {"gpu_env": '[{"name": "PET_LOCAL_ADDR", "value": "x"}]'})  # fmt: skip


def test_pod_settings_are_per_run_parameters_defaulting_to_the_settings():
    doc = _render(
        "platform.gpu_env=NCCL_DEBUG=INFO,NCCL_IB_HCA=mlx5",
        'platform.gpu_pod_spec_patch={"dnsConfig": {"options": [{"name": "ndots", "value": "2"}]}}',
        "platform.priority_class_name=training-high",
        "pretrain.grace_s=90",
    )
    assert errors(doc) == []  # Argo's schema (strict)
    values = _values(doc)
    assert json.loads(values["gpu_env"]) == [
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "NCCL_IB_HCA", "value": "mlx5"},
    ]
    assert json.loads(values["gpu_pod_spec_patch"]) == {
        "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]}
    }
    assert values["priority_class"] == "training-high"
    assert doc["spec"]["podPriorityClassName"] == "{{workflow.parameters.priority_class}}"
    tpl = _templates(doc)
    rank = _patch(tpl["pretrain-rank"], values)
    assert rank == {
        "terminationGracePeriodSeconds": 90,
        "containers": [
            {
                "name": "main",
                "env": [
                    {"name": "NCCL_DEBUG", "value": "INFO"},
                    {"name": "NCCL_IB_HCA", "value": "mlx5"},
                ],
            }
        ],
        "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
    }
    assert _patch(tpl["finetune-variant"], values)["terminationGracePeriodSeconds"] == 120
    for name, t in tpl.items():  # only GPU pods read them; their env is the parameter's
        if name not in GPU:
            assert "podSpecPatch" not in t, name
        env = (t.get("container") or {}).get("env") or []
        assert all(e["name"] != "NCCL_DEBUG" for e in env), name

    # Per run: the env and the patch are the run's; ours stays.
    run = _values(
        doc,
        {
            "gpu_env": '[{"name": "NCCL_DEBUG", "value": "WARN"}]',
            "gpu_pod_spec_patch": '{"nodeName": "gpu-7"}',
        },
    )
    check_values(PipelineConfig(), PIPELINE, {k: run[k] for k in ("gpu_env", "gpu_pod_spec_patch")})
    assert _patch(tpl["pretrain-rank"], run) == {
        "terminationGracePeriodSeconds": 90,
        "containers": [{"name": "main", "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}],
        "nodeName": "gpu-7",
    }


def test_by_default_the_gpu_pods_patch_is_ours_alone():
    doc = _render()
    values = _values(doc)
    assert values["gpu_env"] == "[]" and values["gpu_pod_spec_patch"] == "{}"
    assert values["priority_class"] == ""  # Argo: no PriorityClass (the cluster's default)
    assert _patch(_templates(doc)["pretrain-rank"], values) == {
        "terminationGracePeriodSeconds": 120,
        "containers": [{"name": "main", "env": []}],
    }


def test_host_network_in_a_gpu_patch_is_still_judged_once_parameters_are_known():
    doc = _render("platform.gpu_host_network=true")
    tpl = _templates(doc)["pretrain-rank"]
    resolved = {**tpl, "podSpecPatch": yaml.safe_dump(_patch(tpl, _values(doc)))}
    assert [v.split(" (")[0] for v in restricted_violations(resolved, {})] == ["host namespaces"]


@pytest.mark.parametrize(
    "name, value, why",
    [
        ("gpu_env", '{"NCCL_DEBUG": "INFO"}', 'a JSON list of {"name": ..., "value": ...}'),
        ("gpu_env", "NCCL_DEBUG=INFO", 'a JSON list of {"name": ..., "value": ...}'),
        ("gpu_env", '[{"name": "NCCL-X", "value": "1"}]', "not a variable name"),
        ("gpu_env", '[{"name": "A", "value": "1", "x": 2}]', 'a JSON list of {"name": ..., "value": ...}'),
        ("gpu_env", '[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]', "named twice"),
        ("gpu_pod_spec_patch", "[1]", "a JSON object"),
        ("gpu_pod_spec_patch", "hostIPC: true", "a JSON object"),
        ("gpu_pod_spec_patch", '{"a": ', "a JSON object"),
        # ours: merged beside the patch as YAML merge keys, no key may be in both
        ("gpu_pod_spec_patch", '{"containers": []}', "'containers' is ckptflow's: extra env is gpu_env"),
        ("gpu_pod_spec_patch", '{"terminationGracePeriodSeconds": 9}', "pretrain.grace_s"),
        ("gpu_pod_spec_patch", '{"hostNetwork": true}', "platform.gpu_host_network"),
        ("priority_class", "High Priority", "a Kubernetes name"),
    ],
)  # fmt: skip
def test_a_bad_per_run_pod_value_is_one_line_naming_the_parameter(name, value, why):
    with pytest.raises(ConfigError) as err:
        check_values(PipelineConfig(), PIPELINE, {name: value})
    text = str(err.value)
    assert text.startswith(f"-p {name}=") and why in text and "\n" not in text, text


def test_render_refuses_a_bad_per_run_pod_value_in_one_line(capsys):
    rc = render_main(["pipeline", "-p", "priority_class=High Priority"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "-p priority_class=High Priority" in err, err
