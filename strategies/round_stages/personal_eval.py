"""The personalized evaluation flow (``personal-eval-every``): who is asked, what they get
(the global model, or the client's own content from ``ServerRule.down_to`` or
``ServerRule.evaluated_model``), and the summary
of their scores (``strategies.personal_summary``). The server's other evaluation flows are
``server_app/federated_eval.py`` and ``server_app/client_divergence.py``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from logging import WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from strategies import personal_summary
from strategies.round_stages.messages import TrainMessages, for_client


@dataclasses.dataclass
class PersonalEvaluation:
    """Messages to the evaluated clients that are online in the rounds it is due, and the
    mean, p10 and min of each accuracy over their replies; ``scores`` keeps the last
    evaluation's per-client scores (the per-client file)."""

    cfg: RunConfig
    node_of_partition: Mapping[int, int]
    available: Callable[[], Collection[int]]
    content: TrainMessages
    """Whose ``evaluated_for`` gives each client's model."""
    sent_to: dict[int, int] = dataclasses.field(default_factory=dict)
    scores: list[personal_summary.ClientScores] = dataclasses.field(default_factory=list)

    def messages(self, server_round: int, arrays: ArrayRecord,
                 config: ConfigRecord) -> list[Message]:
        c = self.cfg
        self.sent_to = {}
        if not personal_summary.due(c, server_round):
            return []
        w_t = unpack(arrays)
        eval_config = ConfigRecord({**dict(config), rk.ROUND: server_round,
                                    rk.LR: c.train.lr_at(server_round), rk.PERSONAL_EVAL: True})
        messages = []
        online = set(self.available())
        for cid in personal_summary.eval_clients(c):
            if cid not in online:  # not identified or not connected: no score this time
                continue
            node = self.node_of_partition[cid]
            self.sent_to[node] = cid
            model = self.content.evaluated_for(cid, arrays, w_t)
            content = RecordDict({rk.ARRAYS: model, rk.CONFIG: for_client(eval_config, cid),
                                  **self.content.evaluation_choices_for(cid, w_t)})
            messages.append(
                Message(content=content, message_type=MessageType.EVALUATE, dst_node_id=node))
        return messages

    def summary(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The summary of the usable replies (each other one logged); None when no client
        was asked this round."""
        scores: list[personal_summary.ClientScores] = []
        for msg in replies:
            node = msg.metadata.src_node_id
            decoded: personal_summary.ClientScores | str
            if msg.has_error():
                decoded = f"client error: {msg.error.reason}"
            elif node not in self.sent_to:
                decoded = "evaluation reply from a node that was not asked"
            elif rk.METRICS not in msg.content.metric_records:
                decoded = f"missing MetricRecord {rk.METRICS!r}"
            else:
                decoded = personal_summary.decode(self.sent_to[node],
                                                  msg.content.metric_records[rk.METRICS])
            if isinstance(decoded, str):
                log(WARNING, "round %d: ignored the evaluation reply of node %s (partition "
                    "%s): %s", server_round, node, self.sent_to.get(node, "?"), decoded)
                continue
            scores.append(decoded)
        self.scores = scores
        if not self.sent_to:
            return None
        return MetricRecord(personal_summary.summarize(scores))
