"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation, pure numpy.

Clients train from whatever model version they were sent; the server buffers their updates
and, every K accepted ones, applies w += eta_g * sum_i s(tau_i) p_i Delta_i / sum_i p_i with
tau_i = current version - the version client i started from and p_i the reply's weight
(``weighting``: 1 each under ``uniform``, the paper's sum / K; examples otherwise). Replies
staler than ``max-staleness`` are dropped and counted, never buffered. No Flower, no clock:
``server_app/async_rounds.py`` is the loop around it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedinit.methods.weights import Weights

Apply = Callable[[Weights, Weights], Weights]
"""(w, D) -> the new model: how a method's server rule takes the buffered update."""
STALENESS_KINDS: tuple[str, ...] = ("constant", "poly", "hinge")
"""``staleness``: s(tau) = 1 | (1 + tau)^-a | 1 if tau <= b else 1 / (a (tau - b) + 1)."""


def staleness_weight(kind: str, tau: int, a: float, b: float) -> float:
    """s(tau): how much a reply that started ``tau`` versions ago still counts."""
    if tau < 0:
        raise ValueError(f"staleness tau={tau} is negative: a reply cannot start from a "
                         "version newer than the server's")
    if kind == "constant":
        return 1.0
    if kind == "poly":
        return float((1.0 + tau) ** -a)
    if kind == "hinge":
        return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)
    raise ValueError(f"staleness={kind!r} is not allowed; allowed: {' | '.join(STALENESS_KINDS)}")


@dataclass(frozen=True)
class BufferedUpdate:
    """One accepted reply: its update Delta_i (relative to what it started from), the version
    it started from, and its weight p_i in the buffer's mean."""

    delta: Weights
    version: int
    weight: float
    client: int = -1


@dataclass(frozen=True)
class Flush:
    """What one aggregation did: the new model and the facts its rounds.jsonl row reports."""

    weights: Weights
    version: int
    """The model version after this flush (1 after the first)."""
    replies: int
    staleness: tuple[int, ...]
    factors: tuple[float, ...]
    dropped: int
    """Replies dropped for ``max-staleness`` since the previous flush."""
    clients: tuple[int, ...]
    started: tuple[int, ...] = ()
    """The version each buffered reply's task was sent (its tau is ``version`` - 1 - it)."""


@dataclass
class FedBuff:
    """The server's buffer and model version; ``offer`` each checked reply, ``flush`` when
    ``full``. Deterministic: the same replies in the same order give the same model."""

    buffer_size: int
    server_lr: float
    staleness: str = "constant"
    a: float = 0.5
    b: float = 0.0
    max_staleness: int = 0
    """0: no limit; otherwise a reply with tau > max_staleness is dropped."""
    version: int = 0
    buffer: list[BufferedUpdate] = field(default_factory=list)
    dropped: int = 0

    def __post_init__(self) -> None:
        if self.buffer_size < 1:
            raise ValueError(f"buffer-size={self.buffer_size} must be an integer >= 1")
        staleness_weight(self.staleness, 0, self.a, self.b)  # an unknown kind fails here

    def tau(self, started: int) -> int:
        return self.version - started

    def offer(self, update: BufferedUpdate) -> bool:
        """Buffer ``update``, or drop it (False) when it is staler than ``max-staleness``."""
        tau = self.tau(update.version)
        if tau < 0:
            raise ValueError(f"a reply from version {update.version} is newer than the "
                             f"server's version {self.version}")
        if self.max_staleness and tau > self.max_staleness:
            self.dropped += 1
            return False
        self.buffer.append(update)
        return True

    @property
    def full(self) -> bool:
        return len(self.buffer) >= self.buffer_size

    def step(self) -> Weights:
        """The buffered update D = sum_i s(tau_i) p_i Delta_i / sum_i p_i (float64)."""
        if not self.buffer:
            raise ValueError("flush of an empty buffer")
        total = float(sum(u.weight for u in self.buffer))
        step = [np.zeros(d.shape, dtype=np.float64) for d in self.buffer[0].delta]
        for u in self.buffer:
            s = staleness_weight(self.staleness, self.tau(u.version), self.a, self.b)
            for acc, d in zip(step, u.delta, strict=True):
                acc += (s * u.weight / total) * d.astype(np.float64)
        return step

    def flush(self, w: Weights, apply: Apply | None = None) -> Flush:
        """w + eta_g * D over the buffer (``step``), or ``apply(w, D)`` where the method's
        server rule takes D (FedAdam's optimiser); empties the buffer, advances the version."""
        step = self.step()
        taus = [self.tau(u.version) for u in self.buffer]
        factors = [staleness_weight(self.staleness, t, self.a, self.b) for t in taus]
        new = (apply(w, step) if apply is not None else
               [(a.astype(np.float64) + self.server_lr * d).astype(a.dtype)
                for a, d in zip(w, step, strict=True)])
        out = Flush(weights=new, version=self.version + 1, replies=len(self.buffer),
                    staleness=tuple(taus), factors=tuple(factors), dropped=self.dropped,
                    clients=tuple(u.client for u in self.buffer),
                    started=tuple(u.version for u in self.buffer))
        self.version += 1
        self.buffer = []
        self.dropped = 0
        return out


def delta_of(upload: Weights, started_from: Weights, variant: str) -> Weights:
    """Delta_i from a reply: the upload itself under ``update`` (w_iK - s_i), else the final
    model minus the version the client received (``model``)."""
    if variant == "update":
        return list(upload)
    return [(u.astype(np.float64) - s.astype(np.float64)).astype(u.dtype)
            for u, s in zip(upload, started_from, strict=True)]


def mean_max(values: Sequence[int]) -> tuple[float | None, int | None]:
    """Mean and max of a flush's staleness values (None for none)."""
    if not values:
        return None, None
    return float(np.mean(values)), int(max(values))
