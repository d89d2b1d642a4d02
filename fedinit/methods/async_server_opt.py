"""Server-side rules for buffered asynchronous rounds that also run in sync rounds, pure numpy.

Server momentum (``server-momentum`` mu; FedAvgM, Hsu, Qi and Brown 2019, "Measuring the
effects of non-identical data distribution for federated visual classification"; on FedBuff's
buffered update as in Nguyen et al. 2022, whose FedBuff runs a server optimiser on the buffer,
and Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling", whose delayed
Nesterov applies the momentum once per N buffered updates):

    s = w' - w_t   (the method's own step on D: eta_g D for FedAvg/FedInit, FedProx, FedSAM)
    v <- mu v + s;  w_{t+1} = w_t + v

which is the brief's v <- mu v + D; w <- w + eta_g v with v scaled by the constant eta_g. A
sync round hands its aggregate D to the rule, an async flush its buffered update (FedBuff's
staleness-weighted mean), so with buffer-size = concurrency and no delays the two are the
same rule on the same D. The velocity is server state, checkpointed with the method's.

Staleness-aware client learning rate (``async-lr-scale`` a): the server sends a task the
local lr eta_t (1 + tau_hat)^-a, tau_hat = (tasks in flight + replies buffered when it is
sent) / K, the flushes that happen before its reply is buffered if replies come back in the
order they were sent: the task's expected staleness, known at dispatch. The basis: Zhang,
Gupta, Lian and Liu 2016 ("Staleness-aware async-SGD", lr eta / tau), applied to the
expected tau at dispatch instead of the measured tau at arrival (which FedBuff's s(tau)
already weights), as delay-adaptive step sizes for asynchronous SGD scale the step by the
delay or the number of concurrent workers (Koloskova, Stich and Jaggi 2022; Mishchenko et
al. 2022). With no task in flight and an empty buffer (the sync round's situation) the
scale is 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedinit.methods.method import RoundInput, ServerRule, ServerState
from fedinit.methods.weights import Weights

VELOCITY = "server_velocity"
"""The field the velocity v adds to a method's server state (float64, model-shaped)."""
MOMENTUM_METHODS: tuple[str, ...] = ("fedavg", "fedprox", "fedsam", "ditto", "scaffold",
                                     "fedcm")
"""Methods whose server rule is a step w_t + eta_g D on one model (SCAFFOLD's and FedCM's
state besides): momentum on that step is FedAvgM's."""
MOMENTUM_REFUSALS: dict[str, str] = {
    "fedadam": "its Adam step keeps its own first moment (adam-beta1)",
    "feddyn": "its model is the clients' mean corrected by h / alpha, not a step of w_t",
    "fedrelax": "a reply replaces its client's model: there is no shared step",
    "clustered": "it keeps one model per cluster: a step is not one model's",
}
"""Why ``server-momentum`` is refused for the other methods (one line each)."""


def momentum_refusal(method: str) -> str | None:
    """Why ``server-momentum`` > 0 cannot run with ``method`` (None: it can)."""
    if method in MOMENTUM_METHODS:
        return None
    return MOMENTUM_REFUSALS.get(method, "its server rule is not a step on one model")


def momentum_step(w_t: Weights, w_rule: Weights, velocity: Weights,
                  mu: float) -> tuple[Weights, Weights]:
    """(w_{t+1}, v'): v' = mu v + (w_rule - w_t), w_{t+1} = w_t + v' (float64 inside, the
    model's dtype out)."""
    if not -1.0 < mu < 1.0:
        raise ValueError(f"server-momentum={mu!r} is not allowed; allowed: -1 < mu < 1")
    v_next, w_next = [], []
    for w, r, v in zip(w_t, w_rule, velocity, strict=True):
        w64 = w.astype(np.float64)
        v_next.append(mu * v + (r.astype(np.float64) - w64))
        w_next.append((w64 + v_next[-1]).astype(r.dtype))
    return w_next, v_next


def with_server_momentum(server: type[ServerRule[Any, Any]],
                         mu: float) -> type[ServerRule[Any, Any]]:
    """``server`` itself at mu = 0; else its subclass whose update is followed by the
    momentum step and whose state adds the velocity (``VELOCITY``, zeros before round 1)."""
    if mu == 0.0:
        return server
    inner: type[ServerState] = server.state_type
    state_type = dataclasses.make_dataclass(
        f"Momentum{inner.__name__}", [(VELOCITY, list)], bases=(inner,), frozen=True)
    names = [f.name for f in dataclasses.fields(inner)]

    def init(self: ServerRule[Any, Any], w0: Weights) -> ServerState:
        # the base rule's init builds self.state_type() (this one): build the method's own
        base = inner() if server.init is ServerRule.init else server.init(self, w0)
        return state_type(**{n: getattr(base, n) for n in names},
                          **{VELOCITY: [np.zeros(a.shape, np.float64) for a in w0]})

    def update(self: ServerRule[Any, Any], state: Any, w_t: Weights,
               rnd: RoundInput) -> tuple[Weights, ServerState]:
        w_rule, base = server.update(self, state, w_t, rnd)
        w_next, v = momentum_step(w_t, w_rule, getattr(state, VELOCITY), mu)
        return w_next, state_type(**{n: getattr(base, n) for n in names}, **{VELOCITY: v})

    return type(f"Momentum{server.__name__}", (server,),
                {"state_type": state_type, "init": init, "update": update,
                 "momentum": mu, "__doc__": f"{server.__name__} with server momentum {mu:g}."})


def expected_staleness(in_flight: int, buffered: int, buffer_size: int) -> float:
    """tau_hat of a task sent now: (tasks in flight, this one not counted, + replies
    buffered) / K, the flushes before its reply is buffered were replies FIFO."""
    if buffer_size < 1 or in_flight < 0 or buffered < 0:
        raise ValueError(f"in_flight={in_flight}, buffered={buffered}, buffer-size="
                         f"{buffer_size} is not allowed; allowed: counts >= 0, buffer-size >= 1")
    return (in_flight + buffered) / buffer_size


def lr_scale(a: float, tau_hat: float) -> float:
    """(1 + tau_hat)^-a: the factor on a task's local lr (1 at a = 0)."""
    if a < 0.0:
        raise ValueError(f"async-lr-scale={a!r} is not allowed; allowed: a number >= 0")
    return float((1.0 + tau_hat) ** -a)
