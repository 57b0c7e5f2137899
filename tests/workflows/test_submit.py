"""`ckptflow submit` against a fake Argo Server: a local HTTP server speaking the REST API.

The fake records each request, answers a create with the object plus a generated name, and
answers polls from a scripted phase sequence, so `--wait` and the exit codes are exercised
end to end through hera's real WorkflowsService (no cluster).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ckptflow.workflows.parameters import FINETUNE
from ckptflow.workflows.submit import argo_connection
from ckptflow.workflows.submit import main as submit_main
from hera.shared import global_config

from tests.workflows.argo_schema import errors


class FakeArgo:
    """An Argo Server stand-in: records requests, scripts workflow phases."""

    def __init__(self, phases=("Running", "Succeeded")):
        self.requests: list[dict] = []
        self.phases = list(phases)
        self.objects: dict[str, dict] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append(
                    {
                        "method": "POST",
                        "path": self.path,
                        "body": body,
                        "auth": self.headers.get("Authorization"),
                    }
                )
                obj = next(iter(v for k, v in body.items() if isinstance(v, dict) and "spec" in v))
                meta = obj.setdefault("metadata", {})
                meta.setdefault("name", meta.get("generateName", "wf-") + "abc12")
                fake.objects[meta["name"]] = obj
                self._reply(200, obj)

            def do_PUT(self):
                self.do_POST()

            def do_GET(self):
                fake.requests.append(
                    {"method": "GET", "path": self.path, "auth": self.headers.get("Authorization")}
                )
                name = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
                if name not in fake.objects:
                    self._reply(404, {"code": 5, "message": f"{name} not found"})
                    return
                obj = dict(fake.objects[name])
                if "/api/v1/workflows/" in self.path:
                    phase = fake.phases.pop(0) if len(fake.phases) > 1 else fake.phases[0]
                    obj["status"] = {
                        "phase": phase,
                        "progress": "1/2",
                        "message": "boom" if phase == "Failed" else None,
                    }
                self._reply(200, obj)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _clean_argo_env(monkeypatch):
    for var in ("ARGO_SERVER", "ARGO_TOKEN", "ARGO_SECURE", "ARGO_INSECURE_SKIP_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(global_config, "host", None)
    monkeypatch.setattr(global_config, "_token", None)


def test_submit_posts_the_rendered_workflow_and_waits_for_success(monkeypatch, capsys):
    monkeypatch.setenv("ARGO_TOKEN", "s3cr3t-token")
    with FakeArgo(phases=("Pending", "Running", "Succeeded")) as argo:
        rc = submit_main(
            ["pipeline", "--host", argo.url, "--namespace", "ml", "--wait", "--poll", "0.01",
             "--set", "pretrain.ranks=3"]
        )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    post = argo.requests[0]
    assert post["method"] == "POST" and post["path"] == "/api/v1/workflows/ml"
    assert post["auth"] == "Bearer s3cr3t-token"
    wf = post["body"]["workflow"]
    assert wf["metadata"]["namespace"] == "ml"
    assert errors(wf) == []
    rank = next(t for t in wf["spec"]["templates"] if t["name"] == "pretrain")
    task = next(t for t in rank["dag"]["tasks"] if t["name"] == "rank")
    assert task["withSequence"] == {"count": "{{workflow.parameters.ranks}}"}
    args = {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}
    assert args["ranks"] == "3"
    assert "Workflow ckptflow-abc12 submitted to ml" in out
    assert f"{argo.url}/workflows/ml/ckptflow-abc12" in out
    assert "Running" in out and "Succeeded" in out
    assert "s3cr3t-token" not in out
    polls = [r for r in argo.requests if r["method"] == "GET"]
    assert len(polls) == 3 and all(
        r["path"].startswith("/api/v1/workflows/ml/ckptflow-abc12") for r in polls
    )


def test_failed_workflow_phase_is_the_exit_code(capsys):
    with FakeArgo(phases=("Running", "Failed")) as argo:
        rc = submit_main(["pretrain", "--host", argo.url, "--wait", "--poll", "0.01"])
    assert rc == 1
    assert "Failed" in capsys.readouterr().out
    with FakeArgo(phases=("Error",)) as argo:
        assert submit_main(["pretrain", "--host", argo.url, "--wait", "--poll", "0.01"]) == 2


def test_without_wait_it_returns_after_submitting(capsys):
    with FakeArgo() as argo:
        assert (
            submit_main(["finetune", "--host", argo.url, "--set", "finetune.base_root=s3://b/r"])
            == 0
        )
    assert [r["method"] for r in argo.requests] == ["POST"]
    params = argo.requests[0]["body"]["workflow"]["spec"]["arguments"]["parameters"]
    assert params[0] == {
        "name": "base_root",
        "value": "s3://b/r",
        "description": "the pretraining run root to fine-tune from (its ckpt/ below)",
    }
    assert [p["name"] for p in params[1:]] == [k.name for k in FINETUNE]


def test_cron_workflow_and_template_are_created_or_updated(monkeypatch, capsys):
    monkeypatch.setenv("ARGO_SERVER", "127.0.0.1:1")  # --host wins over the environment
    with FakeArgo() as argo:
        assert submit_main(["retention", "--host", argo.url]) == 0
        assert submit_main(["retention", "--host", argo.url]) == 0  # exists now: update
        assert submit_main(["evaluate", "--host", argo.url]) == 0
    calls = [(r["method"], r["path"].split("?")[0]) for r in argo.requests]
    assert calls == [
        ("GET", "/api/v1/cron-workflows/ckptflow/ckptflow-retention"),
        ("POST", "/api/v1/cron-workflows/ckptflow"),
        ("GET", "/api/v1/cron-workflows/ckptflow/ckptflow-retention"),
        ("POST", "/api/v1/cron-workflows/ckptflow/ckptflow-retention"),
        ("GET", "/api/v1/workflow-templates/ckptflow/ckptflow-evaluate"),
        ("POST", "/api/v1/workflow-templates/ckptflow"),
    ]
    cron = argo.requests[1]["body"]["cronWorkflow"]
    assert cron["spec"]["schedules"] == ["17 * * * *"] and errors(cron) == []
    out = capsys.readouterr().out
    assert f"{argo.url}/cron-workflows/ckptflow/ckptflow-retention" in out
    assert "kubectl apply" in out  # the Argo Events half of `evaluate`


def test_unreachable_server_is_a_clear_error(capsys):
    """A refused connection said "http://127.0.0.1:9 refused the Workflow", as if the server
    had answered and said no (issue 38, point 13): it names the URL and the fix, in one line."""
    assert submit_main(["pipeline", "--host", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "could not reach the Argo Server at http://127.0.0.1:9" in err, err
    assert "refused the" not in err and "--host" in err and "port-forward" in err
    assert err.count("\n") == 1, err


def test_a_server_that_answers_no_is_told_apart_from_one_not_reached(capsys):
    with FakeArgo(phases=("Pending",)) as argo:
        argo.server.RequestHandlerClass.do_POST = lambda self: self._reply(
            403, {"code": 7, "message": "not allowed"}
        )
        assert submit_main(["pipeline", "--host", argo.url]) == 2
    err = capsys.readouterr().err
    assert f"{argo.url} refused the Workflow" in err and "--token" in err, err


def test_token_option_is_sent_and_wins_over_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("ARGO_TOKEN", "from-env")
    with FakeArgo(phases=("Succeeded",)) as argo:
        assert submit_main(["pipeline", "--host", argo.url, "--token", "from-flag"]) == 0
    assert argo.requests[0]["auth"] == "Bearer from-flag"
    out = capsys.readouterr()
    assert "from-flag" not in out.out + out.err
    assert argo_connection(None, "https://d:2746", token="Bearer x")["token"] == "Bearer x"


def test_connection_follows_hera_then_argo_cli_conventions(monkeypatch):
    assert argo_connection(None, "https://default:2746")["host"] == "https://default:2746"
    monkeypatch.setenv("ARGO_SERVER", "argo.example:2746")
    monkeypatch.setenv("ARGO_TOKEN", "t")
    conn = argo_connection(None, "https://default:2746")
    assert conn == {"host": "https://argo.example:2746", "token": "t", "verify_ssl": None}
    monkeypatch.setenv("ARGO_SECURE", "false")
    monkeypatch.setenv("ARGO_INSECURE_SKIP_VERIFY", "true")
    conn = argo_connection(None, "https://default:2746")
    assert conn["host"] == "http://argo.example:2746" and conn["verify_ssl"] is False
    monkeypatch.setattr(global_config, "host", "https://hera-configured:443")
    monkeypatch.setattr(global_config, "_token", "from-hera")
    conn = argo_connection(None, "https://default:2746")
    assert conn["host"] == "https://hera-configured:443" and conn["token"] == "from-hera"


def test_builders_submit_from_python_with_hera_global_config(monkeypatch):
    """What the README shows: configure hera once, then `build_pipeline(cfg).create()`."""
    from ckptflow.workflows.config import PipelineConfig
    from ckptflow.workflows.pipeline import build_pipeline

    with FakeArgo() as argo:
        monkeypatch.setattr(global_config, "host", argo.url)
        monkeypatch.setattr(global_config, "_token", "py-token")
        created = build_pipeline(PipelineConfig()).create()
    assert created.metadata.name == "ckptflow-abc12"
    post = argo.requests[0]
    assert post["path"] == "/api/v1/workflows/ckptflow" and post["auth"] == "Bearer py-token"


def test_template_is_installed_and_a_run_references_it(capsys):
    with FakeArgo() as argo:
        assert submit_main(["pipeline", "--host", argo.url, "--template"]) == 0
        rc = submit_main(
            ["pipeline", "--host", argo.url, "--from-template", "-p", "ranks=4", "-p", "mode=max"]
        )
        assert rc == 0
    calls = [(r["method"], r["path"].split("?")[0]) for r in argo.requests]
    assert calls == [
        ("GET", "/api/v1/workflow-templates/ckptflow/ckptflow-pipeline"),
        ("POST", "/api/v1/workflow-templates/ckptflow"),
        ("POST", "/api/v1/workflows/ckptflow"),
    ]
    template = argo.requests[1]["body"]["template"]
    assert template["kind"] == "WorkflowTemplate" and errors(template) == []
    wf = argo.requests[2]["body"]["workflow"]
    assert wf["spec"]["workflowTemplateRef"] == {"name": "ckptflow-pipeline"}
    assert wf["spec"]["arguments"]["parameters"] == [
        {"name": "ranks", "value": "4"},
        {"name": "mode", "value": "max"},
    ]
    assert errors(wf) == []


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["pipeline", "-p", "ranks=-1"], "-p ranks=-1: must be at least 1"),
        (["pipeline", "--from-template", "-p", "metrc=x"], "did you mean metric?"),
        (["pipeline", "--set", "platform.pod_gc=Sometimes"], "not one of"),
        (["pipeline", "--poll", "-1"], "--poll"),
        (["pipeline", "--timeout", "soon"], "--timeout"),
        (["pipeline", "--host", "argo:2746"], "give a URL"),
    ],
)
def test_submit_refuses_bad_input_in_one_line_before_contacting_the_server(argv, phrase, capsys):
    assert submit_main(argv) == 2
    err = capsys.readouterr().err
    assert phrase in err and err.count("\n") == 1 and "Traceback" not in err
