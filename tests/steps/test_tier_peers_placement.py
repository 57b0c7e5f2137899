"""Replica placement (issue 35): R ranks on other nodes, a ring over the sorted node names, so
the loss of any one node leaves a copy of every piece."""

from __future__ import annotations

import logging

import pytest
from ckptflow.steps.checkpoint.tier import placement
from ckptflow.steps.checkpoint.tier.placement import replica_targets


def layouts(nodes: int, ranks: int):
    """Ways `ranks` ranks spread over `nodes` nodes (each node has one at least): blocked
    (torchrun's local ranks), round-robin, and all but one on the first node."""
    names = [f"node-{chr(ord('a') + n)}" for n in range(nodes)]
    blocked = [names[min(r * nodes // ranks, nodes - 1)] for r in range(ranks)]
    robin = [names[r % nodes] for r in range(ranks)]
    skewed = [names[0]] * (ranks - nodes + 1) + names[1:]
    return [lay for lay in (blocked, robin, skewed) if len(set(lay)) == nodes]


CASES = [
    (nodes, ranks, lay)
    for nodes in range(1, 5)
    for ranks in range(nodes, 9)
    for lay in layouts(nodes, ranks)
]


@pytest.mark.parametrize("replicas", [0, 1, 2, 3, 4])
def test_every_piece_survives_the_loss_of_any_one_node(replicas, caplog):
    assert len(CASES) > 40
    for nodes, ranks, by_rank in CASES:
        targets = {r: replica_targets(r, by_rank, replicas) for r in range(ranks)}
        for r, held in targets.items():
            assert len(held) == min(replicas, nodes - 1), (by_rank, r, held)
            assert all(by_rank[t] != by_rank[r] for t in held)  # always on another node
            assert len({by_rank[t] for t in held}) == len(held)  # each on a node of its own
        for lost in set(by_rank):
            for r in range(ranks):
                copies = {by_rank[r], *(by_rank[t] for t in targets[r])}
                if replicas >= 1 and nodes >= 2:
                    assert copies - {lost}, (by_rank, lost, r)


def test_ring_order_and_spread():
    by_rank = ["b", "b", "a", "a", "c", "c"]  # node names sorted: a, b, c
    assert replica_targets(2, by_rank, 1) == [0]  # a -> b, first rank there
    assert replica_targets(3, by_rank, 1) == [1]  # a -> b, second rank there
    assert replica_targets(0, by_rank, 2) == [4, 2]  # b -> c, then a
    assert replica_targets(5, by_rank, 1) == [3]  # c -> a (the ring wraps)
    # each rank of a node holds one replica of that node's ranks: the load spreads
    held = [t for r in range(6) for t in replica_targets(r, by_rank, 1)]
    assert sorted(held) == list(range(6))


def test_more_replicas_than_other_nodes_warn_once(caplog):
    placement._warned.clear()
    with caplog.at_level(logging.WARNING, logger="ckptflow.tier.peers"):
        assert replica_targets(0, ["a", "b"], 2) == [1]
        assert replica_targets(1, ["a", "b"], 2) == [0]
        assert replica_targets(0, ["a", "a"], 1) == []  # one node: nowhere to go
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "replicas=2" in lines[0] and "2 node(s)" in lines[0] and "1 replica(s)" in lines[0]
    assert "replicas=1" in lines[1] and "0 replica(s)" in lines[1]
