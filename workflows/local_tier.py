"""The local checkpoint tier on the rank pods (issue 35): its volume, its size, its checks.

With `pretrain.local_every > 0` every rank also saves to `pretrain.local_dir`, a volume of its
pod (`platform.local_volume`):

- `emptyDir` (default): the pod's own, gone with the pod (kubernetes.io/docs/concepts/storage/
  volumes/#emptydir). A worker restarted in place by torchrun (`pretrain.max_restarts`) keeps
  it; a pod retried by Argo gets a new, empty one and fetches its piece from a peer's replica
  (`pretrain.replicas`). `medium: Memory` makes it a tmpfs, counted against the pod's memory
  limit. Keeps the rank pods within the restricted Pod Security Standard.
- `hostPath`: a directory of the node (#hostpath on the same page), which a pod retried on the
  same node finds again. The restricted and baseline Pod Security Standards forbid it
  (policy/check_hostPathVolumes.go): the namespace must enforce privileged.

`platform.local_volume_size` is both the emptyDir's `sizeLimit` and the ranks'
`--local-size-mib`, so local retention keeps within what the kubelet would evict the pod for.
Every check is one line naming the setting (a ConfigError, exit 2 at render, submit and
`run --local`). The volume is rendered only when the tier is on: a default manifest is the
same as without the tier.
"""

from __future__ import annotations

import posixpath

from ckptflow.workflows.checks import ConfigError, quantity
from ckptflow.workflows.runner.cluster import MEMORY, resource_units
from hera.workflows import EmptyDirVolume, HostPathVolume

__all__ = ["LOCAL_VOLUME", "check_local_tier", "local_size_mib", "local_volume"]

LOCAL_VOLUME = "ckpt-local"  # the volume's name in the rank template
KINDS = ("emptyDir", "hostPath")
MEDIA = ("", "Memory")
MIB = 2**20
# Paths a rank pod has for other uses: the local tier mounted there would hide them.
TAKEN = ("/", "/tmp", "/dev", "/dev/shm", "/proc", "/sys", "/etc", "/usr", "/bin", "/lib")


def local_size_mib(size: str) -> int:
    """`platform.local_volume_size` in whole MiB (0: none given); ValueError if it does not
    parse as a Kubernetes quantity."""
    if not size:
        return 0
    return resource_units(MEMORY, size, "platform.local_volume_size") // MIB


def local_volume(platform, train):
    """The rank template's local-tier volume mounted at `train.local_dir`, or None when the
    tier is off (pretrain.local_every=0)."""
    if train.local_every <= 0:
        return None
    if platform.local_volume == "hostPath":
        # type Directory: the node's directory must exist (DirectoryOrCreate would make it
        # root-owned 0755, which the pod's non-root user cannot write)
        return HostPathVolume(
            name=LOCAL_VOLUME,
            mount_path=train.local_dir,
            path=platform.local_host_path,
            type="Directory",
        )
    return EmptyDirVolume(
        name=LOCAL_VOLUME,
        mount_path=train.local_dir,
        medium=platform.local_volume_medium or None,
        size_limit=platform.local_volume_size or None,
    )


def _bad(key: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"--set {key}={value}: {why}")


def _check_path(key: str, path: str, what: str) -> None:
    """An absolute path with no `..` element (Kubernetes refuses a hostPath with backsteps:
    validatePathNoBacksteps, pkg/apis/core/validation/validation.go), not a system path."""
    if not path.startswith("/") or ".." in path.split("/"):
        raise _bad(key, path, f"{what} must be an absolute path without '..', e.g. /ckpt-local")
    if posixpath.normpath(path) in TAKEN:
        raise _bad(key, path, f"{what} would hide the pod's own {posixpath.normpath(path)}")


def _check_volume(p) -> int:
    """The volume settings one by one; the size in MiB."""
    if p.local_volume not in KINDS:
        raise _bad("platform.local_volume", p.local_volume, "not one of emptyDir, hostPath")
    if p.local_volume_medium not in MEDIA:
        raise _bad("platform.local_volume_medium", p.local_volume_medium, "not one of '', Memory")
    size = p.local_volume_size
    if size and not quantity(size):
        raise _bad(
            "platform.local_volume_size", size, "not a Kubernetes quantity, e.g. 8Gi or 500Mi"
        )
    try:
        mib = local_size_mib(size)
    except ValueError as exc:
        raise _bad("platform.local_volume_size", size, str(exc)) from None
    if size and mib < 1:
        raise _bad("platform.local_volume_size", size, "below 1 MiB; e.g. 8Gi")
    if mib > 2**31 - 1:
        raise _bad("platform.local_volume_size", size, "above 2 PiB")
    _check_path("platform.local_host_path", p.local_host_path, "the node's directory")
    return mib


def _check_memory(pre, p) -> None:
    """A `medium: Memory` emptyDir is a tmpfs the kubelet counts against the pod's memory limit
    (pkg/volume/emptydir; cluster_check._shm says the same of a rendered manifest): with
    /dev/shm it must fit in rank_resources.memory, and it needs a size (without one, the tier
    would take the node's free memory for its budget and the pod would be OOM-killed)."""
    if p.local_volume_medium != "Memory":
        return
    if p.local_volume != "emptyDir":
        raise _bad(
            "platform.local_volume_medium", "Memory", "only an emptyDir has a medium; "
            "set platform.local_volume=emptyDir or leave the medium empty",
        )  # fmt: skip
    if not p.local_volume_size:
        raise _bad(
            "platform.local_volume_medium", "Memory",
            "a memory-backed local tier needs platform.local_volume_size (e.g. 4Gi)",
        )  # fmt: skip
    limit = resource_units(MEMORY, pre.rank_resources.memory, "memory")
    shm = resource_units(MEMORY, pre.shm_size, "shm_size") if pre.shm_size else 0
    if resource_units(MEMORY, p.local_volume_size, "size") + shm > limit:
        raise _bad(
            "platform.local_volume_size", p.local_volume_size,
            f"with medium Memory it counts against the rank pod's memory limit "
            f"pretrain.rank_resources.memory={pre.rank_resources.memory} (with /dev/shm "
            f"pretrain.shm_size={pre.shm_size or 0}); lower it or raise the memory",
        )  # fmt: skip


def check_local_tier(cfg) -> None:
    """Raise ConfigError for the first local-tier setting that cannot work."""
    pre, p = cfg.pretrain, cfg.platform
    train = pre.train
    _check_volume(p)
    _check_path("pretrain.local_dir", train.local_dir, "the local tier's mount path")
    if train.replicas and train.replicas >= pre.ranks:
        raise _bad(
            "pretrain.replicas", train.replicas,
            f"each replica must be on another rank pod's node, and there are "
            f"pretrain.ranks={pre.ranks}; use at most {pre.ranks - 1}",
        )  # fmt: skip
    if train.replicas and not train.local_every:
        raise _bad(
            "pretrain.replicas", train.replicas,
            "replicas copy the local tier's saves; set pretrain.local_every too",
        )  # fmt: skip
    _check_memory(pre, p)


def notices(cfg) -> list[str]:
    """One line when the local tier takes the rank pods out of the restricted Pod Security
    Standard (rendered anyway; a namespace enforcing restricted refuses the pods)."""
    if cfg.pretrain.train.local_every > 0 and cfg.platform.local_volume == "hostPath":
        return [
            "platform.local_volume=hostPath: rank pods mount a hostPath volume, which the "
            "restricted and baseline Pod Security Standards forbid; their namespace must "
            "enforce privileged (emptyDir, the default, stays restricted)"
        ]
    return []
