"""`ckptflow run`: a manifest file goes to the local runner (exit code from the phase, 3 for a
refused manifest); a builder name with `--local` goes to `ckptflow.workflows.local`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ckptflow.run_cli import BUILDER_TARGETS, main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "workflows" / "fixtures" / "runner"


def test_cli_runs_a_file_and_maps_phase_to_exit_code(tmp_path):
    status = tmp_path / "status.json"
    cmd = [sys.executable, "-m", "ckptflow.cli", "run", str(FIXTURES / "steps.yaml"),
           "-p", "greeting=yo", "--workdir", str(tmp_path / "w"), "--status-file", str(status)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "TASK" in done.stdout and "Succeeded" in done.stdout
    assert "started" in done.stderr  # plain progress lines when not on a terminal
    assert status.exists()
    failing = [sys.executable, "-m", "ckptflow.cli", "run", str(FIXTURES / "fail-fast.yaml"),
               "--workdir", str(tmp_path / "f")]  # fmt: skip
    assert subprocess.run(failing, cwd=REPO, capture_output=True, timeout=60).returncode == 1
    refused = [sys.executable, "-m", "ckptflow.cli", "run", str(FIXTURES / "refused.yaml")]
    done = subprocess.run(refused, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "not in the cluster model" in done.stderr


def test_run_builder_name_reaches_the_local_runner_hook(capsys):
    assert main(["pipeline", "--set", "pretrain.rnks=2", "--local"]) == 2
    assert "did you mean pretrain.ranks" in capsys.readouterr().err


def test_run_cli_imports_neither_hera_nor_torch():
    code = "import sys, ckptflow.run_cli; print(sorted(m for m in ('hera', 'torch') if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr


def test_builder_targets_are_the_local_modes():
    from ckptflow.workflows.local import LOCAL_TARGETS

    assert BUILDER_TARGETS == LOCAL_TARGETS


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ckptflow.cli", "run", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_a_missing_file_or_a_bad_parameter_is_one_line_and_exit_3(tmp_path):
    done = _run(str(tmp_path / "nope.yaml"))
    assert done.returncode == 3
    assert done.stderr.strip() == (
        f"ckptflow run: {tmp_path / 'nope.yaml'}: no such manifest file "
        "(give a rendered Workflow YAML)"
    )
    done = _run(str(FIXTURES / "steps.yaml"), "-p", "greeting", "--workdir", str(tmp_path / "w"))
    assert done.returncode == 3
    assert done.stderr.strip() == "ckptflow run: -p 'greeting': expected NAME=VALUE"


def test_a_file_named_like_a_builder_is_run_as_a_file(tmp_path):
    (tmp_path / "pipeline").write_text((FIXTURES / "steps.yaml").read_text())
    done = _run("pipeline", "--workdir", str(tmp_path / "w"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Succeeded" in done.stdout


def test_help_names_both_kinds_of_target(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--template-file" in out and "ckptflow run pipeline --local -p" in out
    assert "-p NAME=VALUE" in out and "--shared-tmp" in out and "pipeline" in out


def test_artifact_repo_option_puts_artifacts_in_that_directory(tmp_path, capsys):
    manifest = tmp_path / "wf.yaml"
    manifest.write_text(
        "metadata: {name: arts}\n"
        "spec:\n  entrypoint: a\n  templates:\n  - name: a\n"
        "    container: {command: [sh, -c], args: ['echo x > /tmp/x']}\n"
        "    outputs: {artifacts: [{name: x, path: /tmp/x, s3: {key: out/x.tgz}}]}\n"
    )
    code = main([str(manifest), "--workdir", str(tmp_path / "w"),
                 "--artifact-repo", str(tmp_path / "repo")])  # fmt: skip
    assert code == 0, capsys.readouterr()
    assert (tmp_path / "repo" / "out" / "x.tgz").is_file()
    assert main([str(manifest), "--artifact-repo", "s3://"]) == 3
    assert "expected s3://BUCKET" in capsys.readouterr().err


def test_semaphore_options_give_the_limits(tmp_path, capsys):
    manifest = tmp_path / "wf.yaml"
    manifest.write_text(
        "metadata: {name: sem}\n"
        "spec:\n  entrypoint: a\n"
        "  synchronization: {semaphores: [{configMapKeyRef: {name: cm, key: wf}}]}\n"
        "  templates:\n  - name: a\n    container: {command: ['true']}\n"
    )
    base = [str(manifest), "--workdir", str(tmp_path / "w")]
    assert main(base) == 3
    assert "pass --semaphore cm/wf=N" in capsys.readouterr().err
    assert main([*base, "--semaphore", "cm/wf=2"]) == 0
    cm = tmp_path / "cm.yaml"
    cm.write_text("kind: ConfigMap\nmetadata: {name: cm}\ndata: {wf: '1'}\n")
    assert main([*base, "--semaphore-config", str(cm)]) == 0
    assert main([*base, "--semaphore", "cm/wf"]) == 3


def test_a_workflow_template_ref_runs_the_template_given_with_template_file(tmp_path):
    import yaml

    template = yaml.safe_load((FIXTURES / "steps.yaml").read_text())
    template["kind"] = "WorkflowTemplate"
    template["metadata"] = {"name": "greeter"}
    (tmp_path / "template.yaml").write_text(yaml.safe_dump(template))
    wf = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "greet-"},
        "spec": {
            "workflowTemplateRef": {"name": "greeter"},
            "arguments": {"parameters": [{"name": "greeting", "value": "hey"}]},
        },
    }
    (tmp_path / "wf.yaml").write_text(yaml.safe_dump(wf))
    done = _run(str(tmp_path / "wf.yaml"), "--template-file", str(tmp_path / "template.yaml"),
                "--workdir", str(tmp_path / "w"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "w" / "logs").rglob("*.log"))
    assert "hey1" in logs
    # Without the template: one line saying how to give it.
    done = _run(str(tmp_path / "wf.yaml"), "--workdir", str(tmp_path / "x"))
    assert done.returncode == 3 and "--template-file" in done.stderr
