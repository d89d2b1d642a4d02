"""Personalized evaluation, the server's side: who is asked, and what the replies sum up to.

Every ``personal-eval-every`` rounds the shell sends the global model in Flower evaluate
messages to all clients or a seeded sample (``personal-eval-clients``, the same clients each
time, so the curves follow one population). Each reply holds one client's accuracies on its
local test split of (a) the global model, (b) the global model fine-tuned locally, (c) its own
model; the round's figures are the mean, 10th percentile and minimum over clients, each client
counting once (how well the clients are served, not the examples).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedinit.config import RunConfig
from fedinit.methods import wire as rk

KINDS: dict[str, str] = {"global": rk.ACC_GLOBAL, "finetuned": rk.ACC_FINETUNED,
                         "own": rk.ACC_OWN}
"""Result name -> reply metric: (a) global, (b) fine-tuned, (c) the client's own model."""
STATS: tuple[str, ...] = ("mean", "p10", "min")
SAMPLE_STREAM = 15
"""Seed-sequence word of the evaluated-client sample (apart from the training samples)."""
FIELDS: tuple[str, ...] = (
    "local-eval-clients", "local-own-clients",
    *(f"local-{kind}-{stat}" for kind in KINDS for stat in STATS),
    "local-eval-messages", "local-eval-seconds")
"""Round-row fields of a personalized evaluation (absent in rounds without one)."""


def due(cfg: RunConfig, server_round: int) -> bool:
    """Whether ``server_round`` has a personalized evaluation."""
    every = cfg.eval.personal_eval_every
    return every > 0 and server_round % every == 0


def eval_clients(cfg: RunConfig) -> list[int]:
    """Partition ids evaluated: all, or a sample seeded by the run's seed alone."""
    return sample_clients(cfg.seed, SAMPLE_STREAM, cfg.eval.personal_eval_clients, cfg.num_clients)


def sample_clients(seed: int, stream: int, k: int, n: int) -> list[int]:
    """The evaluated clients of 0..n-1: all when k is 0 or >= n, else k of them drawn by
    (seed, stream) alone, so every evaluation of the run asks the same ones."""
    if k == 0 or k >= n:
        return list(range(n))
    rng = np.random.default_rng([seed, stream])
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


@dataclass(frozen=True)
class ClientScores:
    """One client's reply: its local test size and accuracies (None: no own model yet)."""

    partition_id: int
    num_test: int
    accs: Mapping[str, float | None]


def decode(partition_id: int, metrics: Mapping[str, object]) -> ClientScores | str:
    """A reply's scores, or why they cannot be used (one line)."""
    n = metrics.get(rk.NUM_TEST)
    if not isinstance(n, int) or n < 0:
        return f"{rk.NUM_TEST}={n!r} is not an integer >= 0"
    accs: dict[str, float | None] = {}
    for kind, key in KINDS.items():
        value = metrics.get(key)
        if value is None or n == 0:
            accs[kind] = None
        elif isinstance(value, int | float) and 0.0 <= float(value) <= 1.0:
            accs[kind] = float(value)
        else:
            return f"{key}={value!r} is not an accuracy in [0, 1]"
    if n > 0 and (accs["global"] is None or accs["finetuned"] is None):
        return f"missing {rk.ACC_GLOBAL} or {rk.ACC_FINETUNED}"
    return ClientScores(partition_id, n, accs)


def percentile10(values: Sequence[float]) -> float:
    """The 10th percentile (linear interpolation between the sorted values)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), 10))


def summarize(scores: Sequence[ClientScores]) -> dict[str, float | int]:
    """Mean, p10 and min of each kind over the clients that report it (and the counts)."""
    out: dict[str, float | int] = {
        "local-eval-clients": sum(1 for s in scores if s.num_test > 0),
        "local-own-clients": sum(1 for s in scores if s.accs.get("own") is not None)}
    for kind in KINDS:
        values = [v for s in scores if (v := s.accs.get(kind)) is not None]
        if values:
            # fsum is exactly rounded, so the mean does not depend on the order replies came in
            out[f"local-{kind}-mean"] = math.fsum(values) / len(values)
            out[f"local-{kind}-p10"] = percentile10(values)
            out[f"local-{kind}-min"] = float(min(values))
    return out


def client_rows(server_round: int, scores: Sequence[ClientScores]) -> list[dict[str, object]]:
    """The per-client file's rows for one evaluation, by partition id."""
    return [{"round": server_round, "partition-id": s.partition_id, "num-test": s.num_test,
             **{f"acc-{kind}": s.accs.get(kind) for kind in KINDS}}
            for s in sorted(scores, key=lambda s: s.partition_id)]
