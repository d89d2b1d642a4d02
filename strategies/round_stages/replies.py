"""What flows through the train round's stages: ``RoundReplies``, one value per round, each
stage returning a new one (``dataclasses.replace``), so a stage is tested by what it returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from logging import WARNING

from flwr.app import Message

from fedinit.methods import wire as rk
from fedinit.methods.method import ClientUpdate
from fedinit.methods.weights import Weights
from strategies.operator_log import log_line

Accepted = tuple[int, ClientUpdate]
"""A reply that passed the checks: (source node id, its decoded update)."""


@dataclasses.dataclass(frozen=True)
class RoundReplies:
    """One train round on the server, from the raw replies to the next model.

    Stages fill it in order: decoding sets ``accepted``, ``rejected``, ``missing`` and
    ``arrived``; the norm filter narrows ``accepted``; selection and DP set ``selected``;
    combining sets ``weights``, ``aggregate`` and ``finals``; the method update ``w_next``;
    the last stage the round's metrics. A stage that decides the round is not aggregated sets
    ``halted`` (the pipeline stops; the global model is unchanged).
    """

    server_round: int
    w_t: Weights
    """The global model sent this round."""
    sent_to: Mapping[int, int]
    """{node id: client id} of this round's train messages."""
    sampled: int
    """Clients sampled, messaged or not (under DP absent ones are not)."""
    messages: Sequence[Message] = ()
    """The replies as they came back."""
    accepted: tuple[Accepted, ...] = ()
    """Replies that passed the checks, in client order."""
    sent_ids: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """{message id: node id} of this round's train messages: the node an error reply that
    the SuperLink wrote for a dead node answers for (its source id is the SuperLink's)."""
    rejected: int = 0
    rejections: tuple[tuple[int, str], ...] = ()
    """(node id, reason) of each rejected reply, in the order they were rejected."""
    missing: int = 0
    arrived: int = 0
    """Sampled nodes whose reply came from the client (an error of the client's counts)."""
    norm_limit_used: float = 0.0
    """The largest norm / limit the norm filter saw (0 without a filter)."""
    upload_bytes: Mapping[int, int] | None = None
    """{client id: its reply's encoded upload payload bytes} of the replies that passed
    decoding (None under secure aggregation, whose masked uploads are not measured yet)."""
    selected: tuple[ClientUpdate, ...] | None = None
    """What is combined, when a stage narrowed or transformed ``accepted`` (None: all)."""
    unaccounted: frozenset[int] = frozenset()
    """Partitions among the contributions whose move counts but whose extra uploads are not
    summed and whose state is not accounted (a robust selection's screen)."""
    real: bool = True
    """False when the contributions stand for no client (DP's zero contribution)."""
    weights: tuple[float, ...] = ()
    aggregate: Weights | None = None
    """D, the round's aggregate update."""
    sums: Mapping[str, Weights] | None = None
    """Under secure aggregation: the sum over the contributions of the model upload (under
    ``rk.ARRAYS``: the moves) and of each extra upload (by name), the only per-round values
    the server sees (``SecureSum``); None where the uploads themselves are seen."""
    finals: Sequence[Weights] = ()
    """Each contribution's final model (for the divergence metric)."""
    w_next: Weights | None = None
    metrics: Mapping[str, int | float] = dataclasses.field(default_factory=dict)
    """Metrics beyond the counts (train loss, divergence)."""
    halted: bool = False

    @property
    def contributions(self) -> list[ClientUpdate]:
        """The updates combined: ``selected``, or every accepted one."""
        if self.selected is not None:
            return list(self.selected)
        return [u for _, u in self.accepted]

    @property
    def accounted(self) -> list[ClientUpdate]:
        """The contributions whose extra uploads count and whose state the server accounts."""
        return [u for u in self.contributions if u.partition_id not in self.unaccounted]

    def node_of(self, msg: Message) -> int:
        """The node ``msg`` answers for: the one its train message went to, else its source."""
        return self.sent_ids.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)

    def counts(self) -> dict[str, int | float]:
        """The round's reply counts, a metric row whether or not it was aggregated."""
        counts: dict[str, int | float] = {
            rk.NUM_REPLIES: len(self.accepted), rk.NUM_REJECTED: self.rejected,
            rk.NUM_MISSING: self.missing, rk.NORM_LIMIT_USED: self.norm_limit_used}
        if self.upload_bytes is not None:  # bytes-up: over the replies counted in num-replies
            counts[rk.BYTES_UP] = sum(self.upload_bytes[u.partition_id] for _, u in self.accepted)
        return counts


Stage = Callable[[RoundReplies], RoundReplies]
"""One step of the train round: a function of the round so far."""


def run_stages(stages: Sequence[Stage], replies: RoundReplies) -> RoundReplies:
    """Each stage in order, stopping after one that halts the round."""
    for stage in stages:
        replies = stage(replies)
        if replies.halted:
            break
    return replies


def log_rejected(replies: RoundReplies, node: int, reason: str, private: bool = False) -> None:
    """One warning per rejected reply, naming its node, client and reason (``private``,
    under DP: to the operator's file, as it names a sampled client)."""
    log_line(private, WARNING, "round %d: rejected reply of node %s (partition %s): %s",
             replies.server_round, node, replies.sent_to.get(node, "?"), reason)


def state_fallbacks(replies: list[Message]) -> int:
    """Clients of this round that could not use their saved state and fell back to an older
    version or to w_0 (they say so in their reply metrics)."""
    count = 0
    for msg in replies:
        if msg.has_error() or rk.METRICS not in msg.content.metric_records:
            continue
        value = msg.content.metric_records[rk.METRICS].get(rk.STATE_FALLBACK, 0)
        count += 1 if isinstance(value, int | float) and value > 0 else 0
    return count
