"""The paper's divergence term over all clients: Delta^t = (1/C) sum_i ||w_prev_i - w^t||^2.

FedInit's Theorem 1 and Figure 2 (its Table 10) measure how far every client's last local
model w_prev_i lies from the global model w^t, over ALL C clients. The round row's
``divergence`` is another quantity: (1/|S|) sum over the round's sampled clients of
||w_iK - w_{t+1}||^2. Every ``divergence-every`` rounds (and the last) the server sends the
global model to all clients or a fixed seeded sample (``divergence-clients``) in evaluate
messages; each client answers the squared distance from its stored w_prev (w_0 for a client
that has not trained yet: what RI would start it from; counted in ``divergence-untrained``).
The mean goes into ``divergence-all`` (every client answered for) or ``divergence-sample``;
``divergence-trained`` is the mean over the answering clients that have trained (in a short run
the ones still at w_0 dominate the paper's mean; over the paper's 500 rounds they vanish).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from server_app.federated_eval import ClientQuery, usable_replies
from strategies.personal_summary import sample_clients

SAMPLE_STREAM = 17
"""Seed-sequence word of the sampled clients (apart from training and the evaluations)."""
FIELDS: tuple[str, ...] = ("divergence-all", "divergence-sample", "divergence-trained",
                           "divergence-clients", "divergence-untrained", "divergence-seconds")
"""Round-row fields of the all-client divergence (absent in rounds without one)."""


def due(cfg: RunConfig, server_round: int) -> bool:
    """Whether ``server_round`` measures it: every ``divergence-every`` rounds and the last."""
    every = cfg.eval.divergence_every
    return every > 0 and (server_round % every == 0 or server_round == cfg.train.num_server_rounds)


def divergence_clients(cfg: RunConfig) -> list[int]:
    """All clients, or a sample seeded by the run's seed alone (the same each time)."""
    return sample_clients(cfg.seed, SAMPLE_STREAM, cfg.eval.divergence_clients, cfg.num_clients)


def decode(metrics: Mapping[str, object]) -> tuple[float, bool] | str:
    """(squared distance, trained) of a reply, or why it cannot be used (one line)."""
    sq, trained = metrics.get(rk.SQ_DISTANCE), metrics.get(rk.HAS_TRAINED)
    if not isinstance(sq, float) or not math.isfinite(sq) or sq < 0:
        return f"{rk.SQ_DISTANCE}={sq!r} is not a finite number >= 0"
    if trained not in (0, 1):
        return f"{rk.HAS_TRAINED}={trained!r} is not 0 or 1"
    return sq, bool(trained)


class ClientDivergence(ClientQuery):
    """Asks the clients for ||w_prev_i - w^t||^2 and averages the answers."""

    flag = rk.DIVERGENCE_EVAL

    def __init__(self, cfg: RunConfig, node_of_client: Mapping[int, int],
                 available: Callable[[], Sequence[int]] | None = None) -> None:
        super().__init__(cfg, node_of_client, available, divergence_clients(cfg))
        self.every_client = len(self.clients) == cfg.num_clients
        self.last: dict[int, float] = {}
        """Client id -> its squared distance, from the last measurement."""

    def __call__(self, grid: Grid, server_round: int, arrays: ArrayRecord,
                 config: ConfigRecord) -> dict[str, Any]:
        """The round row's fields (empty in rounds without a measurement)."""
        if not due(self.cfg, server_round):
            return {}
        t0 = time.monotonic()
        messages, sent_to = self.messages(server_round, arrays, config)
        replies = list(grid.send_and_receive(messages, timeout=self.cfg.fleet.round_timeout))
        usable = usable_replies(server_round, replies, sent_to,
                                lambda _client, metrics: decode(metrics), "divergence")
        found = {client: sq for client, (sq, _) in usable}
        trained = [sq for _, (sq, has_trained) in usable if has_trained]
        untrained = len(usable) - len(trained)
        self.last = found
        # every answer counts once whatever the reply order: exactly rounded sum
        mean = math.fsum(found.values()) / len(found) if found else None
        complete = self.every_client and len(found) == self.cfg.num_clients
        return {"divergence-all" if complete else "divergence-sample": mean,
                "divergence-trained": math.fsum(trained) / len(trained) if trained else None,
                "divergence-clients": len(found), "divergence-untrained": untrained,
                "divergence-seconds": time.monotonic() - t0}

