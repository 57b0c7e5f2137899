"""Input and output artifacts (workflows/runner/artifacts.py): passing between steps and DAG
tasks, archives, subPath, optional, raw data, mode, s3.key, globalName, nested templates, and
what is refused."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.artifact_repo import DirRepository


def workflow(entry: str, *templates: dict, **spec) -> dict:
    return {"kind": "Workflow", "metadata": {"name": "wf"},
            "spec": {"entrypoint": entry, "templates": list(templates), **spec}}  # fmt: skip


def sh(name: str, script: str, **extra) -> dict:
    return {"name": name, "container": {"command": ["sh", "-c"], "args": [script]}, **extra}


def run(manifest: dict, tmp_path: Path, **kwargs):
    return run_workflow(
        manifest, workdir=str(tmp_path / "w"), name="wf", stream=io.StringIO(), **kwargs
    )


def out_art(name: str, path: str, **extra) -> dict:
    return {"outputs": {"artifacts": [{"name": name, "path": path, **extra}]}}


def in_art(name: str, path: str, **extra) -> dict:
    return {"inputs": {"artifacts": [{"name": name, "path": path, **extra}]}}


def passing(producer: dict, consumer: dict, ref: str = "out", **arg) -> dict:
    steps = {
        "name": "main",
        "steps": [
            [{"name": "make", "template": "make"}],
            [{"name": "use", "template": "use", "arguments": {"artifacts": [
                {"name": "in", "from": f"{{{{steps.make.outputs.artifacts.{ref}}}}}", **arg}]}}],
        ],
    }  # fmt: skip
    return workflow("main", steps, producer, consumer)


def result_of(result, name: str) -> str:
    return result.node(name)["outputs"]["result"]


def test_a_file_passes_between_steps_as_a_tgz(tmp_path):
    make = sh("make", "echo hello > /tmp/hello.txt", **out_art("out", "/tmp/hello.txt"))
    use = sh("use", "cat /tmp/message", **in_art("in", "/tmp/message"))
    result = run(passing(make, use), tmp_path)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result_of(result, "use") == "hello"
    saved = result.node("make")["outputs"]["artifacts"][0]
    key = saved["s3"]["key"]
    assert key == f"wf/{result.node('make')['id']}/out.tgz"
    assert (tmp_path / "w" / "artifacts" / key).read_bytes()[:2] == b"\x1f\x8b"  # gzip
    assert result.node("use")["inputs"]["artifacts"] == [
        {"name": "in", "path": "/tmp/message", "s3": {"key": key}}
    ]


def test_parallel_producers_of_the_same_path_do_not_collide(tmp_path):
    make = sh("make", "echo {{inputs.parameters.v}} > /tmp/o.txt",
              inputs={"parameters": [{"name": "v"}]}, **out_art("out", "/tmp/o.txt"))  # fmt: skip
    use = sh("use", "cat /tmp/a /tmp/b", inputs={"artifacts": [
        {"name": "a", "path": "/tmp/a"}, {"name": "b", "path": "/tmp/b"}]})  # fmt: skip
    dag = {"name": "main", "dag": {"tasks": [
        {"name": "A", "template": "make", "arguments": {"parameters": [{"name": "v", "value": "1"}]}},
        {"name": "B", "template": "make", "arguments": {"parameters": [{"name": "v", "value": "2"}]}},
        {"name": "C", "template": "use", "depends": "A && B", "arguments": {"artifacts": [
            {"name": "a", "from": "{{tasks.A.outputs.artifacts.out}}"},
            {"name": "b", "from": "{{tasks.B.outputs.artifacts.out}}"}]}},
    ]}}  # fmt: skip
    result = run(workflow("main", dag, make, use), tmp_path)
    assert result.phase == "Succeeded"
    assert result_of(result, "C") == "1\n2"


def test_archive_none_directory_and_sub_path(tmp_path):
    make = sh(
        "make", "mkdir -p /tmp/d/sub && echo x > /tmp/d/sub/f && echo y > /tmp/d/g",
        **out_art("out", "/tmp/d", archive={"none": {}}),
    )  # fmt: skip
    use = sh("use", "cat /tmp/in/f", **in_art("in", "/tmp/in"))
    result = run(passing(make, use, subPath="sub"), tmp_path)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result_of(result, "use") == "x"
    key = result.node("make")["outputs"]["artifacts"][0]["s3"]["key"]
    stored = tmp_path / "w" / "artifacts" / key
    assert (stored / "sub" / "f").read_text() == "x\n" and (stored / "g").is_file()


def test_archive_none_file_is_stored_raw_and_tar_sub_path(tmp_path):
    make = sh("make", "echo raw > /tmp/r.txt", **out_art("out", "/tmp/r.txt", archive={"none": {}}))
    use = sh("use", "cat /tmp/in", **in_art("in", "/tmp/in"))
    result = run(passing(make, use), tmp_path)
    key = result.node("make")["outputs"]["artifacts"][0]["s3"]["key"]
    assert (tmp_path / "w" / "artifacts" / key).read_text() == "raw\n"
    assert result_of(result, "use") == "raw"
    # a tar of a directory, narrowed with subPath
    make = sh("make", "mkdir -p /tmp/d && echo t > /tmp/d/t.txt",
              **out_art("out", "/tmp/d", archive={"tar": {"compressionLevel": 1}}))  # fmt: skip
    result = run(passing(make, use, subPath="t.txt"), tmp_path / "2")
    assert result.phase == "Succeeded" and result_of(result, "use") == "t"


def test_missing_outputs_optional_and_not(tmp_path):
    opt = sh("make", "true", **out_art("out", "/tmp/none.txt", optional=True))
    assert run(workflow("make", opt), tmp_path).phase == "Succeeded"
    must = sh("make", "true", **out_art("out", "/tmp/none.txt"))
    result = run(workflow("make", must), tmp_path / "2")
    assert result.phase == "Error"
    assert "artifact 'out'" in result.node("wf")["message"]
    assert "does not exist" in result.node("wf")["message"]


def test_optional_input_not_supplied_and_required_input_missing(tmp_path):
    use = sh("use", "test ! -e /tmp/in && echo absent", **in_art("in", "/tmp/in", optional=True))
    result = run(workflow("use", use), tmp_path)
    assert result.phase == "Succeeded" and result_of(result, "wf") == "absent"
    use = sh("use", "true", **in_art("in", "/tmp/in"))
    result = run(workflow("use", use), tmp_path / "2")
    assert result.phase == "Error"
    assert "inputs.artifacts.in was not supplied" in result.node("wf")["message"]


def test_raw_data_with_mode_runs_as_a_program(tmp_path):
    use = sh("use", "/bin/tool", **in_art("in", "/bin/tool", raw={"data": "#!/bin/sh\necho ran\n"}, mode=0o755))  # fmt: skip
    result = run(workflow("use", use), tmp_path)
    assert result.phase == "Succeeded", result.node("wf")
    assert result_of(result, "wf") == "ran"
    # the path is the node's own, not this machine's /bin
    assert not os.path.exists("/bin/tool")


def test_s3_key_output_and_input_in_the_given_repository(tmp_path):
    repo = DirRepository(str(tmp_path / "repo"))
    make = sh("make", "echo k > /mnt/file", **out_art("file", "/mnt/file", s3={"key": "my/file"}))
    use = sh("use", "cat /tmp/file", **in_art("file", "/tmp/file", s3={"key": "my/file"}))
    dag = {"name": "main", "dag": {"tasks": [{"name": "make", "template": "make"},
           {"name": "use", "template": "use", "depends": "make"}]}}  # fmt: skip
    result = run(workflow("main", dag, make, use), tmp_path, artifact_repository=repo)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert (tmp_path / "repo" / "my" / "file").is_file()
    assert result_of(result, "use") == "k"


def test_global_artifact_and_nested_templates_pass_artifacts_on(tmp_path):
    make = sh("make", "echo g > /tmp/g", **out_art("out", "/tmp/g", globalName="glob"))
    use = sh("use", "cat /tmp/in", **in_art("in", "/tmp/in"))
    inner = {
        "name": "inner",
        "inputs": {"artifacts": [{"name": "x"}]},
        "steps": [[{"name": "use", "template": "use", "arguments": {
            "artifacts": [{"name": "in", "from": "{{inputs.artifacts.x}}"}]}}]],
        "outputs": {"artifacts": [{"name": "relay", "from": "{{steps.use.outputs.artifacts.copy}}"}]},
    }  # fmt: skip
    use["outputs"] = {"artifacts": [{"name": "copy", "path": "/tmp/in"}]}
    main = {"name": "main", "steps": [
        [{"name": "make", "template": "make"}],
        [{"name": "nest", "template": "inner", "arguments": {
            "artifacts": [{"name": "x", "from": "{{workflow.outputs.artifacts.glob}}"}]}}],
        [{"name": "last", "template": "use", "arguments": {
            "artifacts": [{"name": "in", "from": "{{steps.nest.outputs.artifacts.relay}}"}]}}],
    ]}  # fmt: skip
    result = run(workflow("main", main, make, use, inner), tmp_path)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result_of(result, "last") == "g"
    assert result.node("nest")["outputs"]["artifacts"][0]["name"] == "relay"


def test_a_reference_to_a_skipped_step_errors_the_consumer(tmp_path):
    make = sh("make", "echo x > /tmp/x", **out_art("out", "/tmp/x"))
    use = sh("use", "cat /tmp/in", **in_art("in", "/tmp/in"))
    manifest = passing(make, use)
    manifest["spec"]["templates"][0]["steps"][0][0]["when"] = "a == b"
    result = run(manifest, tmp_path)
    assert result.node("use")["phase"] == "Error"
    assert "failed to resolve {{steps.make.outputs.artifacts.out}}" in result.node("use")["message"]


@pytest.mark.parametrize(
    ("artifact", "field", "why"),
    [
        ({"http": {"url": "https://x"}}, "artifacts.a.http", "fetched from outside"),
        ({"s3": {"bucket": "b", "key": "k"}}, "artifacts.a.s3", "only s3.key works"),
        ({"git": {"repo": "r"}}, "artifacts.a.git", "fetched from outside"),
        ({"archive": {"zip": {}}}, "artifacts.a.archive", "only archive none or tar"),
    ],
)
def test_refused_artifacts_name_the_field(tmp_path, artifact, field, why):
    side = "outputs" if "archive" in artifact else "inputs"
    tmpl = sh("t", "true", **{side: {"artifacts": [{"name": "a", "path": "/tmp/a", **artifact}]}})
    with pytest.raises(SpecError, match=f"template 't' {side}: {field}: .*{why}"):
        run(workflow("t", tmpl), tmp_path)


def test_a_from_expression_that_does_not_parse_is_refused(tmp_path):
    tmpl = {"name": "m", "steps": [[{"name": "a", "template": "t"}]],
            "outputs": {"artifacts": [{"name": "r", "fromExpression": "steps.a.outputs.("}]}}  # fmt: skip
    with pytest.raises(SpecError, match=r"artifacts.r.fromExpression: expression"):
        run(workflow("m", tmpl, sh("t", "true")), tmp_path)


def test_status_file_lists_the_saved_artifacts(tmp_path):
    make = sh("make", "echo x > /tmp/x", **out_art("out", "/tmp/x"))
    result = run(workflow("make", make), tmp_path)
    doc = json.loads(Path(result.status_file).read_text())
    node = doc["status"]["nodes"]["wf"]
    assert node["outputs"]["artifacts"][0]["s3"]["key"].endswith("/out.tgz")


def test_map_reduce_directory_keys_and_an_output_directory_the_program_creates(tmp_path):
    # Argo's map-reduce idiom: `os.mkdir("/mnt/out")` then files in it, saved under `parts/`
    assert not os.path.exists("/mnt/out-ckptflow")
    split = sh("split", "mkdir /mnt/out-ckptflow && echo 1 > /mnt/out-ckptflow/a && echo 2 > /mnt/out-ckptflow/b",
               **out_art("parts", "/mnt/out-ckptflow", archive={"none": {}}, s3={"key": "{{workflow.name}}/parts/"}))  # fmt: skip
    one = sh("one", "mkdir /mnt/res-ckptflow && cat /mnt/in/x > /mnt/res-ckptflow/r",
             inputs={"parameters": [{"name": "p"}],
                     "artifacts": [{"name": "x", "path": "/mnt/in/x",
                                    "s3": {"key": "{{workflow.name}}/parts/{{inputs.parameters.p}}"}}]},
             **out_art("r", "/mnt/res-ckptflow/r", archive={"none": {}},
                       s3={"key": "{{workflow.name}}/results/{{inputs.parameters.p}}"}))  # fmt: skip
    total = sh(
        "total",
        "cat /mnt/all/a /mnt/all/b",
        **in_art("all", "/mnt/all", s3={"key": "{{workflow.name}}/results"}),
    )
    dag = {"name": "main", "dag": {"tasks": [
        {"name": "split", "template": "split"},
        {"name": "map", "template": "one", "depends": "split", "withItems": ["a", "b"],
         "arguments": {"parameters": [{"name": "p", "value": "{{item}}"}]}},
        {"name": "reduce", "template": "total", "depends": "map"},
    ]}}  # fmt: skip
    result = run(workflow("main", dag, split, one, total), tmp_path)
    assert result.phase == "Succeeded", result.status["status"]["nodes"]
    assert result_of(result, "reduce") == "1\n2"
    assert not os.path.exists("/mnt/out-ckptflow") and not os.path.exists("/mnt/res-ckptflow")
    assert (tmp_path / "w" / "artifacts" / "wf" / "parts" / "a").read_text() == "1\n"


def test_output_parameter_path_placeholder(tmp_path):
    tmpl = sh("p", "echo 7 > {{outputs.parameters.n.path}}",
              outputs={"parameters": [{"name": "n", "valueFrom": {"path": "/tmp/n.txt"}}]})  # fmt: skip
    result = run(workflow("p", tmpl), tmp_path)
    assert result.phase == "Succeeded"
    assert result.node("wf")["outputs"]["parameters"][0]["value"] == "7\n"
