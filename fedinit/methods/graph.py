"""The FL network's similarity graph (book sections 3.3, 5.6): read from a file of weighted
edges or learned as k nearest neighbours by cosine similarity of the clients' recent updates.

An undirected graph is two arrays: ``edges`` (E, 2) int64 with i < j and ``weights`` (E,)
float64 > 0 (A_ii'). Updates are compared through a fixed, seeded count sketch of SKETCH_DIM
numbers per client, so the server keeps N x SKETCH_DIM floats (10 MB at 10,000 clients), not
N models; the sketch preserves inner products in expectation, and a model with at most
SKETCH_DIM numbers is kept exactly (identity). Pure numpy.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from fedinit.methods.weights import Weights

SKETCH_DIM = 256
"""Numbers kept per client to compare updates."""
SKETCH_SEED = 20240
"""The count sketch's hash (fixed, so a resumed or repeated run sketches identically)."""
BLOCK = 1024
"""Rows of the similarity matrix computed at once (memory BLOCK x N floats)."""
FILE_PREFIX = "file:"


class GraphError(ValueError):
    """A graph file that cannot be used: one line naming the file, the line and the problem."""


def grown_rows(a: np.ndarray, n: int) -> np.ndarray:
    """A copy of ``a`` with at least ``n`` rows, new rows zero: per-client server state grows
    when clients join late (new partition ids)."""
    if len(a) >= n:
        return a.copy()
    return np.concatenate([a, np.zeros((n - len(a), *a.shape[1:]), dtype=a.dtype)])


def empty() -> list[np.ndarray]:
    """A graph without edges."""
    return [np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.float64)]


def read_edges(path: Path) -> list[np.ndarray]:
    """Edges from a text file, one ``i j [weight]`` per line (weight 1 when absent; '#'
    starts a comment); an edge given twice keeps its last weight."""
    if not path.is_file():
        raise GraphError(f"graph file {path} does not exist")
    found: dict[tuple[int, int], float] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"graph file {path} line {number} ({line.strip()!r})"
        try:
            i, j = int(words[0]), int(words[1])
            weight = float(words[2]) if len(words) > 2 else 1.0
        except (ValueError, IndexError):
            raise GraphError(f"{where}: expected 'i j [weight]' with integer client ids"
                             ) from None
        if len(words) > 3 or i < 0 or j < 0 or i == j:
            raise GraphError(f"{where}: expected two different client ids >= 0 and at most "
                             "a weight")
        if not (math.isfinite(weight) and weight > 0.0):
            raise GraphError(f"{where}: the weight must be a finite number > 0")
        found[(min(i, j), max(i, j))] = weight
    keys = sorted(found)
    return [np.asarray(keys, dtype=np.int64).reshape(-1, 2),
            np.asarray([found[k] for k in keys], dtype=np.float64)]


def check_ids(graph: list[np.ndarray], num_clients: int, source: str) -> None:
    """Every edge's ends are clients of the federation."""
    if len(graph[0]) and int(graph[0].max()) >= num_clients:
        raise GraphError(f"graph {source} names client {int(graph[0].max())}; the federation "
                         f"has clients 0..{num_clients - 1}")


def neighbours(graph: list[np.ndarray], node: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, weights) of ``node``'s neighbours, ids ascending."""
    edges, weights = graph
    at_i, at_j = edges[:, 0] == node, edges[:, 1] == node
    ids = np.concatenate([edges[at_i, 1], edges[at_j, 0]])
    wts = np.concatenate([weights[at_i], weights[at_j]])
    order = np.argsort(ids, kind="stable")
    return ids[order], wts[order]


@functools.cache
def _hash(dim: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SKETCH_SEED)
    return rng.integers(0, SKETCH_DIM, size=dim), rng.choice([-1.0, 1.0], size=dim)


def sketch(vector: Weights) -> np.ndarray:
    """SKETCH_DIM numbers whose inner products estimate the flattened vectors' (exact when
    the model has at most SKETCH_DIM numbers)."""
    flat = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in vector])
    if flat.size <= SKETCH_DIM:
        return np.pad(flat, (0, SKETCH_DIM - flat.size)).astype(np.float32)
    bucket, sign = _hash(flat.size)
    return np.bincount(bucket, weights=sign * flat, minlength=SKETCH_DIM).astype(np.float32)


def unit_rows(sketches: np.ndarray) -> np.ndarray:
    """Rows scaled to norm 1 (zero rows stay zero): cosine similarity is their dot product."""
    norms = np.linalg.norm(sketches.astype(np.float64), axis=1, keepdims=True)
    return np.divide(sketches, norms, out=np.zeros(sketches.shape), where=norms > 0)


def knn_graph(sketches: np.ndarray, known: np.ndarray, k: int) -> list[np.ndarray]:
    """Each known client linked (weight 1) to its ``k`` most cosine-similar known clients;
    the union of those links, so the graph is undirected. Ties go to the lower client id."""
    ids = np.flatnonzero(known)
    if len(ids) < 2:
        return empty()
    unit = unit_rows(sketches[ids])
    k = min(k, len(ids) - 1)
    pairs: set[tuple[int, int]] = set()
    for lo in range(0, len(ids), BLOCK):
        sims = unit[lo:lo + BLOCK] @ unit.T
        rows = np.arange(sims.shape[0])
        sims[rows, lo + rows] = -np.inf  # not its own neighbour
        # stable sort of -similarity: equal similarities keep the lower id first
        best = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        for r, cols in enumerate(best):
            i = int(ids[lo + r])
            for c in cols:
                j = int(ids[c])
                pairs.add((min(i, j), max(i, j)))
    keys = sorted(pairs)
    return [np.asarray(keys, dtype=np.int64).reshape(-1, 2), np.ones(len(keys))]


def as_json(graph: list[np.ndarray]) -> list[list[float]]:
    """The edge list [[i, j, A_ij], ...] for the results."""
    return [[int(i), int(j), float(w)] for (i, j), w in zip(graph[0], graph[1], strict=True)]
