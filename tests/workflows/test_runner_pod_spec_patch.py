"""The env of a template's podSpecPatch reaches its container (workflow/controller/
workflowpod.go applies the patch to the pod it built: a strategic merge, where `containers` and
their `env` merge by name). The pipeline's rank and fine-tune pods get their per-run env
(`gpu_env`) that way; the patch's other fields stay ignored by the runner, as before."""

from __future__ import annotations

import io

import pytest
from ckptflow.workflows.runner import run_workflow
from ckptflow.workflows.runner.pod_rules import patched_env

PRINT = "import os; print(os.environ.get('A'), os.environ.get('B'))"


def _manifest(patch: str) -> dict:
    return {
        "metadata": {"name": "patch"},
        "spec": {
            "entrypoint": "main",
            "arguments": {"parameters": [{"name": "b", "value": "from-parameter"}]},
            "templates": [
                {
                    "name": "main",
                    "podSpecPatch": patch,
                    "container": {
                        "image": "x",
                        "command": ["python", "-c", PRINT],
                        "env": [{"name": "A", "value": "1"}, {"name": "C", "value": "3"}],
                    },
                }
            ],
        },
    }


@pytest.mark.parametrize(
    "patch",
    [
        '{"containers": [{"name": "main", "env": [{"name": "B", "value": "{{workflow.parameters.b}}"}, {"name": "A", "value": "2"}]}]}',
        # the pipeline's form (templates.gpu_patch): YAML, a merge key over the run's patch
        '<<: [{}, {"terminationGracePeriodSeconds": 9, "containers": [{"name": "main", "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "{{workflow.parameters.b}}"}]}]}]',
    ],
)  # fmt: skip
def test_the_env_of_a_pod_spec_patch_reaches_the_container(tmp_path, patch):
    result = run_workflow(
        _manifest(patch), workdir=str(tmp_path / "w"), stream=io.StringIO(), private_tmp=True
    )
    assert result.phase == "Succeeded", result.message
    assert result.node("patch")["outputs"]["result"] == "2 from-parameter"


def test_env_merges_by_name_and_other_containers_and_fields_are_left():
    container = {"env": [{"name": "A", "value": "1"}, {"name": "C", "value": "3"}]}
    patch = (
        '{"hostIPC": true, "containers": [{"name": "sidecar", "env": [{"name": "A", "value": "x"}]},'
        ' {"name": "main", "env": [{"name": "A", "value": "2"}, {"name": "D", "value": "4"}]}]}'
    )
    assert patched_env(container, patch) == [
        {"name": "A", "value": "2"},
        {"name": "C", "value": "3"},
        {"name": "D", "value": "4"},
    ]
    assert patched_env(container, "") == container["env"]
    assert (
        patched_env(container, '{"containers": [{"name": "main", "env": []}]}') == container["env"]
    )


@pytest.mark.parametrize(
    "patch, why",
    [
        ("[1", "podSpecPatch: not valid YAML/JSON"),
        ("[1]", "podSpecPatch: expected a mapping of Pod spec fields"),
        ('{"containers": {"name": "main"}}', "podSpecPatch: containers is a list"),
        ('{"containers": [{"name": "main", "env": [{"name": "A"}]}]}', "podSpecPatch: containers[main].env[0]"),
        ('{"containers": [{"name": "main", "env": [{"name": "A", "valueFrom": {}}]}]}', "podSpecPatch: containers[main].env[0]"),
    ],
)  # fmt: skip
def test_a_bad_patch_is_one_line(patch, why):
    with pytest.raises(ValueError) as err:
        patched_env({"env": []}, patch)
    assert str(err.value).startswith(why) and "\n" not in str(err.value), str(err.value)


def test_a_bad_patch_is_the_node_s_error(tmp_path):
    result = run_workflow(
        _manifest('{"containers": {"name": "main"}}'),
        workdir=str(tmp_path / "w"),
        stream=io.StringIO(),
    )
    assert result.phase in ("Error", "Failed")
    assert result.node("patch")["message"].startswith("podSpecPatch: containers is a list")
