"""Small problems with known answers, run through the REAL strategies and the REAL client code.

``Federation`` plays Flower's part: it asks a method's server half for the round's messages
(``configure_train``), answers each with ``client_round`` on that client's data and its own
state store (a ``RecordDict``, like ``context.state``), and hands the replies back to
``aggregate_train``. Nothing of a method's math is repeated here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import (
    InflatableObject,
    get_all_nested_objects,
)
from torch import nn

from client_app.round import client_round
from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import RunConfig
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.weights import Weights
from fedinit.store.client_store import ClientStore
from strategies.method_strategy import MethodStrategy

NODE_BASE = 1000
"""Node id of partition 0 (node ids are arbitrary; sampling is by partition id)."""


class VectorModel(nn.Module):
    """One parameter vector w; ``linear`` maps x to x @ w, otherwise the output is w - x."""

    def __init__(self, w0: np.ndarray, linear: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.from_numpy(w0.astype(np.float32).copy()))
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w if self.linear else self.w - x


def half_mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """f_i(w) = (1 / 2n) * ||X_i w - y_i||^2: gradient X_i^T (X_i w - y_i) / n."""
    return 0.5 * torch.mean((pred - y) ** 2)


def half_sq_norm(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """f_i(w) = 0.5 * ||w - a_i||^2 (out = w - a_i): gradient w - a_i."""
    return 0.5 * torch.sum(out**2)


@dataclass
class Problem:
    """Per-client data, the initial model and the loss; ``linear`` picks the model's form."""

    xs: list[torch.Tensor]
    ys: list[torch.Tensor]
    w0: np.ndarray
    linear: bool
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    @property
    def num_clients(self) -> int:
        return len(self.xs)

    def gradient(self, cid: int, w: np.ndarray) -> np.ndarray:
        """The full-batch gradient of client ``cid``'s half-MSE at ``w``, in float64: the
        tests' numpy oracles step with it (linear problems only)."""
        assert self.linear and self.loss_fn is half_mse, "the gradient of lsq_problem's loss"
        x, y = self.xs[cid].double().numpy(), self.ys[cid].double().numpy()
        return x.T @ (x @ w - y) / len(y)


def lsq_problem(num_clients: int = 8, dim: int = 5, n: int = 20, seed: int = 0) -> Problem:
    """Heterogeneous least squares: client i has its own scale (Hessian) and its own target."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for i in range(num_clients):
        scale = 0.4 + 1.2 * i / max(num_clients - 1, 1)
        x = rng.standard_normal((n, dim)) * scale * rng.uniform(0.5, 1.5, size=dim)
        w_star_i = rng.standard_normal(dim) * 2.0
        y = x @ w_star_i + 0.1 * rng.standard_normal(n)
        xs.append(torch.from_numpy(x.astype(np.float32)))
        ys.append(torch.from_numpy(y.astype(np.float32)))
    return Problem(xs, ys, np.zeros(dim, dtype=np.float32), True, half_mse)


def lsq_optimum(p: Problem) -> np.ndarray:
    """argmin of sum_i f_i: the normal equations sum_i X_i^T X_i / n_i w = sum_i X_i^T y_i / n_i."""
    a = sum(x.double().T @ x.double() / len(x) for x in p.xs)
    b = sum(x.double().T @ y.double() / len(x) for x, y in zip(p.xs, p.ys, strict=True))
    return np.linalg.solve(np.asarray(a), np.asarray(b))


def quadratic_problem(targets: list[list[float]], w0: list[float]) -> Problem:
    """f_i(w) = 0.5 * ||w - a_i||^2, one example per client: easy to follow by hand."""
    xs = [torch.tensor([a], dtype=torch.float32) for a in targets]
    ys = [torch.zeros(1) for _ in targets]
    return Problem(xs, ys, np.asarray(w0, dtype=np.float32), False, half_sq_norm)


@dataclass
class Federation:
    """One method's server half and N clients (each with its own state store) in-process.

    Unless ``raw`` says otherwise: no RI, no weight decay, no clipping, a constant lr, no norm
    filter (so a hand computation stays short); ``tests/test_methods_by_hand.py`` turns lr
    decay, clipping and the norm filter on for FedAvg, and FedCM's test decays the lr.
    """

    problem: Problem
    raw: dict[str, Any]
    cfg: RunConfig = field(init=False)
    states: dict[int, RecordDict] = field(init=False)
    arrays: ArrayRecord = field(init=False)
    sent: list[Message] = field(default_factory=list)
    replies: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        set_task_identity()
        n = self.problem.num_clients
        # The outlier filter is off: near the optimum the clients' update norms legitimately
        # differ by large factors, and these tests check the update rules alone.
        full = {"num-clients": n, "weight-decay": 0.0, "clip-norm": 0.0, "lr-decay": 1.0,
                "beta": 0.0, "output-dir": "/tmp/unused", "max-update-norm-ratio": 0.0,
                **self.raw}
        self.cfg = RunConfig.parse(full)
        self.strategy = MethodStrategy(
            self.cfg, {cid: NODE_BASE + cid for cid in range(n)}, [self.problem.w0.copy()],
            examples=[len(y) for y in self.problem.ys])
        self.states = {cid: RecordDict() for cid in range(n)}
        self.arrays = ArrayRecord([self.problem.w0.copy()])
        self.metrics: list[dict[str, Any]] = []
        self.round = 0

    @property
    def weights(self) -> np.ndarray:
        """The current global model as one vector."""
        return unpack(self.arrays)[0]

    def state_of(self, cid: int, key: str) -> Weights | None:
        """A client's stored state arrays (None before it stored any)."""
        return ClientStore(self.states[cid]).get(key)

    def answer(self, msg: Message) -> Message:
        """The client's reply, computed by the real client path."""
        cid = msg.metadata.dst_node_id - NODE_BASE
        p = self.problem
        model = VectorModel(p.w0, p.linear)
        content = client_round(
            self.cfg, self.cfg.spec.client(self.cfg.params), msg.content,
            ClientStore(self.states[cid]), model, p.xs[cid], p.ys[cid],
            initial=lambda: [p.w0], partition_id=cid, loss_fn=p.loss_fn)
        return Message(content=content, reply_to=msg)

    def step(self) -> list[int]:
        """Run one round; return the partition ids that trained."""
        self.round += 1
        messages = list(self.strategy.configure_train(
            self.round, self.arrays, ConfigRecord(), cast(Grid, None)))
        replies = [self.answer(m) for m in messages]
        self.sent, self.replies = messages, replies
        new, metrics = self.strategy.aggregate_train(self.round, replies)
        if new is not None:
            self.arrays = new
        self.metrics.append(dict(metrics or {}))
        return sorted(m.metadata.dst_node_id - NODE_BASE for m in messages)

    def run(self, rounds: int) -> np.ndarray:
        """Run ``rounds`` more rounds; return the global model."""
        for _ in range(rounds):
            self.step()
        return self.weights


# ---------------------------------------------------------------------- async oracles
Sent = TypeVar("Sent")
Entry = TypeVar("Entry")


def buffered_replay(script: list[tuple[int, str]], num_clients: int, buffer_size: int,
                    flushes: int, send: Callable[[int, int], Sent],
                    train: Callable[[int, Sent, int], Entry | None],
                    flush: Callable[[list[Entry]], None],
                    first: Sequence[int] | None = None) -> list[list[Entry]]:
    """FedBuff's order of events over ``script`` (who answers next, and whether the reply is
    ``ok``, lost or rejected) for a test's own numpy oracle, which brings the rule: every
    client has a task out (concurrency = clients) and is sent the next at once when it
    answers. ``send(cid, busy)``: what a task carries from the oracle's state now (``busy``:
    the tasks out and replies buffered as it is sent); ``train(cid, sent, tau)``: an ``ok``
    reply's buffer entry (None: not buffered), ``tau`` its staleness in versions; ``flush``:
    steps the oracle's model by a full buffer. ``first``: the order of the first fill
    (default by client). The buffers flushed, in order; the script must reach ``flushes``."""
    version = 0
    buffer: list[Entry] = []
    flushed: list[list[Entry]] = []
    task = {cid: (0, send(cid, i)) for i, cid in enumerate(first or range(num_clients))}
    for cid, fate in script:
        if version == flushes:
            break
        v_sent, sent = task[cid]
        entry = train(cid, sent, version - v_sent) if fate == "ok" else None
        if entry is not None:
            buffer.append(entry)
        if len(buffer) == buffer_size:
            flush(buffer)
            flushed.append(buffer)
            version, buffer = version + 1, []
        task[cid] = (version, send(cid, num_clients - 1 + len(buffer)))
    assert version == flushes, "the script ends before the last flush"
    return flushed


# ---------------------------------------------------------------------- wire measurement
def array_bytes(content: RecordDict) -> int:
    """Bytes of every ArrayRecord in a message (Flower's ``ArrayRecord.count_bytes``)."""
    return sum(r.count_bytes() for r in content.array_records.values())


def record_bytes(content: RecordDict) -> int:
    """Bytes of the whole RecordDict: every record's ``count_bytes`` plus the record names."""
    return sum(len(k) + r.count_bytes() for k, r in content.items())


def serialized_bytes(obj: InflatableObject) -> int:
    """Bytes of a RecordDict (or record) as Flower serializes it: its object tree, deflated.

    Objects are content-addressed, so identical arrays or chunks inside one message count once.
    """
    return sum(len(o.deflate()) for o in get_all_nested_objects(obj).values())
