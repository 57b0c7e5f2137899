"""`ckptflow run pipeline --local --isolate --cluster FILE --fail-node NODE@SECONDS` (issue 34):
the builders' local run takes the cluster model and its silent node losses, as `ckptflow run
FILE` does, with the same one-line usage errors (exit 2)."""

from __future__ import annotations

import pytest
from ckptflow.workflows import local
from ckptflow.workflows.runner import SpecError
from ckptflow.workflows.runner.nodelifecycle import FailNode, freezer_problem

PROFILE = """\
nodes:
- name: cpu-0
  allocatable: {cpu: "4", memory: 16Gi}
- name: gpu-1
  allocatable: {cpu: "2", memory: 8Gi, nvidia.com/gpu: "1"}
"""


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(PROFILE)
    return str(path)


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--fail-node", "gpu-1@3"], "add --cluster PROFILE"),
        (["--cluster", "{p}"], "add --isolate"),
        (["--isolate", "--cluster", "{p}", "--fail-node", "gpu-9@3"], "no node 'gpu-9'"),
        (["--isolate", "--cluster", "{p}", "--fail-node", "gpu-1@soon"], "is not a time"),
        (["--isolate", "--cluster", "{p}/nope"], "cannot read"),
    ],
)
def test_bad_cluster_options_are_one_line(tmp_path, capsys, profile, extra, says):
    argv = ["pretrain", "--local", "--runs-dir", str(tmp_path / "runs")]
    assert local.main([*argv, *(a.replace("{p}", profile) for a in extra)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ckptflow run: ") and says in err and "\n" not in err, err


@pytest.mark.skipif(freezer_problem() is not None, reason=f"{freezer_problem()}")
def test_the_cluster_and_its_failures_reach_the_runner(tmp_path, capsys, profile, monkeypatch):
    seen = {}

    def fake_run(manifest, **kwargs):
        seen.update(kwargs)
        raise SpecError("stopped here by the test")

    monkeypatch.setattr(local, "run_workflow", fake_run)
    monkeypatch.setattr(local, "_services", lambda stack, args, env: (None, None, None))
    argv = ["pretrain", "--local", "--isolate", "--cluster", profile, "--runs-dir", str(tmp_path)]
    assert local.main([*argv, "--fail-node", "gpu-1@30", "--name", "w"]) == local.REFUSED_EXIT
    assert [n.name for n in seen["cluster"].nodes] == ["cpu-0", "gpu-1"]
    assert seen["fail_nodes"] == [FailNode("gpu-1", 30.0)]
    assert "stopped here by the test" in capsys.readouterr().err
