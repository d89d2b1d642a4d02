"""The one Flower strategy every method runs in: a thin adapter from Flower's ``Strategy`` API
to the server's round stages (``strategies/round_stages/``) around a pure core (the method's
``ServerRule`` in ``fedinit/methods/<method>.py``).

``configure_train`` runs the pipeline's sampler and message builder; ``aggregate_train``
passes the round's replies through its stages (decode and check once into ``ClientUpdate``s,
norm filter, quorum, robust selection, DP, combine under the RI variant, the method's pure
``ServerRule.update``, accounting). The pipeline is built once (``build_train_pipeline``), the
one place that reads whether DP is on. The method's typed state, the norm filter's history
and the accounted rounds are the checkpointed server state.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism
from fedinit.methods.method import ClientUpdate, ServerRule, ServerState
from fedinit.methods.packed_arrays import pack, unpack
from fedinit.methods.weights import Weights
from fedinit.store.server_models import ServerModels
from strategies import personal_summary
from strategies.round_stages import RoundReplies, TrainPipeline, build_train_pipeline
from strategies.round_stages.combine import reply_weights
from strategies.round_stages.decode import NOT_ARRIVED, DecodeReplies
from strategies.round_stages.held import ACCOUNTED_STATE, AccountedRounds, HeldMethod
from strategies.round_stages.messages import for_client
from strategies.round_stages.norm_filter import (
    FIRST_ROUND_FACTOR,
    MIN_ROUND_NORMS,
    NORM_HISTORY,
    NORMS_STATE,
    NormFilter,
    owned,
)
from strategies.round_stages.personal_eval import PersonalEvaluation
from strategies.round_stages.replies import Accepted
from strategies.run_reports import RunReports

__all__ = ["ACCOUNTED_STATE", "FIRST_ROUND_FACTOR", "MIN_ROUND_NORMS", "NORMS_STATE",
           "NORM_HISTORY", "NOT_ARRIVED", "SERVER_MODELS", "Accepted", "MethodStrategy"]

SERVER_MODELS = "server-models"
"""Folder of the run directory with the server's per-client models (FedRelax)."""


class MethodStrategy(Strategy):
    """Flower's side of every method; the method's own math is ``rule`` (a ServerRule)."""

    def __init__(self, cfg: RunConfig, node_of_partition: Mapping[int, int], w0: Weights, *,
                 examples: Sequence[int] | None,
                 available: Callable[[], Collection[int]] | None = None) -> None:
        """Everything the strategy needs, at construction (``for_run`` derives it from the
        run config): ``examples`` is each client's true training-example count, which its
        replies must claim, or None where the server cannot know it (device data: claims
        are only capped by ``max-examples-per-client``); no default, so a caller cannot drop
        the check by forgetting it."""
        self.cfg = cfg
        self.node_of_partition = node_of_partition
        """Client id -> node id: a live map (``server_app.clients.Fleet`` adds late joiners
        and moved nodes to it between rounds; a fixed dict where the federation is fixed)."""
        self.available = available or (lambda: list(self.node_of_partition))
        """The client ids that may be sampled now (identified, node connected)."""
        server = cfg.spec.server
        if cfg.train.server_momentum:  # the momentum's wrapper only for a run that sets it
            from fedinit.methods.async_server_opt import with_server_momentum

            server = with_server_momentum(server, cfg.train.server_momentum)
        rule: ServerRule = server(cfg.params)
        self.privacy = Mechanism.from_config(cfg)
        """Client-level DP (``dp``): re-clipping, the noise and the fixed denominator."""
        self.method = HeldMethod(rule, rule.init(w0))
        rule.bind(ServerModels(None), None)  # a run's own place: ``bind_run_dir``
        self.accounted_rounds = AccountedRounds()
        self.pipeline: TrainPipeline = build_train_pipeline(
            cfg, self.method, self.accounted_rounds, node_of_partition, self._client_config,
            examples)
        """The train round's stages; replace it (``TrainPipeline.inserted``) to add one."""
        self.last_rejections: dict[int, str] = {}
        """{node id: reason} of the last train round's rejected replies (the fleet page)."""
        self._w_t: Weights = []
        self._sent_to: dict[int, int] = {}
        self._sent_messages: list[Message] = []
        self._sampled = 0
        """Clients sampled this round, messaged or not (under DP absent ones are not)."""
        self.personal_eval = PersonalEvaluation(cfg, node_of_partition, self.available,
                                                self.pipeline.messages)
        """The personalized evaluation flow (``configure_evaluate``/``aggregate_evaluate``)."""

    # ---------------------------------------------------------------- views of the stages
    @property
    def rule(self) -> ServerRule:
        return self.method.rule

    @property
    def state(self) -> ServerState:
        """The method's typed server state (held by the stages that read and update it)."""
        return self.method.state

    @state.setter
    def state(self, value: ServerState) -> None:
        self.method.state = value

    @property
    def accounted(self) -> dict[int, int] | None:
        """Client id -> round of its last aggregated reply (None: not tracked)."""
        return self.accounted_rounds.rounds

    @accounted.setter
    def accounted(self, value: dict[int, int] | None) -> None:
        self.accounted_rounds.rounds = value

    @property
    def sampling_seed(self) -> int:
        """The sampler's seed: the run's, or a secret one under DP (amplification by
        sampling holds only if who was sampled is unknown; the run's seed is public)."""
        return self.pipeline.sampler.seed

    @sampling_seed.setter
    def sampling_seed(self, value: int) -> None:
        self.pipeline.sampler.seed = value

    @property
    def norm_filter(self) -> NormFilter | None:
        """The norm filter stage (None under DP, where clipping bounds every reply)."""
        found = self.pipeline.stage(NormFilter)
        return found if isinstance(found, NormFilter) else None

    @property
    def norm_history(self) -> dict[str, list[float]]:
        """Record name -> the norm filter's accepted norms (empty without a filter)."""
        return {} if self.norm_filter is None else self.norm_filter.history

    @property
    def decoder(self) -> DecodeReplies:
        found = self.pipeline.stage(DecodeReplies)
        if not isinstance(found, DecodeReplies):
            raise ValueError("the pipeline has no DecodeReplies stage")
        return found

    @property
    def expected_examples(self) -> tuple[int, ...] | None:
        return self.decoder.examples

    def bind_run_dir(self, run_dir: Path) -> None:
        """A method's server files go into the run directory: the per-client models it keeps
        (``fedinit/store/server_models.py``, in ``server-models/``) and what it reports."""
        self.rule.bind(ServerModels(run_dir / SERVER_MODELS), RunReports(run_dir))

    @property
    def sent_to(self) -> dict[int, int]:
        """{node id: client id} of this round's train messages."""
        return dict(self._sent_to)

    @classmethod
    def for_run(cls, cfg: RunConfig, node_of_partition: Mapping[int, int], w0: Weights,
                available: Callable[[], Collection[int]] | None = None) -> MethodStrategy:
        """The strategy of the run ``cfg`` describes: example counts from the partitions
        (``fedinit.task.federated_data.partition_sizes``, no data decoded), none for device data."""
        from fedinit.task.federated_data import partition_sizes  # the data modules: only here

        return cls(cfg, node_of_partition, w0, available=available,
                   examples=None if cfg.data.on_devices else partition_sizes(cfg))

    # ---------------------------------------------------------------- Flower Strategy API
    def summary(self) -> None:
        c = self.cfg
        log(20, "%s: %d clients, %d per round, beta=%s (%s aggregation), server lr %s",
            c.spec.label_with(c.train.beta), c.num_clients, c.clients_per_round, c.train.beta,
            c.train.ri_aggregation, c.train.server_lr)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the model, the round's settings and the method's extras to sampled clients."""
        self._w_t = unpack(arrays)
        chosen = self.sample(server_round)
        messages, self._sent_to = self.pipeline.messages(server_round, arrays, self._w_t,
                                                         config, chosen)
        secure = self.pipeline.secure
        if secure is not None:  # SecAgg+'s setup and share-keys exchanges, before training
            messages = secure.key_exchange(grid, server_round, self._w_t, messages,
                                           self._sent_to)
            sent = {m.metadata.dst_node_id for m in messages}
            self._sent_to = {n: p for n, p in self._sent_to.items() if n in sent}
        self._sent_messages = list(messages)  # their ids are set when the grid pushes them
        return self._sent_messages

    def sample(self, server_round: int) -> list[int]:
        """The clients messaged in ``server_round`` (the pipeline's sampler: under DP m of
        ALL N registered clients, the absent ones counted missing; otherwise absent members
        replaced among the connected)."""
        drawn = self.pipeline.sampler(server_round, self.available())
        self._sampled = drawn.sampled
        return drawn.messaged

    def _content_for(self, cid: int, arrays: ArrayRecord, extras: dict[str, ArrayRecord],
                     w_t: Weights) -> tuple[ArrayRecord, dict[str, ArrayRecord]]:
        """The model and extra records client ``cid`` receives (``TrainMessages``)."""
        return self.pipeline.messages.content_for(cid, arrays, extras, w_t)

    def _client_config(self, round_config: ConfigRecord, cid: int) -> ConfigRecord:
        """The round's settings for client ``cid``: its id and, when tracked, its accounted
        round."""
        config = for_client(round_config, cid)
        accounted = self.accounted_rounds.round_of(cid)
        if accounted is not None:
            config[rk.ACCOUNTED_ROUND] = accounted
        return config

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The replies through the pipeline's stages; the next model, or None when a stage
        held the round back (too few replies), and the round's counts and metrics."""
        sent_ids = {m.metadata.message_id: m.metadata.dst_node_id
                    for m in self._sent_messages if m.metadata.message_id}
        done = self.pipeline(RoundReplies(server_round, self._w_t, dict(self._sent_to),
                                          self._sampled, tuple(replies), sent_ids=sent_ids))
        self.last_rejections = dict(done.rejections)
        counts = done.counts()
        if done.w_next is None:
            return None, MetricRecord(counts)
        return pack(done.w_next), MetricRecord({**counts, **done.metrics})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Personalized evaluation in the rounds it is due (``personal-eval-every``): the
        global model (or the client's own content, ``ServerRule.down_to``) to the evaluated
        clients; none otherwise (the global model is also evaluated centrally by the
        experiment). See ``round_stages/personal_eval.py``."""
        return self.personal_eval.messages(server_round, arrays, config)

    def aggregate_evaluate(self, server_round: int,
                           replies: Iterable[Message]) -> MetricRecord | None:
        """Mean, p10 and min of each accuracy over the clients; their scores are kept in
        ``personal_scores`` (the per-client file)."""
        return self.personal_eval.summary(server_round, replies)

    @property
    def personal_scores(self) -> list[personal_summary.ClientScores]:
        """The last personalized evaluation's per-client scores."""
        return self.personal_eval.scores

    def decode(self, msg: Message) -> ClientUpdate | str:
        """The reply as a typed update, or why it cannot be aggregated (``DecodeReplies``)."""
        return self.decoder.decode(msg, self._sent_to, self._w_t)

    def accepts(self, msg: Message) -> bool:
        """Whether this round's decode checks accept the reply (over-selection counts these
        towards m; the pipeline decodes the replies it is given again, alike)."""
        return not isinstance(self.decode(msg), str)

    def reply_weights(self, updates: Sequence[ClientUpdate]) -> list[float]:
        """Each reply's weight in the round's mean (``weighting``): its examples, or 1."""
        return reply_weights(self.cfg.train.weighting, updates)

    # ---------------------------------------------------------------- server state
    def server_state(self) -> dict[str, Weights]:
        """The method's typed state, the norm history and the accounted rounds, as named
        arrays for a checkpoint."""
        state = self.state.arrays()
        if self.norm_filter is not None:
            state.update(self.norm_filter.arrays())
        state.update(self.accounted_rounds.arrays(self.cfg.num_clients))
        return state

    def load_server_state(self, state: dict[str, Weights]) -> None:
        """Restore what ``server_state`` returned; ValueError when it is another method's."""
        norms = owned(state)
        if self.norm_filter is not None:
            self.norm_filter.load(state)
        self.accounted_rounds.load(state)
        self.state = self.rule.state_type.from_arrays(
            {k: v for k, v in state.items() if k not in norms and k != ACCOUNTED_STATE})
