"""The one Flower strategy every method runs in: the wire and the checks around a pure core
(the method's ``ServerRule`` in ``methods/<method>.py``).

``MethodStrategy`` (a Flower ``Strategy``) samples clients by partition id, sends the model
with the method's extra arrays, checks every reply and decodes it once into a
``ClientUpdate``, drops bad ones and norm outliers with a logged reason, computes the round's
aggregate update D under the RI variant, and calls the method's pure ``ServerRule.update``.
It holds the method's typed server state and the norm filter's history; both are the
checkpointed server state.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from methods import wire as rk
from methods.dp import Mechanism
from methods.method import ClientUpdate, RoundInput, ServerRule, ServerState
from methods.norms import update_norms, vector_norm
from methods.packed_arrays import pack, unpack
from methods.ri import aggregate_update, divergence
from methods.robust import combine, select
from methods.robust_choices import SELECTIONS, min_replies
from methods.sampling import sample_available, sample_registered
from methods.weights import Weights
from server_app import personal_summary
from server_app.run_reports import RunReports
from store.server_models import ServerModels
from task.config import RunConfig
from task.federated_data import num_steps, partition_sizes

NORM_HISTORY = 64
"""Accepted upload norms kept per uploaded vector: the norm filter's reference in rounds with
few replies. Part of the server state (checkpointed), so a resumed run filters identically."""
MIN_ROUND_NORMS = 3
"""Fewest norms of this round alone that make a median reference without any history."""
FIRST_ROUND_FACTOR = 5.0
"""With no history and fewer than MIN_ROUND_NORMS replies, an upload may move the model by at
most this times ||w_t||. Honest round-1 moves measured 0.015-0.33 x ||w_0|| (all 100 clients,
full Fashion-MNIST, Dir-0.1, defaults; docs/faults.md): 15x headroom."""
NORMS_STATE = "norms:"
"""Server-state name prefix of a vector's norm history (``norms:<record name>``)."""
ACCOUNTED_STATE = "accounted-rounds"
"""Server-state name of the round each client's last aggregated reply came from (0: none)."""

NOT_ARRIVED = frozenset({ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
                         ErrorCode.NODE_UNAVAILABLE})
"""Error codes of a reply that never came from the client (the SuperLink's own): under DP
only replies that arrived count against ``min-replies``; any other error is the client's
(its ClientApp raised or crashed, possibly because of its data) and counts as arrived."""

SERVER_MODELS = "server-models"
"""Folder of the run directory with the server's per-client models (FedRelax)."""

Accepted = tuple[int, ClientUpdate]
"""A reply that passed the checks: (source node id, its decoded update)."""


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
        self.rule: ServerRule = cfg.spec.server(cfg.params)
        self.privacy = Mechanism.from_config(cfg)
        """Client-level DP (``dp``): re-clipping, the noise and the fixed denominator."""
        self.sampling_seed = secrets.randbits(63) if self.privacy.on else cfg.seed
        """Under DP the sample is drawn from a secret seed: amplification by sampling holds
        only if who was sampled is unknown, and the run's seed is public (config.json)."""
        self.state: ServerState = self.rule.init(w0)
        self.rule.bind(ServerModels(None), None)  # a run's own place: ``bind_run_dir``
        self.norm_history: dict[str, list[float]] = {}
        self.expected_examples: tuple[int, ...] | None = (
            None if examples is None else tuple(int(n) for n in examples))
        self.accounted: dict[int, int] | None = {}
        """Partition id -> round of its last aggregated reply, named in each train message so
        the client starts its server-summed state (``ClientRule.accounted_keys``) from the
        version the server counted. None: not tracked (a run resumed from a checkpoint made
        before it was): clients then use their newest state, as that run did."""
        self._w_t: Weights = []
        self._sent_to: dict[int, int] = {}
        self._sampled = 0
        """Clients sampled this round, messaged or not (under DP absent ones are not)."""
        self._eval_sent_to: dict[int, int] = {}
        self.personal_scores: list[personal_summary.ClientScores] = []
        """The last personalized evaluation's per-client scores."""

    def bind_run_dir(self, run_dir: Path) -> None:
        """A method's server files go into the run directory: the per-client models it keeps
        (``store/server_models.py``, in ``server-models/``) and what it reports."""
        self.rule.bind(ServerModels(run_dir / SERVER_MODELS), RunReports(run_dir))

    @property
    def sent_to(self) -> dict[int, int]:
        """{node id: client id} of this round's train messages."""
        return dict(self._sent_to)

    @classmethod
    def for_run(cls, cfg: RunConfig, node_of_partition: Mapping[int, int], w0: Weights,
                available: Callable[[], Collection[int]] | None = None) -> MethodStrategy:
        """The strategy of the run ``cfg`` describes: example counts from the partitions
        (``task.federated_data.partition_sizes``, no data decoded), none for device data."""
        return cls(cfg, node_of_partition, w0, available=available,
                   examples=None if cfg.on_devices else partition_sizes(cfg))

    # ---------------------------------------------------------------- Flower Strategy API
    def summary(self) -> None:
        c = self.cfg
        log(20, "%s: %d clients, %d per round, beta=%s (%s aggregation), server lr %s",
            c.spec.label, c.num_clients, c.clients_per_round, c.beta, c.ri_aggregation,
            c.server_lr)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the model, the round's settings and the method's extras to sampled clients."""
        c = self.cfg
        self._w_t = unpack(arrays)
        chosen = self.sample(server_round)
        round_config = ConfigRecord(
            {**dict(config), rk.ROUND: server_round, rk.LR: c.lr_at(server_round),
             rk.BETA: c.beta, rk.UPLOAD_DELTA: c.ri_aggregation == "update"}
        )
        extras = {k: pack(v) for k, v in self.rule.down(self.state).items()}
        messages = []
        self._sent_to = {}
        for pid in chosen:
            node = self.node_of_partition[pid]
            self._sent_to[node] = pid
            model, own = self._content_for(pid, arrays, extras, self._w_t)
            content = RecordDict({rk.ARRAYS: model, rk.CONFIG: self._client_config(
                round_config, pid), **own})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)
            )
        return messages

    def sample(self, server_round: int) -> list[int]:
        """The clients messaged in ``server_round``. Under DP: m of ALL N registered clients
        (``sample_registered``), the absent ones left out and counted missing, so each client's
        inclusion rate is the accountant's m / N whoever is connected (docs/algorithms.md, DP).
        Otherwise ``sample_available``: absent members replaced among the connected."""
        c = self.cfg
        if self.privacy.on:
            sampled, present = sample_registered(self.sampling_seed, server_round,
                                                 c.num_clients, c.clients_per_round,
                                                 self.available())
            self._sampled = len(sampled)
            return present
        chosen = sample_available(self.sampling_seed, server_round, c.num_clients,
                                  c.clients_per_round, self.available())
        self._sampled = len(chosen)
        return chosen

    def _content_for(self, pid: int, arrays: ArrayRecord, extras: dict[str, ArrayRecord],
                     w_t: Weights) -> tuple[ArrayRecord, dict[str, ArrayRecord]]:
        """The model and extra records client ``pid`` receives: the shared ones, unless the
        method gives each client its own (``ServerRule.down_to``)."""
        own = self.rule.down_to(self.state, pid, w_t)
        if own is None:
            return arrays, extras
        return pack(own.model), {k: pack(v) for k, v in own.extras.items()}

    def _client_config(self, round_config: ConfigRecord, pid: int) -> ConfigRecord:
        """The round's settings for client ``pid``: its id and, when tracked, its accounted
        round."""
        config = _for_client(round_config, pid)
        if self.accounted is not None:
            config[rk.ACCOUNTED_ROUND] = self.accounted.get(pid, 0)
        return config

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check and decode replies, drop bad ones and outliers, aggregate, call the method."""
        c = self.cfg
        good: list[Accepted] = []
        rejected = 0
        arrived: set[int] = set()
        for msg in replies:
            node = msg.metadata.src_node_id
            if node in self._sent_to and not (msg.has_error()
                                              and msg.error.code in NOT_ARRIVED):
                arrived.add(node)
            decoded = self.decode(msg)
            if isinstance(decoded, str):
                rejected += 1
                self._reject(server_round, node, decoded)
                continue
            good.append((node, decoded))
        missing = self._sampled - len(good) - rejected
        # Replies arrive in any order; sum them in client order so that a deployment and a
        # simulation of the same seed aggregate bit for bit alike.
        good.sort(key=lambda item: item[1].partition_id)
        good, outliers, used = self._norm_filter(server_round, good)
        rejected += outliers
        counts = {rk.NUM_REPLIES: len(good), rk.NUM_REJECTED: rejected,
                  rk.NUM_MISSING: missing, rk.NORM_LIMIT_USED: used}
        # Under DP whether a round is released may not depend on any client's data: only
        # the replies that arrived count; a rejected one is a zero contribution.
        usable, what = ((len(arrived), "arrived") if self.privacy.on
                        else (len(good), "usable"))
        if usable < c.min_replies:
            log(WARNING, "round %d: %d %s replies < min-replies=%d; the global model is "
                "unchanged", server_round, usable, what, c.min_replies)
            return None, MetricRecord(counts)

        real = self.robust_selection(server_round, [u for _, u in good])
        if real is None:
            return None, MetricRecord(counts)
        # DP with every arrived reply rejected: the noise alone is released, on a zero
        # contribution that stands for no client (never counted as any client's round).
        updates = real or [self._zero_contribution()]
        updates = self.privacy.replies(updates)  # DP: clipped and noised
        weights = self.reply_weights(updates)

        def rule(vectors: Sequence[Weights], wgt: Sequence[float]) -> Weights:
            return combine(vectors, wgt, c.aggregation, c.trim_fraction, c.byzantine_f)

        aggregate, finals = aggregate_update(
            self._w_t, [u.upload for u in updates], weights, c.ri_aggregation,
            mean=self.privacy.mean if self.privacy.on else rule)
        rnd = RoundInput(server_round=server_round, aggregate=aggregate, updates=updates,
                         weights=weights, variant=c.ri_aggregation, num_clients=c.num_clients,
                         lr=c.lr_at(server_round), server_lr=c.server_lr, combine=rule,
                         aggregation=c.aggregation)
        w_next, self.state = self.rule.update(self.state, self._w_t, rnd)
        if not real:
            return pack(w_next), MetricRecord(counts)
        if self.accounted is not None:
            self.accounted.update((u.partition_id, server_round) for u in updates)
        metrics = {  # local DP: the devices report no train loss
            **counts,
            **({} if self.privacy.mode == "local" else {rk.ROUND_TRAIN_LOSS: float(np.average(
                [u.train_loss for u in updates], weights=[u.num_examples for u in updates]))}),
            rk.DIVERGENCE: divergence(finals, w_next),
        }
        return pack(w_next), MetricRecord(metrics)

    def _zero_contribution(self) -> ClientUpdate:
        """A reply of zeros in every channel (model move and extra uploads, model-shaped):
        what a rejected reply adds to the sum under DP, carrying the round's noise when no
        reply was accepted."""
        zeros = [np.zeros_like(w) for w in self._w_t]
        return ClientUpdate(partition_id=-1, upload=zeros,
                            extras={k: [z.copy() for z in zeros] for k in self.rule.up_keys},
                            num_examples=1, train_loss=0.0, num_steps=1)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Personalized evaluation in the rounds it is due (``personal-eval-every``): the
        global model (or the client's own content, ``ServerRule.down_to``) to the evaluated
        clients; none otherwise (the global model is also
        evaluated centrally by the experiment)."""
        c = self.cfg
        self._eval_sent_to = {}
        if not personal_summary.due(c, server_round):
            return []
        w_t = unpack(arrays)
        eval_config = ConfigRecord({**dict(config), rk.ROUND: server_round,
                                    rk.LR: c.lr_at(server_round), rk.PERSONAL_EVAL: True})
        messages = []
        online = set(self.available())
        for pid in personal_summary.eval_clients(c):
            if pid not in online:  # not identified or not connected: no score this time
                continue
            node = self.node_of_partition[pid]
            self._eval_sent_to[node] = pid
            model, _ = self._content_for(pid, arrays, {}, w_t)
            content = RecordDict({rk.ARRAYS: model, rk.CONFIG: _for_client(eval_config, pid)})
            messages.append(
                Message(content=content, message_type=MessageType.EVALUATE, dst_node_id=node))
        return messages

    def aggregate_evaluate(self, server_round: int,
                           replies: Iterable[Message]) -> MetricRecord | None:
        """Mean, p10 and min of each accuracy over the clients; their scores are kept in
        ``personal_scores`` (the per-client file)."""
        scores: list[personal_summary.ClientScores] = []
        for msg in replies:
            node = msg.metadata.src_node_id
            decoded: personal_summary.ClientScores | str
            if msg.has_error():
                decoded = f"client error: {msg.error.reason}"
            elif node not in self._eval_sent_to:
                decoded = "evaluation reply from a node that was not asked"
            elif rk.METRICS not in msg.content.metric_records:
                decoded = f"missing MetricRecord {rk.METRICS!r}"
            else:
                decoded = personal_summary.decode(self._eval_sent_to[node],
                                               msg.content.metric_records[rk.METRICS])
            if isinstance(decoded, str):
                log(WARNING, "round %d: ignored the evaluation reply of node %s (partition "
                    "%s): %s", server_round, node, self._eval_sent_to.get(node, "?"), decoded)
                continue
            scores.append(decoded)
        self.personal_scores = scores
        if not self._eval_sent_to:
            return None
        return MetricRecord(personal_summary.summarize(scores))

    def robust_selection(self, server_round: int,
                         updates: list[ClientUpdate]) -> list[ClientUpdate] | None:
        """The replies Krum, Multi-Krum or Bulyan let through (all under the other rules),
        judged on each reply's model move and extra uploads concatenated (squared L2
        distance); None, logged, when too few replies came for ``byzantine-f``: the round is
        then not aggregated, as with too few replies for ``min-replies``."""
        c = self.cfg
        if c.aggregation not in SELECTIONS:
            return updates
        moves = RoundInput(server_round=server_round, aggregate=[], updates=updates,
                           weights=[], variant=c.ri_aggregation, num_clients=c.num_clients,
                           lr=0.0, server_lr=0.0).moves(self._w_t)
        joint = [[*m, *(a for k in self.rule.up_keys for a in u.extras[k])]
                 for m, u in zip(moves, updates, strict=True)]
        chosen = select(joint, c.aggregation, c.byzantine_f)
        if chosen is None:
            log(WARNING, "round %d: %d usable replies < %d that aggregation=%s needs with "
                "byzantine-f=%d; the global model is unchanged", server_round, len(updates),
                min_replies(c.aggregation, c.byzantine_f), c.aggregation, c.byzantine_f)
            return None
        dropped = [u.partition_id for i, u in enumerate(updates) if i not in chosen]
        log(INFO, "round %d: %s aggregates partitions %s, leaves out %s", server_round,
            c.aggregation, [updates[i].partition_id for i in chosen], dropped)
        return [updates[i] for i in chosen]

    def reply_weights(self, updates: Sequence[ClientUpdate]) -> list[float]:
        """Each reply's weight in the round's mean (``weighting``): its examples, or 1."""
        if self.cfg.weighting == "uniform":
            return [1.0] * len(updates)
        return [float(u.num_examples) for u in updates]

    def _reject(self, server_round: int, node: int, reason: str) -> None:
        log(WARNING, "round %d: rejected reply of node %s (partition %s): %s",
            server_round, node, self._sent_to.get(node, "?"), reason)

    # ---------------------------------------------------------------- decoding and checks
    def decode(self, msg: Message) -> ClientUpdate | str:
        """The reply as a typed update, or why it cannot be aggregated (one line)."""
        if msg.has_error():
            return f"client error: {msg.error.reason}"
        node = msg.metadata.src_node_id
        if node not in self._sent_to:
            return "reply from a node that was not sampled this round"
        pid = self._sent_to[node]
        content = msg.content
        if rk.METRICS not in content.metric_records:
            return f"missing MetricRecord {rk.METRICS!r}"
        metrics = content.metric_records[rk.METRICS]
        # a device under local DP reports nothing that depends on its data
        # (client_app.device_privacy): weights are uniform under DP and no server rule DP
        # runs with reads the counts, so placeholders stand in, whatever a reply claims
        local = self.privacy.mode == "local"
        for key in () if local else (rk.NUM_EXAMPLES, rk.TRAIN_LOSS, rk.NUM_STEPS):
            if key not in metrics:
                return f"missing metric {key!r}"
        said = (content.config_records[rk.CONFIG].get(rk.UPLOAD_DELTA)
                if rk.CONFIG in content.config_records else None)
        if said is not (self.cfg.ri_aggregation == "update"):
            return (f"the reply says {rk.UPLOAD_DELTA}={said!r}; the round asked for "
                    f"{'Delta_i' if self.cfg.ri_aggregation == 'update' else 'w_iK'}")
        n, steps, loss = ((1, 1, math.nan) if local else
                          (metrics[rk.NUM_EXAMPLES], metrics[rk.NUM_STEPS], metrics[rk.TRAIN_LOSS]))
        if not local:
            for key, value in ((rk.NUM_EXAMPLES, n), (rk.NUM_STEPS, steps)):
                if not isinstance(value, int) or value <= 0:
                    return f"{key}={value!r} is not a positive integer"
            assert isinstance(n, int) and isinstance(steps, int)
            problem = self.examples_problem(pid, n)
            if problem is not None:
                return problem
            if not isinstance(loss, int | float) or not math.isfinite(float(loss)):
                return f"train-loss={loss!r} is not finite"
        arrays: dict[str, Weights] = {}
        for key in (rk.ARRAYS, *self.rule.up_keys):
            if key not in content.array_records:
                return f"missing ArrayRecord {key!r}"
            try:
                arrays[key] = unpack(content.array_records[key])
            except ValueError as err:
                return f"ArrayRecord {key!r}: {err}"
            problem = _arrays_problem(key, arrays[key], self._w_t)
            if problem is not None:
                return problem
        update = ClientUpdate(partition_id=pid, upload=arrays.pop(rk.ARRAYS), extras=arrays,
                              num_examples=n, train_loss=float(loss), num_steps=steps)
        problem = self.rule.reply_problem(update, self.expected_steps(pid))
        return update if problem is None else problem

    def examples_problem(self, partition_id: int, n: int) -> str | None:
        """Why a claimed example count (the reply's weight) cannot be true, or None.

        ``max-examples-per-client`` > 0 (clients with their own data) only caps the claim;
        otherwise it must equal the partition's size, which the server derives from the
        run config exactly as the client does.
        """
        ceiling = self.cfg.max_examples_per_client
        if ceiling > 0:
            return None if n <= ceiling else (
                f"num-examples={n} > max-examples-per-client={ceiling}")
        want = self.true_examples(partition_id)
        return None if want is None or n == want else (
            f"num-examples={n}, but partition {partition_id} holds {want} examples")

    def true_examples(self, partition_id: int) -> int | None:
        """The partition's example count when the server knows it (exact-count mode)."""
        if self.expected_examples is None or self.cfg.max_examples_per_client > 0:
            return None
        return self.expected_examples[partition_id]

    def expected_steps(self, partition_id: int) -> int | None:
        """The local SGD steps the partition takes, when the server knows its size."""
        n = self.true_examples(partition_id)
        c = self.cfg
        return None if n is None else num_steps(n, c.local_epochs, c.batch_size)

    # ---------------------------------------------------------------- norm filter
    def _norm_filter(
        self, server_round: int, good: list[Accepted]
    ) -> tuple[list[Accepted], int, float]:
        """Drop replies with any uploaded vector above its norm limit; remember the rest.

        Returns the kept replies, how many were dropped, and the largest norm / limit seen
        (a round metric: how close honest replies come to the limit).
        """
        if self.cfg.max_update_norm_ratio == 0.0 or not good or self.privacy.on:
            return good, 0, 0.0  # under DP clipping bounds every reply (docs: DP)
        keys = (rk.ARRAYS, *self.rule.up_keys)
        updates = [u for _, u in good]
        norms = {key: self.upload_norms(key, updates) for key in keys}
        limits = {key: self._norm_limit(server_round, key, norms[key]) for key in keys}
        keep, used = [], 0.0
        for i, (node, _) in enumerate(good):
            over = [f"{key!r} norm {norms[key][i]:.3g} > {limits[key][1]}" for key in keys
                    if norms[key][i] > limits[key][0]]
            used = max([used, *(norms[key][i] / limits[key][0] for key in keys)])
            if over:
                self._reject(server_round, node, "; ".join(over))
            else:
                keep.append(i)
        for key in keys:
            self._remember(key, [norms[key][i] for i in keep])
        return [good[i] for i in keep], len(good) - len(keep), used

    def upload_norms(self, key: str, updates: Sequence[ClientUpdate]) -> list[float]:
        """Norm of each reply's record ``key``: the move ||w_iK - w_t|| or ||Delta_i|| for
        the model upload, the plain norm for a method's extra upload (e.g. Delta_c_i)."""
        if key == rk.ARRAYS:
            return update_norms(self._w_t, [u.upload for u in updates], self.cfg.ri_aggregation)
        return update_norms(self._w_t, [u.extras[key] for u in updates], "update")

    def _norm_limit(self, server_round: int, key: str,
                    round_norms: list[float]) -> tuple[float, str]:
        """The largest acceptable norm of ``key`` this round, and how it was set (for logs).

        Reference: the median of this round's norms and the recent accepted ones, so one
        reply cannot set its own bar. Without history and with fewer than MIN_ROUND_NORMS
        replies (round 1 of a small federation) the first-round bound applies.
        """
        history = self.norm_history.get(key, [])
        ratio = self.cfg.max_update_norm_ratio
        if history or len(round_norms) >= MIN_ROUND_NORMS:
            ref = float(np.median([*round_norms, *history]))
            limit = ratio * ref if ref > 0.0 else math.inf
            return limit, (f"max-update-norm-ratio {ratio:g} x median {ref:.3g} of "
                           f"{len(round_norms)} norms this round and {len(history)} accepted "
                           "before")
        limit = self.fallback_limit(key, server_round)
        return (limit if limit > 0.0 else math.inf), (
            f"{limit:.3g}, the first-round bound (no accepted norms yet)")

    def fallback_limit(self, key: str, server_round: int) -> float:
        """Bound without any reference norm: FIRST_ROUND_FACTOR x ||w_t|| for a move of the
        model; the method bounds its extra uploads from that (``extra_fallback_limit``)."""
        move = FIRST_ROUND_FACTOR * vector_norm(self._w_t)
        if key == rk.ARRAYS:
            return move
        return self.rule.extra_fallback_limit(key, self.state, move,
                                              self.cfg.lr_at(server_round))

    def _remember(self, key: str, norms: list[float]) -> None:
        """Append accepted norms to ``key``'s history, keeping the last NORM_HISTORY."""
        if norms:
            self.norm_history[key] = [*self.norm_history.get(key, []), *norms][-NORM_HISTORY:]

    # ---------------------------------------------------------------- server state
    def server_state(self) -> dict[str, Weights]:
        """The method's typed state and the norm history, as named arrays for a checkpoint."""
        state = self.state.arrays()
        for key, norms in self.norm_history.items():
            state[NORMS_STATE + key] = [np.asarray(norms, dtype=np.float64)]
        if self.accounted is not None:
            rounds = np.zeros(self.cfg.num_clients, dtype=np.int64)
            for pid, rnd in self.accounted.items():
                rounds[pid] = rnd
            state[ACCOUNTED_STATE] = [rounds]
        return state

    def load_server_state(self, state: dict[str, Weights]) -> None:
        """Restore what ``server_state`` returned; ValueError when it is another method's."""
        norms = {n for n in state if n.startswith(NORMS_STATE)}
        self.norm_history = {n.removeprefix(NORMS_STATE): [float(x) for x in state[n][0]]
                             for n in sorted(norms)}
        accounted = state.get(ACCOUNTED_STATE)
        self.accounted = (None if accounted is None else
                          {pid: int(r) for pid, r in enumerate(accounted[0]) if r > 0})
        self.state = self.rule.state_type.from_arrays(
            {k: v for k, v in state.items() if k not in norms and k != ACCOUNTED_STATE})


def _for_client(config: ConfigRecord, client_id: int) -> ConfigRecord:
    """The round's settings with the client the message is for (``rk.CLIENT_ID``)."""
    return ConfigRecord({**dict(config), rk.CLIENT_ID: client_id})


def _arrays_problem(key: str, arrays: list[np.ndarray], reference: Weights) -> str | None:
    """Shape, dtype and finiteness check of one model-shaped upload against the model."""
    if len(arrays) != len(reference):
        return f"{key!r} has {len(arrays)} arrays, expected {len(reference)}"
    for i, (a, r) in enumerate(zip(arrays, reference, strict=True)):
        if a.shape != r.shape:
            return f"{key!r}[{i}] has shape {a.shape}, expected {r.shape}"
        if a.dtype != r.dtype:
            return f"{key!r}[{i}] has dtype {a.dtype}, expected {r.dtype}"
        if not np.all(np.isfinite(a)):
            return f"{key!r}[{i}] holds NaN or Inf"
    return None
