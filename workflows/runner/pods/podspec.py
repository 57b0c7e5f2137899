"""The pure parts of a pod's spec: volumes, Kubernetes quantities, hostnames, the downward API.

Nothing here touches the machine, so all of it is unit-tested without root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

__all__ = ["Volume", "check_hostname", "downward_env", "parse_cpu", "parse_quantity"]

# Kubernetes quantity suffixes (resource.Quantity): binary, decimal, milli.
_SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": Decimal("0.001"),
    "": 1,
}
_QUANTITY = re.compile(
    r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]{1,3}))?([KMGTPE]i|[kMGTPEm])?$"
)
_HOSTNAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,61}[A-Za-z0-9])?$")
_FIELD_KEY = re.compile(r"""^metadata\.(labels|annotations)\[(['"])(.+)\2\]$""")
MAX_QUANTITY = 2**63 - 1  # what a cgroup file takes; a bigger number is an error, not a wrap


@dataclass(frozen=True)
class Volume:
    """One mount of a pod, already resolved by the caller from the Argo/Kubernetes spec.

    Exactly one kind: `host_path` set is a shared directory (hostPath, a claim's directory, the
    run's workdir); otherwise a fresh emptyDir private to the pod (on disk, or a tmpfs when
    `memory` is set, i.e. `medium: Memory`).
    """

    mount_path: str  # absolute path inside the pod
    host_path: str | None = None  # bind this host path (shared with the host and other pods)
    memory: bool = False  # emptyDir `medium: Memory`: a tmpfs
    size_limit: int | None = None  # bytes; enforced for a tmpfs (`size=`), not for a disk dir
    read_only: bool = False  # mount read-only (`readOnly: true`)
    name: str = ""  # the volume's name, for messages

    def __post_init__(self) -> None:
        if not self.mount_path.startswith("/") or "\0" in self.mount_path:
            raise ValueError(f"volume {self.name!r}: mountPath must be absolute")
        if self.target == "/":
            raise ValueError(f"volume {self.name!r}: a volume cannot be mounted on /")
        if ".." in self.mount_path.split("/"):
            raise ValueError(f"volume {self.name!r}: mountPath must not contain '..'")
        if self.host_path is not None and (self.memory or self.size_limit is not None):
            raise ValueError(f"volume {self.name!r}: a shared host path has no medium/sizeLimit")
        if self.size_limit is not None and not 0 < self.size_limit <= MAX_QUANTITY:
            raise ValueError(f"volume {self.name!r}: sizeLimit must be a positive byte count")

    @property
    def target(self) -> str:
        """The mount path without a trailing slash ('/' stays '/')."""
        return self.mount_path.rstrip("/") or "/"


def _decimal(text: str, what: str) -> Decimal:
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"{what} {text!r} is not a Kubernetes quantity (e.g. 64Mi, 1G, 500m)")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number) * (Decimal(10) ** int(exponent or 0)) * _SUFFIX[suffix or ""]
    except InvalidOperation as exc:
        raise ValueError(f"{what} {text!r} is out of range") from exc
    return value


def parse_quantity(value: int | str, what: str = "quantity") -> int:
    """A byte count from a Kubernetes quantity (`64Mi`, `1G`, `1e9`, `2048`), rounded up."""
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a Kubernetes quantity")
    if isinstance(value, int):
        out = value
    else:
        exact = _decimal(value, what)
        out = int(exact.to_integral_value(rounding="ROUND_CEILING"))
    if not 0 < out <= MAX_QUANTITY:
        raise ValueError(f"{what} {value!r} must be positive and below 2^63 bytes")
    return out


def parse_cpu(value: float | int | str, what: str = "cpu limit") -> float:
    """A number of CPUs from a Kubernetes quantity (`500m` = 0.5, `2` = 2.0)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a CPU quantity")
    out = float(value) if isinstance(value, (int, float)) else float(_decimal(value, what))
    if not 0.001 <= out <= 4096:
        raise ValueError(f"{what} {value!r} must be between 1m and 4096 CPUs")
    return out


def check_hostname(hostname: str) -> str:
    """The hostname if it is a valid one (1-63 letters, digits, '-' or '.'), else ValueError."""
    if not isinstance(hostname, str) or not _HOSTNAME.match(hostname):
        raise ValueError(
            f"pod hostname {hostname!r}: use 1-63 letters, digits, '-' or '.' "
            "(Kubernetes truncates a pod name to 63 characters for the hostname)"
        )
    return hostname


def _field(path: str, fields: dict[str, str | None], labels, annotations) -> str:
    """The value of one downward-API fieldPath, or ValueError naming what is supported."""
    if path in fields and fields[path] is not None:
        return str(fields[path])
    match = _FIELD_KEY.match(path)
    if match:
        source = labels if match.group(1) == "labels" else annotations
        return str((source or {}).get(match.group(3), ""))  # Kubernetes: a missing key is ""
    known = [k for k, v in fields.items() if v is not None]
    raise ValueError(
        f"fieldRef.fieldPath {path!r} is not available locally; use one of "
        f"{', '.join(known)}, metadata.labels['KEY'], metadata.annotations['KEY']"
    )


def downward_env(
    pod_name: str,
    namespace: str,
    ip: str,
    labels: dict[str, str] | None,
    annotations: dict[str, str] | None,
    env_spec: list[dict] | None,
    *,
    host_ip: str | None = None,
    node_name: str | None = None,
) -> dict[str, str]:
    """The variables of a container's `env` list that come from `valueFrom.fieldRef`.

    Other entries (plain `value`, secretKeyRef, ...) are the caller's business and left out, so
    the result can be laid over the environment the caller builds. A fieldPath that has no local
    meaning is a ValueError naming the entry (a user error: one line, no traceback).
    """
    fields = {
        "metadata.name": pod_name,
        "metadata.namespace": namespace,
        "status.podIP": ip,
        "status.podIPs": ip,
        "status.hostIP": host_ip,
        "spec.nodeName": node_name,
    }
    out: dict[str, str] = {}
    for entry in env_spec or []:
        if not isinstance(entry, dict):
            raise ValueError(f"env entry {entry!r} is not a mapping")
        ref = (entry.get("valueFrom") or {}).get("fieldRef")
        if ref is None:
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"env entry {entry!r} has no name")
        path = ref.get("fieldPath") if isinstance(ref, dict) else None
        if not isinstance(path, str):
            raise ValueError(f"env {name}: fieldRef needs a fieldPath")
        try:
            out[name] = _field(path, fields, labels, annotations)
        except ValueError as exc:
            raise ValueError(f"env {name}: {exc}") from None
    return out
