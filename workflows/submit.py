"""`ckptflow submit NAME [--wait] [--namespace NS] [--host URL] [--set key=value ...] [-p NAME=VALUE ...] [--template | --from-template]`.

`--template` installs (creates or updates) NAME's WorkflowTemplate; `--from-template` submits a
Workflow running the installed one (`workflowTemplateRef`) with the `-p` values.

Submits through hera's `WorkflowsService` (the Argo Server's REST API), prints the name and
the Argo UI link and, with `--wait`, follows a Workflow to completion: exit code 0 when it
Succeeded, 1 when it Failed, 2 on Error, 3 when it was still running at `--timeout`.

Connection settings follow hera first, then the Argo CLI's environment variables:
host = `--host`, else `hera.shared.global_config.host`, else `ARGO_SERVER` (host:port;
`https` unless `ARGO_SECURE=false`), else `platform.argo_ui`. Token = `--token`, else hera's
`global_config.token`, else `ARGO_TOKEN` (hera adds `Bearer ` when missing). TLS: hera's
`global_config.verify_ssl`, turned off by `ARGO_INSECURE_SKIP_VERIFY=true`. The Argo CLI's
variables are read by ckptflow.env (`argo_client`). The token is never printed.

A server that cannot be reached (refused, unknown host, TLS, timeout) and one that answers
no (HTTP 401/403/404/409...) are told apart by the exception's type, each with its own fix.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import requests
from ckptflow.workflows.config import ConfigError, PipelineConfig
from ckptflow.workflows.parameters import parse_pairs
from ckptflow.workflows.render import add_common_args, builder, config, manifests
from hera.exceptions import HeraException
from hera.shared import global_config
from hera.workflows import CronWorkflow, Workflow, WorkflowsService, WorkflowTemplate

from ckptflow import env
from ckptflow.contract import cli_args

PHASE_EXIT = {"Succeeded": 0, "Failed": 1, "Error": 2}
STILL_RUNNING = 3


def argo_connection(host: str | None, default_host: str, token: str | None = None) -> dict:
    """host, token and verify_ssl for WorkflowsService: the options, then hera's settings,
    then the Argo CLI's variables (ckptflow.env.argo_client)."""
    argo = env.argo_client()
    server = argo["server"]
    if not host and global_config.host:
        host = global_config.host
    if not host and server:
        host = server if "://" in server else f"{'https' if argo['secure'] else 'http'}://{server}"
    host = (host or default_host).rstrip("/")
    if "://" not in host:
        raise ConfigError(f"--host {host!r}: give a URL such as http://localhost:2746")
    token = token or global_config.token or argo["token"]
    return {"host": host, "token": token, "verify_ssl": False if argo["skip_verify"] else None}


def submit_error(exc: BaseException, host: str, kind: str) -> str:
    """One line for a failed submission, by the exception's type: not reached (no answer)
    or refused (the server answered no), each naming its fix."""
    if isinstance(exc, HeraException):  # the server answered with an HTTP error
        return (
            f"{host} refused the {kind}: {str(exc).strip()[:300]}; check --token/ARGO_TOKEN "
            "(the server's auth mode) and that the namespace exists"
        )
    why = "did not answer in time" if isinstance(exc, requests.Timeout) else type(exc).__name__
    return (
        f"could not reach the Argo Server at {host} ({why}); start it or a port-forward "
        "(kubectl -n argo port-forward svc/argo-server 2746:2746), or give its URL with "
        "--host or ARGO_SERVER"
    )


def ui_link(host: str, kind: str, namespace: str, name: str) -> str:
    """The Argo UI page of a submitted object."""
    path = {"CronWorkflow": "cron-workflows", "WorkflowTemplate": "workflow-templates"}
    return f"{host}/{path.get(kind, 'workflows')}/{namespace}/{name}"


def submit(obj, service: WorkflowsService, namespace: str) -> str:
    """Create `obj` (Workflow, CronWorkflow or WorkflowTemplate); returns its name.

    A CronWorkflow or WorkflowTemplate is created or, when it exists, updated in place (hera's
    `update()`), so re-submitting after a config change is the way to change it.
    """
    obj.workflows_service = service
    obj.namespace = namespace
    if isinstance(obj, CronWorkflow | WorkflowTemplate):
        return obj.update().metadata.name
    return obj.create().metadata.name


def wait(
    service: WorkflowsService,
    namespace: str,
    name: str,
    *,
    poll_s: float,
    timeout_s: float,
    out=None,
) -> str:
    """Poll the workflow until it finishes (or `timeout_s`); print each phase change."""
    out = out or sys.stdout
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        wf = service.get_workflow(name=name, namespace=namespace)
        status = wf.status
        phase = (status.phase if status else None) or "Pending"
        if phase != last:
            progress = f" ({status.progress})" if status and status.progress else ""
            print(f"{name}: {phase}{progress}", file=out, flush=True)
            last = phase
        if phase in PHASE_EXIT:
            if status and status.message and phase != "Succeeded":
                print(f"{name}: {status.message}", file=out)
            return phase
        if time.monotonic() >= deadline:
            return phase
        time.sleep(poll_s)


EXAMPLES = """examples:
  ckptflow submit pipeline --wait --set pretrain.ranks=4
  ckptflow submit pipeline --template                 install the WorkflowTemplate once
  ckptflow submit pipeline --from-template -p ranks=4 -p pretrain_steps=400 --wait"""


def _seconds(text: str) -> float:
    """argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0, e.g. 10")
    return value


def hera_object(name: str, cfg: PipelineConfig, form: str, values: dict[str, str]):
    """What `submit` sends: the builder's hera object, or for `-p`/--template/--from-template
    the hera object of the rendered form (its parameters' values replaced)."""
    if form == "workflow" and not values:
        return builder(name).build(cfg)
    doc = manifests(name, cfg, form, values)[0]
    return (
        WorkflowTemplate.from_dict(doc)
        if doc["kind"] == "WorkflowTemplate"
        else Workflow.from_dict(doc)
    )


def main(argv: list[str] | None = None) -> int:
    """Submit NAME to the Argo Server; with --wait, exit with the workflow's phase."""
    ap = cli_args.Parser(
        prog="ckptflow submit",
        description=__doc__.split("\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_args(ap)
    ap.add_argument("--wait", action="store_true", help="follow the workflow to completion")
    ap.add_argument("--namespace", help="namespace (default: platform.namespace)")
    ap.add_argument("--host", help="Argo Server URL (default: hera config, ARGO_SERVER)")
    ap.add_argument(
        "--token",
        help="Argo Server bearer token (default: hera config, ARGO_TOKEN); never printed",
    )
    ap.add_argument("--poll", type=_seconds, default=10.0, help="seconds between --wait polls")
    ap.add_argument("--timeout", type=_seconds, default=6 * 3600, help="--wait gives up after")
    args = cli_args.parse(ap, argv, {"--set", "-p", "--parameter", "--poll", "--timeout"})
    if isinstance(args, int):
        return args
    try:
        cfg: PipelineConfig = config(args.overrides)
        if args.namespace:
            cfg = replace(cfg, platform=replace(cfg.platform, namespace=args.namespace))
        ns = cfg.platform.namespace
        conn = argo_connection(args.host, cfg.platform.argo_ui, args.token)
        b = builder(args.name)
        obj = hera_object(args.name, cfg, args.form, parse_pairs(args.parameters))
    except ConfigError as exc:
        print(f"ckptflow submit: {exc}", file=sys.stderr)
        return 2
    service = WorkflowsService(namespace=ns, **conn)
    kind = obj.to_dict()["kind"]
    try:
        name = submit(obj, service, ns)
    except (HeraException, OSError) as exc:  # (requests' connection errors are OSErrors)
        print(f"ckptflow submit: {submit_error(exc, conn['host'], kind)}", file=sys.stderr)
        return 2
    print(f"{kind} {name} submitted to {ns}")
    print(f"  {ui_link(conn['host'], kind, ns, name)}")
    if b.extras:
        print(
            f"  Argo Events resources: ckptflow render {args.name} "
            + " ".join(f"--set {o}" for o in args.overrides)
            + " | kubectl apply -f -"
        )
    if not args.wait or kind != "Workflow":
        return 0
    phase = wait(service, ns, name, poll_s=args.poll, timeout_s=args.timeout)
    return PHASE_EXIT.get(phase, STILL_RUNNING)
