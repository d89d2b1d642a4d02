"""What every method shares: the server half's round plumbing and the client half's hooks.

Server half (``RIStrategy``, a Flower ``FedAvg`` subclass): samples clients by partition id,
sends the model plus the method's extra records, checks every reply and drops bad ones with a
logged reason, computes the round's aggregate update under the RI aggregation variant, lets the
method apply its server step, and reports the divergence term.

Client half (``ClientRule``): plain local SGD. A method overrides ``begin`` to add a gradient
correction, ``finish`` to update its per-client state and return its extra uploads, and
``sam_rho`` to make the local optimizer SAM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import WARNING
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from strategies import records as rk
from strategies.ri import Weights, aggregate_update, divergence
from strategies.robust import combine, update_norms, vector_norm
from strategies.sampling import sample_clients

if TYPE_CHECKING:
    from task.config import RunConfig

GradientHook = Callable[[list[torch.Tensor]], None]
"""Called after ``backward`` and before clipping with the model's parameters (grads set)."""

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


# ====================================================================== client half
class ClientRule:
    """A method's client half. The base class is FedAvg's: nothing added to local SGD."""

    state_keys: tuple[str, ...] = ()
    """Per-client arrays kept between participations (besides RI's w_prev); zeros at start."""
    down_keys: tuple[str, ...] = ()
    """Extra ArrayRecords the server sends with the model."""
    sam_rho: float = 0.0
    """SAM radius of the local optimizer (FedSAM sets it); 0 is plain SGD."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def begin(
        self,
        start: Weights,
        down: Mapping[str, Weights],
        state: Mapping[str, Weights],
        lr: float,
        device: torch.device,
    ) -> GradientHook | None:
        """Prepare local training from ``start``; return a gradient correction, if any."""
        return None

    def finish(
        self,
        start: Weights,
        final: Weights,
        num_steps: int,
        lr: float,
        state: dict[str, Weights],
    ) -> dict[str, Weights]:
        """Update ``state`` in place after training; return the extra records to upload."""
        return {}


# ====================================================================== server half
class RIStrategy(FedAvg):
    """Server half shared by all methods. Subclasses override ``server_step`` and friends."""

    up_keys: tuple[str, ...] = ()
    """Extra ArrayRecords each reply must carry (model-shaped)."""
    state_attrs: tuple[str, ...] = ()
    """Attributes holding the method's server state (model-shaped lists), checkpointed."""

    def __init__(self, cfg: RunConfig, node_of_partition: Mapping[int, int]) -> None:
        super().__init__(
            fraction_train=cfg.fraction_train,
            fraction_evaluate=0.0,
            min_train_nodes=1,
            min_evaluate_nodes=1,
            min_available_nodes=cfg.num_clients,
        )
        self.cfg = cfg
        self.node_of_partition = dict(node_of_partition)
        self._w_t: Weights = []
        self._sent_to: dict[int, int] = {}
        self.norm_history: dict[str, list[float]] = {}
        self.expected_examples: tuple[int, ...] | None = None

    def expect_examples(self, sizes: Sequence[int] | None) -> None:
        """Set each partition's true example count; a reply claiming another is rejected.

        None leaves the claim unchecked (tests with hand-made data; the ServerApp always sets
        it, from ``task.federated_data.partition_sizes``).
        """
        self.expected_examples = None if sizes is None else tuple(int(n) for n in sizes)

    # ---------------------------------------------------------------- hooks for methods
    def down_records(self, server_round: int) -> dict[str, ArrayRecord]:
        """Extra records sent to every sampled client with the model (e.g. SCAFFOLD's c)."""
        return {}

    def server_step(
        self, server_round: int, w_t: Weights, update: Weights, replies: list[RecordDict]
    ) -> Weights:
        """The global model after this round: w_t + eta_g * D (FedAvg's rule)."""
        eta = self.cfg.server_lr
        return [(w.astype(np.float64) + eta * d.astype(np.float64)).astype(np.float32)
                for w, d in zip(w_t, update, strict=True)]

    # ---------------------------------------------------------------- Flower Strategy API
    def summary(self) -> None:
        c = self.cfg
        log(20, "%s: %d clients, %d per round, beta=%s (%s aggregation), server lr %s",
            type(self).__name__, c.num_clients, c.clients_per_round, c.beta, c.ri_aggregation,
            c.server_lr)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the model, the round's settings and the method's extras to sampled clients."""
        c = self.cfg
        self._w_t = arrays.to_numpy_ndarrays()
        chosen = sample_clients(c.seed, server_round, c.num_clients, c.clients_per_round)
        round_config = ConfigRecord(
            {**dict(config), rk.ROUND: server_round, rk.LR: c.lr_at(server_round),
             rk.BETA: c.beta}
        )
        extras = self.down_records(server_round)
        messages = []
        self._sent_to = {}
        for pid in chosen:
            node = self.node_of_partition[pid]
            self._sent_to[node] = pid
            content = RecordDict({rk.ARRAYS: arrays, rk.CONFIG: round_config, **extras})
            messages.append(
                Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check replies, drop bad ones and outliers, aggregate, apply the method's step."""
        c = self.cfg
        good: list[tuple[int, RecordDict]] = []
        rejected = 0
        for msg in replies:
            node = msg.metadata.src_node_id
            problem = self.reply_problem(msg)
            if problem is not None:
                rejected += 1
                self._reject(server_round, node, problem)
                continue
            good.append((node, msg.content))
        missing = len(self._sent_to) - len(good) - rejected
        # Replies arrive in any order; sum them in client order so that a deployment and a
        # simulation of the same seed aggregate bit for bit alike.
        good.sort(key=lambda item: self._sent_to[item[0]])
        good, outliers, used = self._norm_filter(server_round, good)
        rejected += outliers
        uploads = [rd[rk.ARRAYS].to_numpy_ndarrays() for _, rd in good]
        counts = {"num-replies": len(good), "num-rejected": rejected, "num-missing": missing,
                  "norm-limit-used": used}
        if len(good) < c.min_replies:
            log(WARNING, "round %d: %d usable replies < min-replies=%d; the global model is "
                "unchanged", server_round, len(good), c.min_replies)
            return None, MetricRecord(counts)

        contents = [rd for _, rd in good]
        n_ex = [float(rd[rk.METRICS][rk.NUM_EXAMPLES]) for rd in contents]
        update, finals = aggregate_update(
            self._w_t, uploads, self.reply_weights(contents), c.ri_aggregation,
            mean=lambda v, w: combine(v, w, c.aggregation, c.trim_fraction))
        w_next = self.server_step(server_round, self._w_t, update, contents)
        losses = [float(rd[rk.METRICS][rk.TRAIN_LOSS]) for rd in contents]
        metrics = {
            **counts,
            "train-loss": float(np.average(losses, weights=n_ex)),
            "divergence": divergence(finals, w_next),
        }
        return ArrayRecord(w_next), MetricRecord(metrics)

    # ---------------------------------------------------------------- norm filter
    def _norm_filter(
        self, server_round: int, good: list[tuple[int, RecordDict]]
    ) -> tuple[list[tuple[int, RecordDict]], int, float]:
        """Drop replies with any uploaded vector above its norm limit; remember the rest.

        Returns the kept replies, how many were dropped, and the largest norm / limit seen
        (a round metric: how close honest replies come to the limit).
        """
        if self.cfg.max_update_norm_ratio == 0.0 or not good:
            return good, 0, 0.0
        keys = (rk.ARRAYS, *self.up_keys)
        contents = [rd for _, rd in good]
        norms = {key: self.upload_norms(key, contents) for key in keys}
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

    def upload_norms(self, key: str, contents: list[RecordDict]) -> list[float]:
        """Norm of each reply's record ``key``: the move ||w_iK - w_t|| or ||Delta_i|| for
        the model upload, the plain norm for a method's extra upload (e.g. Delta_c_i)."""
        variant = self.cfg.ri_aggregation if key == rk.ARRAYS else "update"
        return update_norms(self._w_t, [rd[key].to_numpy_ndarrays() for rd in contents],
                            variant)

    def _norm_limit(self, server_round: int, key: str,
                    round_norms: list[float]) -> tuple[float, str]:
        """The largest acceptable norm of ``key`` this round, and how it was set (for logs).

        Reference: the median of this round's norms and the recent accepted ones, so one
        reply cannot set its own bar. Without history and with fewer than MIN_ROUND_NORMS
        replies (round 1 of a small federation) the method's ``fallback_limit`` applies.
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
        """Bound without any reference norm: FIRST_ROUND_FACTOR x ||w_t|| (a move of the
        model); methods whose extra uploads have other units override it."""
        return FIRST_ROUND_FACTOR * vector_norm(self._w_t)

    def _remember(self, key: str, norms: list[float]) -> None:
        """Append accepted norms to ``key``'s history, keeping the last NORM_HISTORY."""
        if norms:
            self.norm_history[key] = [*self.norm_history.get(key, []), *norms][-NORM_HISTORY:]

    def reply_weights(self, contents: list[RecordDict]) -> list[float]:
        """Each reply's weight in the round's mean (``weighting``): its examples, or 1."""
        if self.cfg.weighting == "uniform":
            return [1.0] * len(contents)
        return [float(rd[rk.METRICS][rk.NUM_EXAMPLES]) for rd in contents]

    def _reject(self, server_round: int, node: int, reason: str) -> None:
        log(WARNING, "round %d: rejected reply of node %s (partition %s): %s",
            server_round, node, self._sent_to.get(node, "?"), reason)

    # ---------------------------------------------------------------- server state
    def server_state(self) -> dict[str, Weights]:
        """The method's server state (``state_attrs``) for a checkpoint."""
        state = {name: list(getattr(self, name)) for name in self.state_attrs
                 if getattr(self, name)}
        for key, norms in self.norm_history.items():
            state[NORMS_STATE + key] = [np.asarray(norms, dtype=np.float64)]
        return state

    def load_server_state(self, state: dict[str, Weights]) -> None:
        """Restore what ``server_state`` returned; unknown names are a checkpoint error."""
        norms = {n for n in state if n.startswith(NORMS_STATE)}
        unknown = set(state) - set(self.state_attrs) - norms
        if unknown:
            raise ValueError(f"checkpoint holds server state {sorted(unknown)} that "
                             f"{type(self).__name__} does not have")
        self.norm_history = {n.removeprefix(NORMS_STATE): [float(x) for x in state[n][0]]
                             for n in sorted(norms)}
        for name, arrays in state.items():
            if name not in norms:
                setattr(self, name, list(arrays))

    # ---------------------------------------------------------------- reply validation
    def reply_problem(self, msg: Message) -> str | None:
        """Why a reply cannot be aggregated, or None when it is sound."""
        if msg.has_error():
            return f"client error: {msg.error.reason}"
        if msg.metadata.src_node_id not in self._sent_to:
            return "reply from a node that was not sampled this round"
        content = msg.content
        if rk.METRICS not in content.metric_records:
            return f"missing MetricRecord {rk.METRICS!r}"
        metrics = content.metric_records[rk.METRICS]
        for key in (rk.NUM_EXAMPLES, rk.TRAIN_LOSS):
            if key not in metrics:
                return f"missing metric {key!r}"
        n = metrics[rk.NUM_EXAMPLES]
        if not isinstance(n, int) or n <= 0:
            return f"num-examples={n!r} is not a positive integer"
        problem = self.examples_problem(self._sent_to[msg.metadata.src_node_id], n)
        if problem is not None:
            return problem
        if not math.isfinite(float(metrics[rk.TRAIN_LOSS])):  # type: ignore[arg-type]
            return f"train-loss={metrics[rk.TRAIN_LOSS]!r} is not finite"
        for key in (rk.ARRAYS, *self.up_keys):
            if key not in content.array_records:
                return f"missing ArrayRecord {key!r}"
            problem = _arrays_problem(key, content.array_records[key].to_numpy_ndarrays(),
                                      self._w_t)
            if problem is not None:
                return problem
        return None

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
