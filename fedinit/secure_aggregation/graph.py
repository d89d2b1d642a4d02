"""The SecAgg+ communication graph: a ring in which each client shares with k neighbours."""

from __future__ import annotations


def ring_neighbours(node_ids: list[int], num_shares: int) -> dict[int, list[int]]:
    """Each id's neighbourhood (itself included), sorted: (k-1)/2 ring neighbours each side.

    With k >= len(node_ids) the graph is complete (plain SecAgg). The relation is
    symmetric, so a pairwise mask i adds is one its neighbour j subtracts.
    """
    ids = sorted(node_ids)
    n = len(ids)
    if num_shares >= n:
        return {i: list(ids) for i in ids}
    half = num_shares // 2
    return {ids[p]: sorted(ids[(p + d) % n] for d in range(-half, half + 1)) for p in range(n)}
