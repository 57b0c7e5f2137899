"""The local checkpoint tier on the rank pods (issue 35, workflows/local_tier.py): the settings
reach the rank command, the volume is rendered only when the tier is on, NODE_NAME comes from
the downward API, hostPath leaves the restricted Pod Security Standard (emptyDir does not), and
settings that cannot work are one line naming the setting, exit 2, at render, submit and
`run --local`."""

from __future__ import annotations

import pytest
from ckptflow.workflows.config import ConfigError, PipelineConfig, apply_overrides, validate
from ckptflow.workflows.local import main as local_main
from ckptflow.workflows.render import main as render_main
from ckptflow.workflows.render import manifests
from ckptflow.workflows.runner.pss import restricted_violations
from ckptflow.workflows.submit import main as submit_main

from tests.workflows.argo_schema import errors

ON = ("pretrain.local_every=5", "pretrain.replicas=1", "platform.local_volume_size=2Gi")


def render(name: str, *overrides: str) -> dict:
    return manifests(name, apply_overrides(PipelineConfig(), overrides))[0]


def templates(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["spec"]["templates"]}


def local_volumes(tmpl: dict) -> list[dict]:
    return [v for v in tmpl.get("volumes") or [] if v["name"] == "ckpt-local"]


def args_of(tmpl: dict) -> list[str]:
    return [str(a) for a in tmpl["container"]["args"]]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("name", ["pretrain", "pipeline"])
def test_off_by_default_no_volume_and_no_local_arguments(name):
    for tmpl in templates(render(name)).values():
        assert not local_volumes(tmpl), tmpl["name"]
        if "container" in tmpl:
            assert not any(a.startswith("--local") or a == "--replicas" for a in args_of(tmpl))


@pytest.mark.parametrize("name", ["pretrain", "pipeline"])
def test_on_the_rank_pod_gets_its_volume_at_local_dir_and_the_arguments(name):
    doc = render(name, *ON, "pretrain.local_keep=3")
    assert errors(doc) == []
    ts = templates(doc)
    rank = ts["pretrain-rank"]
    assert local_volumes(rank) == [
        {"name": "ckpt-local", "emptyDir": {"sizeLimit": "2Gi"}},
    ]
    mounts = rank["container"]["volumeMounts"]
    assert {"name": "ckpt-local", "mountPath": "/ckpt-local"} in mounts
    args = args_of(rank)
    assert flag(args, "--local-every") == "5" and flag(args, "--replicas") == "1"
    assert flag(args, "--local-keep") == "3"
    assert flag(args, "--local-size-mib") == "2048"  # from platform.local_volume_size
    # the default folder too: the local runner maps a mount path only where it is written
    assert flag(args, "--local-dir") == "/ckpt-local"
    # only the ranks save locally: no other pod gets the volume
    others = [t for n, t in ts.items() if n != "pretrain-rank" and local_volumes(t)]
    assert others == []


def test_local_dir_moves_the_mount_and_the_argument_together():
    rank = templates(render("pretrain", "pretrain.local_every=2", "pretrain.local_dir=/nvme/ck"))[
        "pretrain-rank"
    ]
    assert {"name": "ckpt-local", "mountPath": "/nvme/ck"} in rank["container"]["volumeMounts"]
    assert flag(args_of(rank), "--local-dir") == "/nvme/ck"
    assert local_volumes(rank) == [{"name": "ckpt-local", "emptyDir": {}}]
    assert "--local-size-mib" not in args_of(rank)  # no size: the volume's free space


def test_memory_medium_and_host_path_render_as_kubernetes_volumes():
    memory = templates(
        render(
            "pretrain",
            "pretrain.local_every=5",
            "platform.local_volume_medium=Memory",
            "platform.local_volume_size=256Mi",
        )  # fmt: skip
    )["pretrain-rank"]
    assert local_volumes(memory) == [
        {"name": "ckpt-local", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}}
    ]
    host = templates(
        render(
            "pretrain",
            "pretrain.local_every=5",
            "platform.local_volume=hostPath",
            "platform.local_host_path=/mnt/nvme/ckptflow",
        )  # fmt: skip
    )["pretrain-rank"]
    assert local_volumes(host) == [
        {"name": "ckpt-local", "hostPath": {"path": "/mnt/nvme/ckptflow", "type": "Directory"}}
    ]


def test_rank_pods_get_node_name_from_the_downward_api():
    rank = templates(render("pretrain"))["pretrain-rank"]
    env = {e["name"]: e for e in rank["container"]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_empty_dir_keeps_the_rank_pod_restricted_host_path_does_not_and_render_says_so(
    capsys, tmp_path
):
    for overrides, clean in ((ON, True), ((*ON, "platform.local_volume=hostPath"), False)):
        doc = render("pretrain", *overrides)
        why = restricted_violations(templates(doc)["pretrain-rank"], doc["spec"])
        assert (why == []) is clean, why
        if not clean:
            assert any("hostPath volumes (ckpt-local)" in w for w in why), why
    out = tmp_path / "p.yaml"
    argv = ["pretrain", "-o", str(out)]
    assert render_main([*argv, *(x for o in ON for x in ("--set", o))]) == 0
    assert "Pod Security" not in capsys.readouterr().err
    host = ("--set", "platform.local_volume=hostPath")
    assert render_main([*argv, *(x for o in ON for x in ("--set", o)), *host]) == 0
    err = capsys.readouterr().err
    assert "platform.local_volume=hostPath" in err and "Pod Security" in err


BAD = [
    (("pretrain.local_every=5", "pretrain.replicas=2"), "--set pretrain.replicas=2: ", "at most 1"),
    (("pretrain.replicas=1",), "--set pretrain.replicas=1: ", "pretrain.local_every"),
    (("platform.local_volume_size=8Gx",), "--set platform.local_volume_size=8Gx: ", "quantity"),
    (("platform.local_volume_size=100",), "--set platform.local_volume_size=100: ", "1 MiB"),
    (("platform.local_volume=nfs",), "--set platform.local_volume=nfs: ", "emptyDir, hostPath"),
    (("platform.local_volume_medium=Disk",), "--set platform.local_volume_medium=Disk: ", "Memory"),
    (
        ("platform.local_volume_medium=Memory", "platform.local_volume_size=1Gi"),
        "--set platform.local_volume_size=1Gi: ", "pretrain.rank_resources.memory=1536Mi",
    ),  # 1 GiB of local tier + 1 GiB of /dev/shm > 1536 MiB
    (
        ("platform.local_volume_medium=Memory", "platform.local_volume_size=2Gi"),
        "--set platform.local_volume_size=2Gi: ", "pretrain.rank_resources.memory=1536Mi",
    ),  # above the limit alone (run --local has no /dev/shm volume)
    (("platform.local_volume_medium=Memory",), "--set platform.local_volume_medium=Memory: ",
     "needs platform.local_volume_size"),
    (
        ("platform.local_volume_medium=Memory", "platform.local_volume=hostPath",
         "platform.local_volume_size=1Mi"),
        "--set platform.local_volume_medium=Memory: ", "only an emptyDir",
    ),
    (("pretrain.local_dir=ckpt",), "--set pretrain.local_dir=ckpt: ", "absolute"),
    (("pretrain.local_dir=/tmp",), "--set pretrain.local_dir=/tmp: ", "hide the pod's own /tmp"),
    (("platform.local_host_path=/var/../etc",), "--set platform.local_host_path=/var/../etc: ",
     "without '..'"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "start", "why"), BAD, ids=[b[1] for b in BAD])
def test_a_local_tier_setting_that_cannot_work_is_one_line_naming_it(overrides, start, why):
    cfg = apply_overrides(PipelineConfig(), overrides)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    text = str(info.value)
    assert text.startswith(start) and why in text and "\n" not in text, text


def _argv(overrides) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


@pytest.mark.parametrize("case", [BAD[0], BAD[2], BAD[7]], ids=lambda c: c[1])
def test_render_submit_and_run_local_refuse_it_with_exit_2(case, capsys, tmp_path):
    overrides, start, _ = case
    out = tmp_path / "p.yaml"
    assert render_main(["pretrain", *_argv(overrides), "-o", str(out)]) == 2
    assert not out.exists()
    assert submit_main(["pipeline", *_argv(overrides)]) == 2
    runs = tmp_path / "runs"
    assert local_main(["pipeline", "--local", *_argv(overrides), "--runs-dir", str(runs)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(start.strip() in line for line in lines), lines
    assert not list(runs.glob("*/workflow.yaml"))  # nothing was started


def test_a_run_with_too_few_ranks_for_its_replicas_is_one_line(capsys):
    on = _argv(("pretrain.local_every=5", "pretrain.replicas=2", "pretrain.ranks=4"))
    assert render_main(["pretrain", *on, "-p", "ranks=3", "-o", "/dev/null"]) == 0
    capsys.readouterr()
    assert render_main(["pretrain", *on, "-p", "ranks=2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "-p ranks=2: pretrain.replicas=2" in line and "at least 3" in line, line
