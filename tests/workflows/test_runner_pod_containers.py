"""Sidecars and init containers in `--isolate` pods (workflows/runner/pod_containers.py,
pods/podinit.py run_containers), as Argo builds the pod (workflow/controller/workflowpod.go)
and ends its sidecars (workflow/executor/executor.go KillSidecars), on small manifests."""

from __future__ import annotations

import io
import time

import pytest
from ckptflow.workflows.runner import SpecError, run_workflow
from ckptflow.workflows.runner.pod_containers import container_specs, problems, volume_mounts


def _pods_or_skip() -> None:
    from ckptflow.workflows.runner.pods import available

    why = available()
    if why is not None:
        pytest.skip(f"pods unavailable: {why}")


def _wf(tmpl_extra: dict, main_cmd: list[str], mounts=None) -> dict:
    container = {"command": main_cmd}
    if mounts:
        container["volumeMounts"] = mounts
    return {
        "metadata": {"name": "pc"},
        "spec": {
            "entrypoint": "main",
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "templates": [{"name": "main", "container": container, **tmpl_extra}],
        },
    }


def _run(wf: dict, tmp_path, **kw):
    return run_workflow(wf, workdir=str(tmp_path / "w"), stream=io.StringIO(), **kw)


def _pod(result) -> dict:
    (pod,) = [n for n in result.nodes.values() if n["type"] == "Pod"]
    return pod


MOUNT = [{"name": "shared", "mountPath": "/shared"}]


def test_a_sidecar_shares_the_pods_volume_and_network_and_stops_with_it(tmp_path):
    _pods_or_skip()
    sidecar = {
        "name": "helper",
        "command": ["sh", "-c", "echo noise; echo $$ > /shared/sidecar.pid; hostname -i > "
                    "/shared/ip; exec sleep 60"],
        "volumeMounts": MOUNT,
    }  # fmt: skip
    main = [
        "sh",
        "-c",
        "while [ ! -s /shared/ip ]; do sleep 0.1; done; cat /shared/ip",
    ]
    t0 = time.monotonic()
    result = _run(_wf({"sidecars": [sidecar]}, main, MOUNT), tmp_path, isolate=True)
    assert result.phase == "Succeeded", result.message
    assert time.monotonic() - t0 < 30  # not the sidecar's 60 s
    pod = _pod(result)
    assert "noise" not in pod["outputs"]["result"]  # a sidecar's stdout is not the result
    assert pod["outputs"]["result"].split()[0] == pod["podIP"]  # one network: the pod's


def test_the_pods_outcome_is_the_main_containers(tmp_path):
    _pods_or_skip()
    sidecar = {"name": "s", "command": ["sleep", "60"]}
    result = _run(_wf({"sidecars": [sidecar]}, ["sh", "-c", "exit 3"]), tmp_path, isolate=True)
    assert result.phase == "Failed"
    assert _pod(result)["message"] == "Error (exit code 3)"


def test_init_containers_run_in_order_before_the_main_one(tmp_path):
    _pods_or_skip()
    inits = [
        {"name": "one", "command": ["sh", "-c", "echo one >> /shared/order"], "volumeMounts": MOUNT},
        {"name": "two", "command": ["sh", "-c", "echo two >> /shared/order"], "mirrorVolumeMounts": True},
    ]  # fmt: skip
    result = _run(
        _wf({"initContainers": inits}, ["sh", "-c", "echo main >> /shared/order; cat /shared/order"], MOUNT),
        tmp_path,
        isolate=True,
    )  # fmt: skip
    assert result.phase == "Succeeded", result.message
    assert _pod(result)["outputs"]["result"].split() == ["one", "two", "main"]


def test_a_failing_init_container_fails_the_pod_and_the_main_one_never_runs(tmp_path):
    _pods_or_skip()
    marker = tmp_path / "main-ran"
    inits = [{"name": "bad", "command": ["sh", "-c", "exit 4"]}]
    wf = _wf({"initContainers": inits}, ["touch", str(marker)])
    result = _run(wf, tmp_path, isolate=True)
    assert result.phase == "Failed"
    assert _pod(result)["message"] == "Error (exit code 4)"
    assert not marker.exists()
    log = (tmp_path / "w" / "logs").glob("*.log")
    assert "init container bad failed (exit code 4)" in "".join(p.read_text() for p in log)


def test_without_isolate_sidecars_are_refused_naming_the_fix(tmp_path):
    wf = _wf({"sidecars": [{"name": "s", "command": ["true"]}]}, ["true"])
    with pytest.raises(SpecError, match=r"sidecars: sidecars need a pod: run with --isolate"):
        _run(wf, tmp_path)


def test_what_a_pod_cannot_run_is_refused_before_it_starts():
    env = {"PATH": "/usr/bin:/bin"}
    bad = [
        {"name": "a", "image": "nginx"},
        {"name": "b", "command": ["true"], "env": [{"name": "X", "valueFrom": {"secretKeyRef": {}}}]},
        {"name": "c", "command": ["no-such-tool-here"]},
        {"name": "d", "command": ["true"], "lifecycle": {}},
    ]  # fmt: skip
    fields = [f for f, _ in problems("sidecars", bad, env)]
    assert fields == [
        "sidecars.a.command",
        "sidecars.b.env.X",
        "sidecars.c command 'no-such-tool-here'",
        "sidecars.d.lifecycle",
    ]
    assert problems("sidecars", {"name": "x"}, env) == [
        ("sidecars", "expected a list of containers")
    ]


def test_an_undeclared_sidecar_volume_is_refused(tmp_path):
    _pods_or_skip()
    sidecar = {
        "name": "s",
        "command": ["true"],
        "volumeMounts": [{"name": "nope", "mountPath": "/x"}],
    }
    with pytest.raises(SpecError, match="sidecars.volumeMounts: no volume"):
        _run(_wf({"sidecars": [sidecar]}, ["true"]), tmp_path, isolate=True)


def test_each_container_has_its_own_env_and_the_pod_all_mounts():
    body = {
        "container": {"command": ["x"], "env": [{"name": "MAIN", "value": "1"}], "volumeMounts": MOUNT},
        "sidecars": [{"name": "s", "command": ["python", "-V"], "env": [{"name": "MINE", "value": "2"}],
                      "volumeMounts": [{"name": "other", "mountPath": "/o"}]}],
    }  # fmt: skip
    specs = container_specs(body, {"PATH": "/bin", "MAIN": "1"}, "/work", 3.0)
    (s,) = specs["sidecars"]
    assert s["env"] == {"PATH": "/bin", "MINE": "2"} and s["cwd"] == "/work"
    assert s["argv"][1:] == ["-V"] and s["argv"][0].endswith("python")
    assert "init" not in specs and specs["grace"] == 3.0
    assert [m["mountPath"] for m in volume_mounts(body)] == ["/shared", "/o"]
    body["sidecars"][0]["volumeMounts"] = [{"name": "other", "mountPath": "/shared"}]
    with pytest.raises(ValueError, match="two containers mount different volumes"):
        volume_mounts(body)
