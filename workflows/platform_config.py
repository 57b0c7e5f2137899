"""The `platform` section of the configuration (config.py): where and how pods run (image,
namespace, identities, storage and its credentials' Secrets, MLflow, node placement, GPU pod
wiring, gang scheduling, the local checkpoint tier's volume), and the two small value types
it and the stage sections share, `Resources` and `Toleration`.

Kept apart from the stage sections because it is deployment wiring, the same for every stage
and set once per cluster, while the stage sections say what each stage does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptflow.contract import EXPERIMENT

__all__ = ["PlatformConfig", "Resources", "Toleration"]


@dataclass(frozen=True)
class Resources:
    """Kubernetes resources of one pod's main container (quantities as strings)."""

    cpu: str = "1"  # CPU request, e.g. "2" or "500m"
    memory: str = "2Gi"  # memory request and limit (a limit stops one pod starving a node)
    gpu: int = 0  # nvidia.com/gpu count (request == limit); 0 requests none


@dataclass(frozen=True)
class Toleration:
    """One Kubernetes toleration of every pod (the Pod API's fields)."""

    key: str = ""  # taint key ("" with operator Exists: every taint)
    operator: str = "Equal"  # Equal | Exists
    value: str = ""  # taint value (operator Equal)
    effect: str = ""  # "" (every effect) | NoSchedule | PreferNoSchedule | NoExecute
    toleration_seconds: int | None = None  # NoExecute only: how long the pod stays


@dataclass(frozen=True)
class PlatformConfig:
    """Where and how pods run: image, namespace, identities, storage, MLflow, scheduling."""

    image: str = "ckptflow-steps:0.1.0"  # step image: contains `steps` and the `ckptflow` CLI
    image_pull_policy: str = "IfNotPresent"  # Always | IfNotPresent | Never
    namespace: str = "ckptflow"  # namespace the workflows run in
    service_account: str = "ckptflow-workflow"  # service account of every pod
    storage_root: str = "s3://ckptflow/runs"  # URI under which each run gets its own prefix
    mlflow_tracking_uri: str = "http://mlflow.ckptflow.svc.cluster.local:5000"  # MLflow server
    experiment: str = EXPERIMENT  # MLflow experiment of the pipeline's parent runs
    s3_endpoint: str = "http://minio.ckptflow.svc.cluster.local:9000"  # "" = AWS S3 itself
    s3_secret: str = "ckptflow-s3"  # Secret holding the S3 keys; "" = no key env (local runs)
    s3_access_key_key: str = "AWS_ACCESS_KEY_ID"  # key of the access key id in that Secret
    s3_secret_key_key: str = "AWS_SECRET_ACCESS_KEY"  # key of the secret access key in it
    s3_region: str = "us-east-1"  # AWS_DEFAULT_REGION of every pod
    # gs://: a Secret holding a service-account key file, mounted read-only and named by
    # GOOGLE_APPLICATION_CREDENTIALS; "" = none (GKE workload identity, or no GCS)
    gcs_secret: str = ""
    gcs_secret_file: str = "key.json"  # key of the key file in that Secret
    # az://: a Secret holding the storage account's connection string (or its account key
    # with `azure_account_name`); "" = none (managed identity, or no Azure)
    azure_secret: str = ""
    azure_secret_key: str = "AZURE_STORAGE_CONNECTION_STRING"  # key of the credential in it
    azure_account_name: str = (
        ""  # set: the Secret holds that account's key, not a connection string
    )
    # Labels every pod's node must carry: a mapping {"pool": "gpu"} (or pool=gpu,zone=a).
    node_selector: tuple[tuple[str, str], ...] = ()
    # Tolerations of every pod: a YAML/JSON list as in a Pod spec (or key[=value]:Effect,...).
    tolerations: tuple[Toleration, ...] = ()
    # Rank and fine-tune (GPU) pods only: set, they use these instead of node_selector /
    # tolerations (Argo: a template's own replace the workflow's), so light steps (evaluator,
    # select, register, start/finish) keep to node_selector and off tainted GPU nodes.
    gpu_node_selector: tuple[tuple[str, str], ...] = ()
    gpu_tolerations: tuple[Toleration, ...] = ()
    # Rank and fine-tune pods tolerate node.kubernetes.io/unreachable and not-ready (NoExecute)
    # this long: a silently lost node's pods are evicted (and retried) this long after it turns
    # NotReady; 0 leaves Kubernetes' default, 300 s (DefaultTolerationSeconds admission plugin).
    gpu_node_loss_toleration_s: int = 60
    # The cluster's kube-controller-manager --node-monitor-grace-period (50 s since v1.32): a
    # silent node turns NotReady this long after its last heartbeat. For the planner's RTO and
    # as the floor of gpu_node_loss_toleration_s (a shorter one evicts on a kubelet hiccup).
    node_monitor_grace_s: int = 50
    # Extra env of rank and fine-tune pods, e.g. NCCL_IB_HCA=mlx5,NCCL_DEBUG=INFO (or a mapping).
    gpu_env: tuple[tuple[str, str], ...] = ()
    # Extended resources of each rank and fine-tune pod (request == limit), e.g. rdma/ib=1.
    gpu_extended_resources: tuple[tuple[str, str], ...] = ()
    gpu_pod_labels: tuple[tuple[str, str], ...] = ()  # labels of rank and fine-tune pods
    # Annotations of rank and fine-tune pods, e.g. {"k8s.v1.cni.cncf.io/networks": "ib0"}.
    gpu_pod_annotations: tuple[tuple[str, str], ...] = ()
    # Rank and fine-tune pods on the node's network (RDMA without Multus): leaves the restricted
    # Pod Security Standard (render says so); the namespace must allow it.
    gpu_host_network: bool = False
    # A podSpecPatch (YAML/JSON mapping) for rank and fine-tune pods, merged over ours.
    gpu_pod_spec_patch: str = ""
    # Gang scheduling of the pretraining ranks (all start or none): none | kueue | volcano |
    # coscheduling, rendered on the rank pods only (workflows/gang_scheduling.py)
    gang_scheduler: str = "none"
    # Kueue's LocalQueue ("" = ckptflow, deploy/gang/kueue's) or Volcano's Queue ("" = default)
    gang_queue: str = ""
    # the ranks' schedulerName ("" = volcano / scheduler-plugins-scheduler for coscheduling)
    gang_scheduler_name: str = ""
    # The local checkpoint tier's volume on rank pods (issue 35), mounted at pretrain.local_dir
    # only when pretrain.local_every > 0 (workflows/local_tier.py): emptyDir (default: per pod,
    # gone with it; a rank restarted by torchrun in its pod keeps it, a retried pod gets a new
    # one and fetches its piece from a peer) | hostPath (per node, outlives the pod; leaves the
    # restricted and baseline Pod Security Standards: the namespace must allow it)
    local_volume: str = "emptyDir"
    # its size, a Kubernetes quantity (e.g. 8Gi): the emptyDir's sizeLimit and the ranks'
    # --local-size-mib (local retention keeps within it); "" = no limit (the volume's free space)
    local_volume_size: str = ""
    # "" (the node's disk) | Memory (tmpfs: counts against rank_resources.memory, needs a size)
    local_volume_medium: str = ""
    # hostPath only: the node's directory (type Directory: it must exist on every GPU node,
    # writable by run_as_user); runs keep apart by run key below it
    local_host_path: str = "/var/lib/ckptflow/local"
    priority_class_name: str = ""  # PriorityClass of every pod (a Kubernetes name); "" = default
    scheduler_name: str = ""  # scheduler of every pod, e.g. volcano; "" = default-scheduler
    pod_gc: str = "OnPodSuccess"  # podGC strategy; "" keeps every pod
    # activeDeadlineSeconds of each workflow, 0 = none (an integer field: no parameter reaches it)
    workflow_deadline_s: int = 0
    run_as_user: int = 1000  # the non-root UID every pod runs as (images/step.Dockerfile's user)
    ttl_after_completion_s: int = 7 * 24 * 3600  # delete finished workflows after this long
    outputs_dir: str = "/tmp/outputs"  # --output-dir of each step; files there are outputs
    argo_ui: str = "http://localhost:2746"  # Argo Server URL for links and `submit`
    step_resources: Resources = Resources(cpu="250m", memory="1Gi")  # small bookkeeping steps
