"""Template helpers shared by the builders: step containers, env wiring, outputs, volumes.

Every container runs `python -m ckptflow.steps.<name>` (or the same module under
`python -m torch.distributed.run`): the image's interpreter on a cluster, and the local
runner's interpreter on a laptop, so one manifest runs in both places. No template carries
inline source.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ckptflow.workflows import checks
from ckptflow.workflows.config import PlatformConfig, Resources
from ckptflow.workflows.parameters import ref
from hera.workflows import (
    Container,
    EmptyDirVolume,
    Env,
    FieldEnv,
    Parameter,
    RetryStrategy,
    SecretEnv,
    SecretVolume,
)
from hera.workflows import (
    Resources as HeraResources,
)
from hera.workflows.models import (
    Backoff,
    Capabilities,
    PodGC,
    RetryAffinity,
    RetryNodeAntiAffinity,
    SeccompProfile,
    SecurityContext,
    Toleration,
    TTLStrategy,
    ValueFrom,
)

from ckptflow import env as wiring

# The Argo variables each step sees, so MLflow tags and logs can name the workflow.
ARGO_ENV = {
    "ARGO_WORKFLOW_NAME": "{{workflow.name}}",
    "ARGO_WORKFLOW_UID": "{{workflow.uid}}",
    "ARGO_WORKFLOW_NAMESPACE": "{{workflow.namespace}}",
}
TORCHRUN = ("python", "-m", "torch.distributed.run")
SHM_VOLUME = "dshm"


def param(name: str) -> str:
    """The Argo expression of template input `name`."""
    return "{{inputs.parameters." + name + "}}"


def step_env(platform: PlatformConfig) -> list:
    """Env of every step: S3, GCS and Azure credentials by Secret reference (never inline),
    MLflow URI, Argo names."""
    env: list = []
    if platform.s3_secret:
        env += [
            SecretEnv(
                name="AWS_ACCESS_KEY_ID",
                secret_name=platform.s3_secret,
                secret_key=platform.s3_access_key_key,
            ),
            SecretEnv(
                name="AWS_SECRET_ACCESS_KEY",
                secret_name=platform.s3_secret,
                secret_key=platform.s3_secret_key_key,
            ),
        ]
    env += cloud_env(platform)
    if platform.s3_endpoint:
        env.append(Env(name="AWS_ENDPOINT_URL", value=platform.s3_endpoint))
    if platform.s3_region:
        env.append(Env(name="AWS_DEFAULT_REGION", value=platform.s3_region))
    if platform.mlflow_tracking_uri:
        env.append(Env(name="MLFLOW_TRACKING_URI", value=platform.mlflow_tracking_uri))
    env += [Env(name=k, value=v) for k, v in ARGO_ENV.items()]
    if platform.argo_ui:  # so each MLflow run links to its workflow in the Argo UI
        env.append(Env(name="CKPTFLOW_ARGO_UI", value=platform.argo_ui))
    return env


# Where a GCS service-account key Secret is mounted in every step container.
GCS_KEY_DIR = "/var/run/secrets/ckptflow/gcs"
GCS_KEY_VOLUME = "gcs-key"


def cloud_env(platform: PlatformConfig) -> list:
    """GCS and Azure credentials as each cloud's standard variables: the key file's path
    (the file itself comes from the Secret volume, see `credential_volumes`), the Azure
    connection string or account key by Secret reference."""
    env: list = []
    if platform.gcs_secret:
        path = f"{GCS_KEY_DIR}/{platform.gcs_secret_file}"
        env.append(Env(name="GOOGLE_APPLICATION_CREDENTIALS", value=path))
    if platform.azure_account_name:  # alone: workload identity (adlfs's DefaultAzureCredential)
        env.append(Env(name="AZURE_STORAGE_ACCOUNT_NAME", value=platform.azure_account_name))
    if platform.azure_secret:
        var = "AZURE_STORAGE_CONNECTION_STRING"
        if platform.azure_account_name:
            var = "AZURE_STORAGE_ACCOUNT_KEY"
        env.append(
            SecretEnv(
                name=var, secret_name=platform.azure_secret, secret_key=platform.azure_secret_key
            )
        )
    return env


def credential_volumes(platform: PlatformConfig) -> list:
    """The GCS key Secret as a read-only volume (google-auth reads a file, not a variable)."""
    if not platform.gcs_secret:
        return []
    return [
        SecretVolume(
            name=GCS_KEY_VOLUME,
            secret_name=platform.gcs_secret,
            mount_path=GCS_KEY_DIR,
            read_only=True,
        )
    ]


def hera_resources(res: Resources, extended: Sequence[tuple[str, str]] = ()) -> HeraResources:
    """Kubernetes resources of one container; memory request == limit, and so are the
    `extended` resources' counts (Kubernetes refuses an extended request below its limit)."""
    counts = dict(extended)
    return HeraResources(
        cpu_request=res.cpu,
        memory_request=res.memory,
        memory_limit=res.memory,
        gpus=res.gpu or None,
        custom_resources={"requests": counts, "limits": counts} if counts else None,
    )


def outputs(
    platform: PlatformConfig, names: Sequence[str], *, optional: bool = False
) -> list[Parameter]:
    """Output parameters read from the files a step writes into `--output-dir`.

    `optional` gives each a default of "": under torchrun only global rank 0 writes outputs,
    and the pods of the other ranks must not fail for want of the files.
    """
    return [
        Parameter(
            name=n,
            value_from=ValueFrom(
                path=f"{platform.outputs_dir}/{n}", default="" if optional else None
            ),
        )
        for n in names
    ]


def retry(
    limit: int, backoff_s: int, *, transient_only: bool = False, avoid_node: bool = False
) -> RetryStrategy | None:
    """Retry with doubling backoff: on any failure, pod loss and preemption included (policy
    Always: training and evaluation resume where they were), or with `transient_only` only when
    the pod errored (policy OnError: deleted, evicted, its node lost), never when the step
    itself failed; `avoid_node` keeps a retry off the nodes where this task failed (a rank that
    failed preflight there: opt-in, since on a cluster without a spare node per task such a
    retry can never be scheduled, workflow/controller/retry_tweak.go)."""
    if limit <= 0:
        return None
    return RetryStrategy(
        limit=limit,
        retry_policy="OnError" if transient_only else "Always",
        backoff=Backoff(duration=f"{backoff_s}s", factor=2),
        affinity=RetryAffinity(node_anti_affinity=RetryNodeAntiAffinity()) if avoid_node else None,
    )


def rank_env(grace_s: int | None) -> list:
    """Env of a torchrun rank: its pod's IP, name and node (downward API), and how long the
    agent waits for its workers after a SIGTERM (the pod's grace period: a preemption save)."""
    out = [
        # torchrun's c10d rendezvous publishes the agent's address for the workers' store:
        # its hostname (socket.getfqdn()) unless given one, and a pod's hostname does not
        # resolve from other pods. The pod's IP from the downward API does (--local-addr).
        FieldEnv(name="PET_LOCAL_ADDR", field_path="status.podIP"),
        # A retried rank joins a new rendezvous round, but an agent that kept its rank
        # reuses the store address it cached in round one and never publishes the new
        # round's MASTER_ADDR: the newcomer times out waiting for it (issue 15). Without
        # the shared store every round publishes its own (dynamic_rendezvous.py).
        Env(name="TORCH_DISABLE_SHARE_RDZV_TCP_STORE", value="1"),
        # preflight and straggler reports name the pod and node of a slow rank, and the local
        # tier places each rank's replicas on other nodes (issue 35): NODE_NAME, the usual name
        FieldEnv(name=wiring.POD_NAME_VARIABLE, field_path="metadata.name"),
        FieldEnv(name=wiring.NODE_NAME_VARIABLES[0], field_path="spec.nodeName"),
    ]
    if grace_s:
        # the agent's default (30 s) would SIGKILL a worker still saving after a preemption
        out.append(Env(name="TORCH_ELASTIC_SHUTDOWN_TIMEOUT", value=str(grace_s)))
    return out


def grace_patch(grace_s: int | None, host_network: bool = False) -> dict:
    """Our podSpecPatch fields of a pod (Argo templates have no fields of their own for these):
    terminationGracePeriodSeconds (how long Kubernetes waits between SIGTERM and SIGKILL), and
    hostNetwork with the DNS policy that still resolves cluster services (MLflow, S3)."""
    patch: dict = {}
    if grace_s:
        patch["terminationGracePeriodSeconds"] = int(grace_s)
    if host_network:
        patch |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    return patch


def gpu_patch(ours: dict) -> str:
    """The podSpecPatch of a rank or fine-tune pod: `ours`, the run's extra env (parameter
    gpu_env, a Pod spec env list, merged into the main container by name) and the run's own
    patch (parameter gpu_pod_spec_patch, a JSON object) beside them.

    Both parameters vary per run, so they are merged where Argo reads the patch: it is YAML
    (util.ConvertYAMLToJSON converts a patch not starting with '{'), whose merge key `<<` joins
    the mappings of its list. The run's patch may not hold our fields (checks.OWN_PATCH_FIELDS),
    so no key is in both and which one a parser lets win never matters."""
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in ours.items()]
    fields.append('"containers": [{"name": "main", "env": ' + ref("gpu_env") + "}]")
    return "<<: [" + ref("gpu_pod_spec_patch") + ", {" + ", ".join(fields) + "}]"


def step(
    name: str,
    module: str,
    args: Sequence[str],
    *,
    platform: PlatformConfig,
    resources: Resources | None = None,
    inputs: Sequence[str] = (),
    output_names: Sequence[str] = (),
    launcher: Sequence[str] = (),
    wrapper: Sequence[str] = (),
    retries: int = 0,
    backoff_s: int = 10,
    transient_only: bool = False,
    deadline_s: int | None = None,
    timeout: str | None = None,
    retry_elsewhere: bool = False,
    shm_size: str | None = None,
    daemon: bool = False,
    with_env: bool = True,
    metrics: list | None = None,
    grace_s: int | None = None,
) -> Container:
    """A container template running `python -m ckptflow.steps.<module> ARGS --output-dir DIR`.

    A dotted `module` (`ckptflow.cli`) is run as given rather than under `ckptflow.steps.`.

    `launcher` (torchrun's arguments) wraps the module in `python -m torch.distributed.run`,
    or in `wrapper` (a command that runs torchrun with the arguments after it: the ranks'
    rendezvous, ckptflow.steps.rdzv).
    `with_env=False` leaves out credentials and MLflow (least privilege for helpers such as
    the rendezvous store). A launcher's template also gets `rank_env`, `grace_s` as its
    terminationGracePeriodSeconds. `retry_elsewhere` keeps retries off the nodes where the task
    failed. `deadline_s` is a fixed activeDeadlineSeconds, `timeout` Argo's template timeout
    (a workflow parameter's expression: "" = none). Every container passes the `restricted`
    Pod Security Standard (`restricted_context`). Must be called inside a hera Workflow
    context, which collects it.
    """
    target = module if "." in module else f"ckptflow.steps.{module}"
    prefix = wrapper or TORCHRUN
    command = [*prefix, *launcher, "-m", target] if launcher else ["python", "-m", target]
    args = [*args, "--output-dir", platform.outputs_dir] if output_names else list(args)
    env = step_env(platform) if with_env else None
    patch = grace_patch(grace_s, bool(launcher) and platform.gpu_host_network)
    if launcher:  # a GPU pod: its own env, nodes and tolerations (platform.gpu_*)
        env = [*(env or []), *rank_env(grace_s)]
    volumes = credential_volumes(platform) if with_env else []
    if shm_size:
        # A pod's default /dev/shm is 64 MiB: dataloader workers and NCCL die with SIGBUS.
        volumes.append(
            EmptyDirVolume(
                name=SHM_VOLUME, mount_path="/dev/shm", medium="Memory", size_limit=shm_size
            )
        )
    return Container(
        name=name,
        image=platform.image,
        image_pull_policy=platform.image_pull_policy,
        command=command,
        args=args or None,
        env=env,
        resources=hera_resources(
            resources or platform.step_resources,
            platform.gpu_extended_resources if launcher else (),
        ),
        inputs=[Parameter(name=n) for n in inputs],
        outputs=outputs(platform, output_names, optional=bool(launcher)),
        retry_strategy=retry(
            retries, backoff_s, transient_only=transient_only, avoid_node=retry_elsewhere
        ),
        active_deadline_seconds=deadline_s,
        timeout=timeout,
        security_context=restricted_context(platform),
        volumes=volumes or None,
        daemon=daemon or None,
        metrics=metrics or None,
        pod_spec_patch=gpu_patch(patch) if launcher else (json.dumps(patch) if patch else None),
        node_selector=(dict(platform.gpu_node_selector) or None) if launcher else None,
        tolerations=gpu_tolerations(platform) if launcher else None,
        labels=(dict(platform.gpu_pod_labels) or None) if launcher else None,
        annotations=(dict(platform.gpu_pod_annotations) or None) if launcher else None,
    )


def restricted_context(platform: PlatformConfig) -> SecurityContext:
    """A container securityContext that passes the `restricted` Pod Security Standard
    (kubernetes.io/docs/concepts/security/pod-security-standards): a non-root numeric user
    (the image's, so runAsNonRoot can verify it), no privilege escalation, every capability
    dropped, the runtime's default seccomp profile. A namespace enforcing `restricted` rejects
    a pod without it."""
    return SecurityContext(
        run_as_non_root=True,
        run_as_user=platform.run_as_user,
        allow_privilege_escalation=False,
        capabilities=Capabilities(drop=["ALL"]),
        seccomp_profile=SeccompProfile(type="RuntimeDefault"),
    )


def node_selector(platform: PlatformConfig) -> dict[str, str] | None:
    """`platform.node_selector` (label, value pairs, checked by config) as a nodeSelector."""
    return dict(platform.node_selector) or None


def tolerations(platform: PlatformConfig) -> list[Toleration] | None:
    """`platform.tolerations` (checked by config) as Kubernetes tolerations."""
    return as_tolerations(platform.tolerations)


# The taints the node lifecycle controller puts on a node that stops reporting (unreachable)
# or reports not ready (kubernetes pkg/controller/nodelifecycle/node_lifecycle_controller.go);
# a pod without its own toleration gets 300 s of each from the DefaultTolerationSeconds
# admission plugin (plugin/pkg/admission/defaulttolerationseconds/admission.go).
NODE_LOSS_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


def gpu_tolerations(platform: PlatformConfig) -> list[Toleration] | None:
    """A rank or fine-tune pod's tolerations: `platform.gpu_tolerations` (else the workflow's
    own, which a template's tolerations replace in Argo: workflow/controller/workflowpod.go),
    plus the node-loss taints for `gpu_node_loss_toleration_s` unless one names them already.

    Without them a silently lost node keeps its rank "Running" for 300 s after NotReady, and
    the gang cannot restart before Argo retries that rank (issue 34)."""
    given = list(platform.gpu_tolerations or platform.tolerations)
    seconds = platform.gpu_node_loss_toleration_s
    if seconds and seconds < platform.node_monitor_grace_s:
        raise checks.ConfigError(
            f"platform.gpu_node_loss_toleration_s={seconds} is below "
            f"platform.node_monitor_grace_s={platform.node_monitor_grace_s}: a kubelet hiccup "
            "that short would evict every rank; set it to at least the grace period (0: 300 s)"
        )
    out = as_tolerations(given) or []
    if seconds and not {t.key for t in given} & set(NODE_LOSS_TAINTS):
        out += [
            Toleration(key=key, operator="Exists", effect="NoExecute", toleration_seconds=seconds)
            for key in NODE_LOSS_TAINTS
        ]
    return out or None


def as_tolerations(given: Sequence) -> list[Toleration] | None:
    """Configured tolerations (checked by config) as Kubernetes tolerations; none: None."""
    out = [
        Toleration(
            key=t.key or None,
            operator=t.operator,
            value=t.value or None,
            effect=t.effect or None,
            toleration_seconds=t.toleration_seconds,
        )
        for t in given
    ]
    return out or None


def workflow_kwargs(
    platform: PlatformConfig, *, title: str, description: str, per_run: bool = False
) -> dict:
    """Workflow-level settings every builder shares: identity, scheduling, GC, UI text.
    `per_run`: the workflow has the pod parameters (parameters.POD), so every pod's
    PriorityClass is the run's (Argo substitutes workflow parameters in the spec's fields)."""
    priority = ref("priority_class") if per_run else platform.priority_class_name
    return {
        "namespace": platform.namespace,
        "service_account_name": platform.service_account,
        "annotations": {
            "workflows.argoproj.io/title": title,
            "workflows.argoproj.io/description": description,
        },
        "active_deadline_seconds": platform.workflow_deadline_s or None,  # 0: none
        "pod_gc": PodGC(strategy=platform.pod_gc) if platform.pod_gc else None,
        "ttl_strategy": TTLStrategy(seconds_after_completion=platform.ttl_after_completion_s)
        if platform.ttl_after_completion_s
        else None,
        "node_selector": node_selector(platform),
        "tolerations": tolerations(platform),
        "pod_priority_class_name": priority or None,
        "scheduler_name": platform.scheduler_name or None,
    }


def run_root(platform: PlatformConfig, configured: str, suffix: str = "") -> str:
    """The configured root, or `<storage_root>/{{workflow.name}}[/suffix]` (fresh per run)."""
    if configured:
        return configured.rstrip("/")
    base = f"{platform.storage_root.rstrip('/')}/{{{{workflow.name}}}}"
    return f"{base}/{suffix}" if suffix else base
