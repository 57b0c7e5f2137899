"""Where each rank's local piece gets its replicas, and how ranks find each other's servers.

Placement maps ranks to hosts through the node each rank pod runs on (ckptflow.env.node_name:
the downward API's spec.nodeName, one name per Kubernetes node, that is per host). The gang's
distinct node names, sorted, form a ring; rank r on node i places its R replicas on the next R
nodes of the ring (i+1, ..., i+R, modulo the node count), on each of them the rank with r's
position among its own node's ranks (modulo that node's rank count), so the load spreads over
the ranks of a node. Every piece then lives on R+1 distinct nodes (its own and R others): the
loss of any one node leaves at least one copy of every piece when R >= 1 and the gang spans
two nodes or more. With R larger than the other nodes there are, each piece goes to every
other node once (one warning); on one node there is nowhere to replicate to (one warning).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field

from ckptflow.steps.checkpoint.tier.peer_wire import BadRequest, PeerError

log = logging.getLogger("ckptflow.tier.peers")

_warned: set[str] = set()
MAX_HOST = 253  # a DNS name or an IP address
MAX_NODE = 253  # a Kubernetes node name


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def replica_targets(rank: int, nodes_by_rank: list[str], replicas: int) -> list[int]:
    """The ranks that hold replicas of `rank`'s pieces: `replicas` ranks on other nodes (see
    the module's docstring: a ring over the sorted distinct node names), nearest node first.
    Fewer when the gang has fewer other nodes (a warning, once)."""
    if replicas <= 0:
        return []
    nodes = sorted(set(nodes_by_rank))
    others = len(nodes) - 1
    if replicas > others:
        _warn_once(
            f"replicas={replicas} but the gang spans {len(nodes)} node(s): each local piece "
            f"gets {others} replica(s) on other nodes (set pretrain.replicas below the node count)"
        )
        replicas = others
    on_node: dict[str, list[int]] = {n: [] for n in nodes}
    for r, node in enumerate(nodes_by_rank):
        on_node[node].append(r)
    mine = nodes_by_rank[rank]
    i, position = nodes.index(mine), on_node[mine].index(rank)
    out = []
    for j in range(1, replicas + 1):
        ranks = on_node[nodes[(i + j) % len(nodes)]]
        out.append(ranks[position % len(ranks)])
    return out


@dataclass(frozen=True)
class PeerEntry:
    """How to reach one rank's peer server: (host, port), the node it runs on, and the run's
    token its requests need (kept out of repr: it never reaches a log line)."""

    rank: int
    host: str
    port: int
    node: str
    token: str = field(repr=False)


def _entry(rank: int, doc, token: str) -> PeerEntry:
    """One rank's gathered (host, port, node), validated (a gathered object is still input)."""
    if not isinstance(doc, dict):
        raise BadRequest(f"rank {rank}: gathered peer address is not a dict")
    host, port, node = doc.get("host"), doc.get("port"), doc.get("node")
    if not isinstance(host, str) or not 0 < len(host) <= MAX_HOST:
        raise BadRequest(f"rank {rank}: invalid peer host {str(host)[:60]!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise BadRequest(f"rank {rank}: invalid peer port {str(port)[:20]!r}")
    if not isinstance(node, str) or not 0 < len(node) <= MAX_NODE:
        raise BadRequest(f"rank {rank}: invalid node name {str(node)[:60]!r}")
    return PeerEntry(rank, host, port, node, token)


@dataclass(frozen=True)
class PeerDirectory:
    """Every rank's peer server, indexed by rank (`entries[r]`)."""

    entries: tuple[PeerEntry, ...]

    @property
    def nodes_by_rank(self) -> list[str]:
        return [e.node for e in self.entries]

    def targets(self, rank: int, replicas: int) -> list[PeerEntry]:
        """The entries of `rank`'s replica holders (replica_targets)."""
        return [self.entries[t] for t in replica_targets(rank, self.nodes_by_rank, replicas)]

    @classmethod
    def gather(
        cls, group, rank: int, node_name: str, link, *, problem: str = "", all_gather=None
    ) -> PeerDirectory:
        """Every rank's (host, port, node) with one all_gather_object on `group` (a
        collective: every rank of the group calls it once, after starting its PeerLink);
        rank 0's random token goes with it and is set on `link`, which serves nothing
        before. A rank whose server could not start passes link=None and its `problem`:
        then every rank raises the same PeerError naming it (the gang agrees: no replicas).
        `all_gather(out, obj, group)` defaults to torch.distributed's (a test passes its
        own with a group that has `size()`)."""
        if all_gather is None:
            import torch.distributed as dist

            def all_gather(out, obj, group):
                dist.all_gather_object(out, obj, group=group)

            world = dist.get_world_size(group)
        else:
            world = group.size()
        mine: dict = {"node": node_name}
        if link is None:
            mine["error"] = (problem or "no peer server")[:300]
        else:
            mine["host"], mine["port"] = link.address
        if rank == 0:
            mine["token"] = secrets.token_hex(16)
        gathered: list = [None] * world
        all_gather(gathered, mine, group)
        failed = [
            (r, d["error"]) for r, d in enumerate(gathered) if isinstance(d, dict) and "error" in d
        ]
        if failed:
            r, why = failed[0]
            more = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
            raise PeerError(f"rank {r} has no peer server{more}: {str(why)[:300]}")
        first = gathered[0] if isinstance(gathered[0], dict) else {}
        token = first.get("token")
        if not isinstance(token, str) or len(token) != 32:
            raise BadRequest("rank 0 gathered no valid peer token")
        directory = cls(tuple(_entry(r, d, token) for r, d in enumerate(gathered)))
        link.token = token
        return directory
