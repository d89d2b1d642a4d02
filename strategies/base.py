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
from collections.abc import Callable, Iterable, Mapping
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
from strategies.sampling import sample_clients

if TYPE_CHECKING:
    from task.config import RunConfig

GradientHook = Callable[[list[torch.Tensor]], None]
"""Called after ``backward`` and before clipping with the model's parameters (grads set)."""


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
        """Check replies, aggregate the good ones, apply the method's server step."""
        good: list[RecordDict] = []
        rejected = 0
        for msg in replies:
            node = msg.metadata.src_node_id
            problem = self.reply_problem(msg)
            if problem is not None:
                rejected += 1
                log(WARNING, "round %d: rejected reply of node %s (partition %s): %s",
                    server_round, node, self._sent_to.get(node, "?"), problem)
                continue
            good.append(msg.content)
        missing = len(self._sent_to) - len(good) - rejected
        counts = {"num-replies": len(good), "num-rejected": rejected, "num-missing": missing}
        if not good:
            log(WARNING, "round %d: no usable reply; the global model is unchanged", server_round)
            return None, MetricRecord(counts)

        c = self.cfg
        uploads = [rd[rk.ARRAYS].to_numpy_ndarrays() for rd in good]
        n_ex = [float(rd[rk.METRICS][rk.NUM_EXAMPLES]) for rd in good]
        weights = n_ex if c.weighting == "examples" else [1.0] * len(good)
        update, finals = aggregate_update(self._w_t, uploads, weights, c.ri_aggregation)
        w_next = self.server_step(server_round, self._w_t, update, good)
        losses = [float(rd[rk.METRICS][rk.TRAIN_LOSS]) for rd in good]
        metrics = {
            **counts,
            "train-loss": float(np.average(losses, weights=n_ex)),
            "divergence": divergence(finals, w_next),
        }
        return ArrayRecord(w_next), MetricRecord(metrics)

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
