"""FedRelax's graph learned from how well one client's model fits another's data
(``graph=loss``; the book's sections 7.2-7.3: edges chosen by measuring the (dis)similarity of
local data sets, here by the loss of client j's model on client i's data).

At a measurement client i receives the latest models of a few candidate clients, computes the
mean loss of each on its own training data (no gradient; the loss path clustered FL uses) and
reports one number per candidate (``fedrelax-loss-<j>``); its data never leaves it. The server
keeps each client's ``graph-k`` lowest-loss candidates, none past the widest gap among its 2k
lowest losses (its choice), and links i and j (A_ij =
1) when either chose the other: the union, as the knn graph. Candidates: every other client
with a stored model when there are at most ``graph-candidates``, else the client's current
choice plus a sample of the others, seeded by the round and the client (so the choice can
only improve or follow changed models); under FedRelax's warm start a client's model here is
its last warm-up upload until it uploads after the warm-up. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

SOURCE = "loss"
"""The ``graph`` value that selects this graph."""
CANDIDATES = "fedrelax-candidates"
"""Down arrays: the candidates' models, each parameter stacked, shape (M, *shape); M = 0 when
the client measures nothing this round."""
CANDIDATE_IDS = "fedrelax-candidate-ids"
"""Down array: [int64 (M,)], the candidates' client ids, in the order of ``CANDIDATES``."""
LOSS_PREFIX = "fedrelax-loss-"
"""Reply metrics: ``fedrelax-loss-<j>`` = the mean loss of candidate j's model on the
client's own training data (one float per candidate; nothing else about its data)."""
SAMPLE_SEED = 20241
"""Seed of the candidate sample (with the round and the client id)."""
NONE = -1
"""An empty slot in a client's choice."""


def loss_key(candidate: int) -> str:
    return f"{LOSS_PREFIX}{candidate}"


def due(measured: np.ndarray, pool: np.ndarray, cid: int, upcoming: int, every: int,
        available: int) -> bool:
    """Whether client ``cid``, sampled for round ``upcoming``, measures its candidates: when
    there are any (from round 2 on), at its first participation, once ``every`` rounds have
    passed since its last measurement, and whenever more candidates are available than its
    last choice was made from (``pool``: early choices, made among the few clients trained
    by then, are remade as the federation fills)."""
    if upcoming < 2 or available == 0:
        return False
    last = int(measured[cid]) if cid < len(measured) else 0
    scored = int(pool[cid]) if cid < len(pool) else 0
    return last == 0 or upcoming - last >= every or available > scored


def available(cid: int, version: np.ndarray, limit: int) -> int:
    """How many candidates ``cid`` would score now: the other clients with a model (``version``
    > 0), at most ``limit``."""
    have = int(np.count_nonzero(version > 0)) - int(cid < len(version) and version[cid] > 0)
    return min(have, limit)


def candidates(cid: int, version: np.ndarray, chosen: np.ndarray, limit: int,
               upcoming: int) -> np.ndarray:
    """Client ids whose models ``cid`` scores, ascending: every other client with a stored
    model if at most ``limit``, else its current choice plus a seeded sample of the rest."""
    have = np.asarray([j for j in np.flatnonzero(version > 0) if j != cid], dtype=np.int64)
    if len(have) <= limit:
        return have
    mine = chosen[cid] if cid < len(chosen) else np.zeros(0, dtype=np.int64)
    keep = np.intersect1d(mine[mine != NONE], have)
    rest = np.setdiff1d(have, keep)
    rng = np.random.default_rng((SAMPLE_SEED, upcoming, cid))
    picked = rng.choice(rest, size=limit - len(keep), replace=False)
    return np.sort(np.concatenate([keep, picked]).astype(np.int64))


def losses_problem(metrics: Mapping[str, Any], sent: np.ndarray) -> str | None:
    """Why a reply's losses cannot be used (one line), or None: one finite number for each
    candidate sent, and none for a client that was not sent."""
    want = {loss_key(int(j)) for j in sent}
    got = {k for k in metrics if k.startswith(LOSS_PREFIX)}
    names = ", ".join(str(int(j)) for j in sent) or "none"
    unknown = sorted(got - want)
    if unknown:
        return (f"metric {unknown[0]!r} is not the loss of a candidate this client was sent "
                f"(candidates: {names})")
    missing = sorted(want - got, key=lambda k: int(k.removeprefix(LOSS_PREFIX)))
    if missing:
        return (f"missing metric {missing[0]!r} (the loss of that candidate's model on the "
                f"client's data; candidates: {names})")
    for key in sorted(got):
        value = metrics[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                float(value)):
            return f"{key}={value!r} is not a finite number"
    return None


def lower_group(losses: np.ndarray, span: int | None = None) -> int:
    """How many of the ascending ``losses`` lie below the widest gap among the lowest
    ``span`` of them (all when fewer than 3): the candidates whose models fit the client's
    data clearly better than the next (a two-group split free of the losses' scale). The span
    keeps the gaps between the far groups (e.g. two other regimes) out of the comparison."""
    if len(losses) < 3:
        return len(losses)
    return int(np.argmax(np.diff(losses[:span]))) + 1


def choice(metrics: Mapping[str, Any], sent: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` candidates with the lowest reported loss (ties: the lower id), none above
    the widest gap among the 2k lowest losses (``lower_group``), padded with ``NONE`` to
    length ``k``; the metrics passed ``losses_problem``."""
    ids = np.sort(sent.astype(np.int64))
    losses = np.asarray([float(metrics[loss_key(int(j))]) for j in ids], dtype=np.float64)
    order = np.argsort(losses, kind="stable")
    best = ids[order[:min(k, lower_group(losses[order], 2 * k))]]
    return np.concatenate([np.sort(best), np.full(k - len(best), NONE, dtype=np.int64)])


def fit_better(nearest: np.ndarray, cid: int, metrics: Mapping[str, Any],
               sent: np.ndarray) -> None:
    """In place: ``cid`` becomes candidate j's nearest client (row j of ``nearest``: [1 +
    that client, its loss]) where its reported loss of j's model is the lowest so far, so a
    client no one chose can still be placed by whose data its model fits; the metrics passed
    ``losses_problem``."""
    for j in sent.astype(np.int64):
        loss = float(metrics[loss_key(int(j))])
        if nearest[j, 0] == 0 or loss < nearest[j, 1]:
            nearest[j] = (cid + 1, loss)


def union_graph(chosen: np.ndarray) -> list[np.ndarray]:
    """Edge {i, j} with A_ij = 1 when i chose j or j chose i (``fedinit.methods.graph``'s
    arrays)."""
    pairs = {(min(i, int(j)), max(i, int(j))) for i, row in enumerate(chosen)
             for j in row if j != NONE and j != i}
    keys = sorted(pairs)
    return [np.asarray(keys, dtype=np.int64).reshape(-1, 2), np.ones(len(keys))]


def grown_choice(chosen: np.ndarray, n: int) -> np.ndarray:
    """A copy of ``chosen`` (N, k) with at least ``n`` rows, new rows empty (``NONE``)."""
    out = np.full((max(n, len(chosen)), chosen.shape[1]), NONE, dtype=np.int64)
    out[:len(chosen)] = chosen
    return out
