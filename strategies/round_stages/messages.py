"""Stage 2, what is sent: the model, the round's settings and the method's extra arrays, per
sampled client (its own content where the method gives each client its own)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import pack
from fedinit.methods.weights import Weights, stacked
from strategies.round_stages.held import HeldMethod

ClientConfig = Callable[[ConfigRecord, int], ConfigRecord]
"""The round's settings for one client: (round config, client id) -> its config."""


def for_client(config: ConfigRecord, client_id: int) -> ConfigRecord:
    """The round's settings with the client the message is for (``rk.CLIENT_ID``)."""
    return ConfigRecord({**dict(config), rk.CLIENT_ID: client_id})


@dataclasses.dataclass
class TrainMessages:
    """Builds a round's train messages; ``client_config`` adds each client's own settings
    (its id and accounted round: ``MethodStrategy._client_config``)."""

    cfg: RunConfig
    method: HeldMethod
    node_of_partition: Mapping[int, int]
    client_config: ClientConfig

    def __call__(self, server_round: int, arrays: ArrayRecord, w_t: Weights,
                 config: ConfigRecord, chosen: Sequence[int],
                 ) -> tuple[list[Message], dict[int, int]]:
        """The messages to ``chosen`` and {node id: client id} of them; ``w_t`` is
        ``arrays`` decoded (once, by the caller)."""
        c = self.cfg
        round_config = ConfigRecord(
            {**dict(config), rk.ROUND: server_round, rk.LR: c.train.lr_at(server_round),
             rk.BETA: c.train.beta, rk.UPLOAD_DELTA: c.train.ri_aggregation == "update"}
        )
        # the client halves compress as the message asks; under SecAgg+ the masked upload is
        # the codec (its field quantises to the codec's bits: RunConfig.secagg_bits)
        if c.train.compression != "off" and c.privacy.secure_aggregation == "off":
            round_config[rk.COMPRESSION] = c.train.compression
        extras = {k: pack(v) for k, v in self.method.rule.down(self.method.state).items()}
        messages, sent_to = [], {}
        for cid in chosen:
            node = self.node_of_partition[cid]
            sent_to[node] = cid
            model, own = self.content_for(cid, arrays, extras, w_t)
            content = RecordDict({rk.ARRAYS: model,
                                  rk.CONFIG: self.client_config(round_config, cid), **own})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages, sent_to

    def evaluated_for(self, cid: int, arrays: ArrayRecord, w_t: Weights) -> ArrayRecord:
        """The model client ``cid`` is scored on in personalized evaluation: the method's
        own choice for it (``ServerRule.evaluated_model``), else its train message's model."""
        own = self.method.rule.evaluated_model(self.method.state, cid, w_t)
        if own is not None:
            return pack(own)
        return self.content_for(cid, arrays, {}, w_t)[0]

    def evaluation_choices_for(self, cid: int, w_t: Weights) -> dict[str, ArrayRecord]:
        """The models client ``cid`` chooses its personalized-evaluation model from, by its
        own training loss (``ServerRule.evaluation_choices``), stacked under
        ``rk.EVAL_CHOICES``; nothing when the method offers no choice."""
        choices = self.method.rule.evaluation_choices(self.method.state, cid)
        if not choices:
            return {}
        return {rk.EVAL_CHOICES: pack(stacked(choices, w_t))}

    def content_for(self, cid: int, arrays: ArrayRecord, extras: dict[str, ArrayRecord],
                    w_t: Weights) -> tuple[ArrayRecord, dict[str, ArrayRecord]]:
        """The model and extra records client ``cid`` receives: the shared ones, unless the
        method gives each client its own (``ServerRule.down_to``)."""
        own = self.method.rule.down_to(self.method.state, cid, w_t)
        if own is None:
            return arrays, extras
        return pack(own.model), {k: pack(v) for k, v in own.extras.items()}
