"""Federated evaluation: the global model's accuracy curve from the clients' local test splits.

For a run whose server holds no test set (device data, ``evaluation=federated|auto``): in
every round the central evaluation would run (each ``eval-every``-th and the last), the global
model goes out in Flower evaluate messages to all clients or a seeded sample
(``federated-eval-clients``, the same clients each time); each client scores it on its local
test split; the round's ``test-loss`` and ``test-acc`` are the example-weighted means (each
test example counts once, as in a central test set). A client that fails or does not answer
in ``round-timeout`` is logged and left out of that round's mean.

The plumbing is the personalized evaluation's: the same node map, sampling rule and
send/receive; only the message flag and the sum differ.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from logging import WARNING
from typing import Any, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from strategies.personal_summary import sample_clients

T = TypeVar("T")
SAMPLE_STREAM = 16
"""Seed-sequence word of the evaluated-client sample (apart from training and personal eval)."""
FIELDS: tuple[str, ...] = ("fed-eval-clients", "fed-eval-examples", "fed-eval-seconds")
"""Round-row fields of a federated evaluation (absent in rounds without one)."""


def eval_clients(cfg: RunConfig) -> list[int]:
    """Client ids evaluated: all, or a sample seeded by the run's seed alone."""
    return sample_clients(cfg.seed, SAMPLE_STREAM, cfg.eval.federated_eval_clients, cfg.num_clients)


@dataclass(frozen=True)
class LocalScore:
    """One client's reply: its local test size, and loss and accuracy there."""

    client: int
    num_test: int
    loss: float
    acc: float


def decode(client: int, metrics: Mapping[str, object]) -> LocalScore | str:
    """A reply's score, or why it cannot be used (one line). A client without a local test
    split (num-test 0) scores nothing and weighs nothing."""
    n = metrics.get(rk.NUM_TEST)
    if not isinstance(n, int) or n < 0:
        return f"{rk.NUM_TEST}={n!r} is not an integer >= 0"
    if n == 0:
        return LocalScore(client, 0, 0.0, 0.0)
    loss, acc = metrics.get(rk.EVAL_LOSS), metrics.get(rk.EVAL_ACC)
    if not isinstance(loss, int | float) or not math.isfinite(float(loss)) or loss < 0:
        return f"{rk.EVAL_LOSS}={loss!r} is not a finite loss >= 0"
    if not isinstance(acc, int | float) or not 0.0 <= float(acc) <= 1.0:
        return f"{rk.EVAL_ACC}={acc!r} is not an accuracy in [0, 1]"
    return LocalScore(client, n, float(loss), float(acc))


def weighted_mean(scores: Sequence[LocalScore]) -> tuple[float | None, float | None]:
    """(loss, accuracy) averaged over the clients' test examples: sum n_i x_i / sum n_i;
    (None, None) when no client had a test example. fsum: exact, whatever the reply order."""
    total = sum(s.num_test for s in scores)
    if total == 0:
        return None, None
    return (math.fsum(s.num_test * s.loss for s in scores) / total,
            math.fsum(s.num_test * s.acc for s in scores) / total)


def evaluate_messages(clients: Sequence[int], node_of_client: Mapping[int, int],
                      available: Callable[[], Sequence[int]] | None, arrays: ArrayRecord,
                      conf: ConfigRecord) -> tuple[list[Message], dict[int, int]]:
    """Evaluate messages with ``arrays`` and ``conf`` (plus each one's client id) to those of
    ``clients`` whose node is known and connected, and {node id: client id} they went to."""
    messages, sent_to = [], {}
    online = None if available is None else set(available())
    for client in clients:
        node = node_of_client.get(client)
        if node is None or (online is not None and client not in online):
            continue  # not identified yet, or its node is gone: it would only cost a wait
        sent_to[node] = client
        mine = ConfigRecord({**dict(conf), rk.CLIENT_ID: client})
        messages.append(Message(content=RecordDict({rk.ARRAYS: arrays, rk.CONFIG: mine}),
                                message_type=MessageType.EVALUATE, dst_node_id=node))
    return messages, sent_to


def usable_replies(server_round: int, replies: Sequence[Message], sent_to: Mapping[int, int],
                   decode: Callable[[int, Mapping[str, Any]], T | str],
                   what: str) -> list[tuple[int, T]]:
    """(client id, decoded metrics) of each usable evaluate reply; an error reply, one from a
    node that was not asked, one without metrics or one ``decode`` refuses (a one-line
    reason) is logged as an ignored ``what`` reply and left out."""
    out: list[tuple[int, T]] = []
    for msg in replies:
        node = msg.metadata.src_node_id
        decoded: T | str
        if msg.has_error():
            decoded = f"client error: {msg.error.reason}"
        elif node not in sent_to:
            decoded = f"{what} reply from a node that was not asked"
        elif rk.METRICS not in msg.content.metric_records:
            decoded = f"missing MetricRecord {rk.METRICS!r}"
        else:
            decoded = decode(sent_to[node], msg.content.metric_records[rk.METRICS])
        if isinstance(decoded, str):
            log(WARNING, "round %d: ignored the %s reply of node %s (client %s): %s",
                server_round, what, node, sent_to.get(node, "?"), decoded)
            continue
        out.append((sent_to[node], decoded))
    return out


class ClientQuery:
    """Evaluate messages flagged ``flag`` to a fixed set of clients (those whose node is known
    and connected): what federated evaluation and the all-client divergence both send."""

    flag: str
    """The evaluate message's flag (``fedinit/methods/wire.py``) that tells the client what to
    answer."""

    def __init__(self, cfg: RunConfig, node_of_client: Mapping[int, int],
                 available: Callable[[], Sequence[int]] | None, clients: Sequence[int]) -> None:
        self.cfg = cfg
        self.node_of_client = node_of_client
        """Client id -> node id, the map the strategy samples from (kept current)."""
        self.available = available
        """The clients whose node is connected now (``Fleet.available``); None: all known."""
        self.clients = clients

    def messages(self, server_round: int, arrays: ArrayRecord,
                 config: ConfigRecord) -> tuple[list[Message], dict[int, int]]:
        """The evaluate messages and {node id: client id} they went to."""
        conf = ConfigRecord({**dict(config), rk.ROUND: server_round,
                             rk.LR: self.cfg.train.lr_at(server_round), self.flag: True})
        return evaluate_messages(self.clients, self.node_of_client, self.available, arrays, conf)


class FederatedEvaluator(ClientQuery):
    """Sends the global model to the evaluated clients and averages their scores."""

    flag = rk.FEDERATED_EVAL

    def __init__(self, cfg: RunConfig, node_of_client: Mapping[int, int],
                 available: Callable[[], Sequence[int]] | None = None) -> None:
        super().__init__(cfg, node_of_client, available, eval_clients(cfg))
        self.last_scores: list[LocalScore] = []

    def scores(self, server_round: int, replies: Sequence[Message],
               sent_to: Mapping[int, int]) -> list[LocalScore]:
        """The usable replies' scores; each unusable one is logged with its reason."""
        usable = usable_replies(server_round, replies, sent_to, decode, "federated-evaluation")
        return sorted((score for _, score in usable), key=lambda s: s.client)

    def __call__(self, grid: Grid, server_round: int, arrays: ArrayRecord,
                 config: ConfigRecord) -> tuple[float | None, float | None, dict[str, Any]]:
        """(loss, accuracy, the round row's federated-evaluation fields)."""
        t0 = time.monotonic()
        messages, sent_to = self.messages(server_round, arrays, config)
        replies = list(grid.send_and_receive(messages, timeout=self.cfg.fleet.round_timeout))
        self.last_scores = self.scores(server_round, replies, sent_to)
        loss, acc = weighted_mean(self.last_scores)
        fields = {"fed-eval-clients": sum(1 for s in self.last_scores if s.num_test > 0),
                  "fed-eval-examples": sum(s.num_test for s in self.last_scores),
                  "fed-eval-seconds": time.monotonic() - t0}
        return loss, acc, fields
