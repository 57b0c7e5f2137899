"""Checks across settings of one pod, run with `config.validate` before anything is rendered.

Each is one line naming the setting to change (a `ConfigError`), so a manifest that a GPU
cluster would run badly is never rendered: a memory-backed /dev/shm larger than the pod's
memory limit (the kubelet counts a `medium: Memory` emptyDir against it, so filling /dev/shm
OOM-kills the pod), or more torchrun processes per pod than the GPUs it requests (two
processes would share a GPU; fewer leave GPUs idle).
"""

from __future__ import annotations

from ckptflow.workflows.checks import ConfigError, pod_spec_patch
from ckptflow.workflows.local_tier import notices as local_tier_notices
from ckptflow.workflows.runner.cluster import MEMORY, resource_units

__all__ = ["check_pods", "notices"]


def _bytes(text: str) -> int:
    return resource_units(MEMORY, text, "memory")


def _shm(section: str, shm_size: str, resources_key: str, memory: str) -> None:
    """A /dev/shm emptyDir (medium Memory) must fit inside the memory limit of its pod."""
    if shm_size and _bytes(shm_size) > _bytes(memory):
        raise ConfigError(
            f"--set {section}.shm_size={shm_size}: above the pod's memory limit "
            f"{resources_key}.memory={memory} (/dev/shm counts against it); lower it or raise "
            "the memory"
        )


def _procs(key: str, procs: int, gpu_key: str, gpus: int) -> None:
    """On GPU pods torchrun runs one process per requested GPU."""
    if gpus and procs != gpus:
        raise ConfigError(
            f"--set {key}={procs}: a pod requesting {gpus} GPU(s) ({gpu_key}={gpus}) runs one "
            f"process per GPU; set {key}={gpus}"
        )


def check_pods(cfg) -> None:
    """Raise ConfigError for the first pod whose settings do not fit together."""
    pre, fine = cfg.pretrain, cfg.finetune
    _shm("pretrain", pre.shm_size, "pretrain.rank_resources", pre.rank_resources.memory)
    _shm("finetune", fine.shm_size, "finetune.resources", fine.resources.memory)
    _procs(
        "pretrain.procs_per_rank", pre.procs_per_rank, "pretrain.rank_resources.gpu",
        pre.rank_resources.gpu,
    )  # fmt: skip
    _procs("finetune.workers", fine.workers, "finetune.resources.gpu", fine.resources.gpu)


def notices(cfg) -> list[str]:
    """One line for each setting that takes pods out of the `restricted` Pod Security Standard
    (rendered anyway: a namespace that allows it runs them; one that enforces it refuses)."""
    lines = []
    if cfg.platform.gpu_host_network:
        lines.append(
            "platform.gpu_host_network=true: rank and fine-tune pods use hostNetwork, which "
            "the restricted and baseline Pod Security Standards forbid; their namespace must "
            "enforce privileged (other settings of their securityContext stay restricted)"
        )
    patch = pod_spec_patch("platform.gpu_pod_spec_patch", cfg.platform.gpu_pod_spec_patch)
    host = [k for k in ("hostNetwork", "hostPID", "hostIPC") if patch.get(k) is True]
    if host:
        lines.append(
            f"platform.gpu_pod_spec_patch sets {', '.join(host)}: rank and fine-tune pods leave "
            "the restricted Pod Security Standard; their namespace must enforce privileged"
        )
    return lines + local_tier_notices(cfg)  # a hostPath local tier
