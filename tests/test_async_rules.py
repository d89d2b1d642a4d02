"""Asynchronous rules that save client work (issue 45): server momentum on the buffered
update (``server-momentum``) and the staleness-aware client lr (``async-lr-scale``).

Each rule against numbers worked by hand with a fixed completion order, the real FedBuff loop
on the least-squares problem against a numpy oracle (stale, lost and rejected replies), and
the async rule equal to its sync rule where nothing is stale (buffer = concurrency = the one
client: every flush is a sync round)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from fedinit.config import RunConfig
from fedinit.config.errors import ConfigError
from fedinit.methods import wire as rk
from fedinit.methods.async_server_opt import (
    VELOCITY,
    expected_staleness,
    lr_scale,
    momentum_step,
    with_server_momentum,
)
from fedinit.methods.fedavg import FedAvgServer
from fedinit.methods.fedbuff import BufferedUpdate, FedBuff
from fedinit.methods.method import Params, RoundInput
from fedinit.methods.scaffold import ScaffoldServer
from testbeds.lsq_async import ScriptedGrid, make_loop
from testbeds.lsq_problem import Federation, Problem, buffered_replay, lsq_problem
from tests.test_async_state import LOCAL, SCRIPT, N, async_cfg, problem, run_async

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")


def rnd(d: list[float], server_lr: float = 1.0) -> RoundInput:
    return RoundInput(server_round=1, aggregate=[np.array(d, np.float32)], updates=[],
                      weights=[], variant="update", num_clients=2, lr=0.1,
                      server_lr=server_lr)


# ---------------------------------------------------------------- server momentum by hand
def test_momentum_on_fedbuffs_buffered_update_by_hand() -> None:
    """K = 2, constant s(tau), uniform weights, mu = 0.5, eta_g = 2, w_0 = (1, 1).
    Flush 1 takes replies (1, 0) and (0, 2): D = (0.5, 1), s = eta_g D = (1, 2), v = (1, 2),
    w_1 = (2, 3). Flush 2 takes (2, 2) [tau 1] and (0, -2) [tau 0]: D = (1, 0), s = (2, 0),
    v = 0.5 (1, 2) + (2, 0) = (2.5, 1), w_2 = (4.5, 4)."""
    rule = with_server_momentum(FedAvgServer, 0.5)(Params())
    w = [np.array([1.0, 1.0], np.float32)]
    state = rule.init(w)
    assert getattr(state, VELOCITY)[0].tolist() == [0.0, 0.0]
    buf = FedBuff(buffer_size=2, server_lr=2.0, staleness="constant")
    holder = {"state": state}

    def apply(w_t: list[np.ndarray], step: list[np.ndarray]) -> list[np.ndarray]:
        out, holder["state"] = rule.update(holder["state"], w_t, rnd(step[0].tolist(), 2.0))
        return out

    for d in ([1.0, 0.0], [0.0, 2.0]):
        buf.offer(BufferedUpdate([np.array(d, np.float32)], version=0, weight=1.0))
    w = buf.flush(w, apply).weights
    assert w[0].tolist() == [2.0, 3.0]
    assert getattr(holder["state"], VELOCITY)[0].tolist() == [1.0, 2.0]
    buf.offer(BufferedUpdate([np.array([2.0, 2.0], np.float32)], version=0, weight=1.0))
    buf.offer(BufferedUpdate([np.array([0.0, -2.0], np.float32)], version=1, weight=1.0))
    flush = buf.flush(w, apply)
    assert flush.staleness == (1, 0)
    assert flush.weights[0].tolist() == [4.5, 4.0]
    assert getattr(holder["state"], VELOCITY)[0].tolist() == [2.5, 1.0]


def test_momentum_step_and_the_wrapped_rules_state() -> None:
    w, v = [np.array([1.0, -1.0], np.float32)], [np.array([0.5, 0.25])]
    nxt, v2 = momentum_step(w, [np.array([1.5, -1.0], np.float32)], v, 0.8)
    assert v2[0].tolist() == [0.8 * 0.5 + 0.5, 0.8 * 0.25]  # (0.9, 0.2)
    np.testing.assert_allclose(nxt[0], [1.9, -0.8], rtol=1e-6)
    assert nxt[0].dtype == np.float32
    with pytest.raises(ValueError, match="server-momentum=1.0 is not allowed"):
        momentum_step(w, w, v, 1.0)
    assert with_server_momentum(FedAvgServer, 0.0) is FedAvgServer
    wrapped = with_server_momentum(ScaffoldServer, 0.5)
    state = wrapped(Params()).init([np.zeros(2, np.float32)])
    assert sorted(state.arrays()) == ["c", VELOCITY]  # SCAFFOLD's c kept, v added
    assert type(state).from_arrays(state.arrays()) == state  # a checkpoint reads it back


# ---------------------------------------------------------------- the loop against an oracle
def oracle(p: Problem, script: list[tuple[int, str]], buffer_size: int, flushes: int,
           mu: float, a: float = 0.5) -> np.ndarray:
    """FedAvg's FedBuff over ``script`` (full-batch local GD, uniform weights, poly s(tau)),
    then v <- mu v + D, w <- w + v (eta_g = 1), in float64 with w float32 between flushes."""
    k_steps, lr = LOCAL["local-epochs"], LOCAL["lr"]
    w = p.w0.astype(np.float64)
    v = np.zeros_like(w)

    def train(cid: int, w_sent: np.ndarray, tau: int) -> tuple[np.ndarray, int]:
        y = w_sent.copy()
        for _ in range(k_steps):
            y -= lr * p.gradient(cid, y)
        return y - w_sent, tau

    def flush(buffer: list[tuple[np.ndarray, int]]) -> None:
        nonlocal w, v
        d = sum((1.0 + t) ** -a * dd for dd, t in buffer) / buffer_size
        v = mu * v + d
        w = (w + v).astype(np.float32).astype(np.float64)

    buffered_replay(script, p.num_clients, buffer_size, flushes, lambda cid, busy: w.copy(),
                    train, flush)
    return w


@pytest.mark.parametrize("mu", [0.5, -0.3])
def test_the_loop_with_momentum_equals_the_oracle(tmp_path: Path, mu: float) -> None:
    """Stale (tau up to 2), lost and rejected replies (tests/test_async_state.py's SCRIPT)."""
    raw = {"method": "fedavg", "buffer-size": 2, "num-server-rounds": 5, "staleness": "poly",
           "staleness-a": 0.5, "server-momentum": mu}
    got, strategy, _, _ = run_async(raw, SCRIPT, tmp_path / "m")
    np.testing.assert_allclose(got, oracle(problem(), SCRIPT, 2, 5, mu), rtol=1e-5, atol=1e-6)
    plain, _, _, _ = run_async({**raw, "server-momentum": 0.0}, SCRIPT, tmp_path / "off")
    np.testing.assert_allclose(plain, oracle(problem(), SCRIPT, 2, 5, 0.0), rtol=1e-5,
                               atol=1e-6)
    assert np.abs(got - plain).max() > 1e-3  # the momentum really moved the model
    assert np.abs(getattr(strategy.state, VELOCITY)[0]).max() > 1e-3


def test_async_momentum_without_delays_is_the_sync_rule(tmp_path: Path) -> None:
    """buffer-size = concurrency = 1 with the one client: every reply starts from the newest
    version (tau 0), so each flush is a sync round; 4 flushes of momentum 0.7 end where 4
    sync rounds of the same momentum end (the real sync strategy, ``Federation``), and where
    the oracle's FedAvgM does."""
    p = lsq_problem(num_clients=1, dim=5, n=20, seed=3)
    raw = {"method": "fedavg", "num-server-rounds": 4, "server-momentum": 0.7,
           "staleness": "poly"}
    cfg = RunConfig.parse({**LOCAL, "num-clients": 1, "rounds": "async", "concurrency": 1,
                           "buffer-size": 1, **raw})
    grid = ScriptedGrid(p, cfg, [(0, "ok")] * 4, tmp_path)
    loop, _ = make_loop(grid)
    got = loop.run([p.w0.copy()], lambda flush, facts: None)[0]
    sync_raw = {k: v for k, v in {**LOCAL, **raw}.items() if k != "staleness"}
    fed = Federation(p, {**sync_raw, "num-clients": 1, "fraction-train": 1.0})
    sync = fed.run(4)
    np.testing.assert_allclose(got, sync, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, oracle(p, [(0, "ok")] * 4, 1, 4, 0.7), rtol=1e-5,
                               atol=1e-6)
    plain = Federation(p, {**sync_raw, "num-clients": 1, "fraction-train": 1.0,
                           "server-momentum": 0.0}).run(4)
    assert np.abs(sync - plain).max() > 1e-3  # momentum changed the sync run too


# ---------------------------------------------------------------- staleness-aware client lr
def test_lr_scale_by_hand() -> None:
    # K = 4: 2 tasks in flight and 1 reply buffered -> tau_hat = 3/4; a = 1 -> 1 / 1.75
    assert expected_staleness(2, 1, 4) == 0.75
    assert lr_scale(1.0, 0.75) == pytest.approx(1 / 1.75)
    assert lr_scale(0.5, 3.0) == pytest.approx(0.5)  # (1 + 3)^-0.5
    assert lr_scale(2.0, 0.0) == 1.0 and lr_scale(0.0, 5.0) == 1.0
    with pytest.raises(ValueError, match="async-lr-scale=-1.0 is not allowed"):
        lr_scale(-1.0, 1.0)
    with pytest.raises(ValueError, match="buffer-size=0 is not allowed"):
        expected_staleness(1, 0, 0)


class LrGrid(ScriptedGrid):
    """``ScriptedGrid`` keeping (client, lr) of every task in the order it was pushed."""

    sent_lr: list[tuple[int, float]]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        if not hasattr(self, "sent_lr"):
            self.sent_lr = []
        self.sent_lr += [(m.metadata.dst_node_id - 1000,
                          float(m.content.config_records[rk.CONFIG][rk.LR])) for m in messages]
        return super().push_messages(messages)


def lr_oracle(p: Problem, script: list[tuple[int, str]], buffer_size: int, flushes: int,
              a: float, first: list[int], s_a: float = 0.5) -> tuple[np.ndarray, list[float]]:
    """FedBuff over ``script`` with concurrency N where each task is trained at lr x
    (1 + (in flight + buffered) / K)^-a, counts taken when it is sent; the scales used.
    ``first``: the order the first fill sent the clients in (the loop's seeded choice)."""
    k_steps, lr, n = LOCAL["local-epochs"], LOCAL["lr"], p.num_clients
    w = p.w0.astype(np.float64)
    scales: list[float] = []
    assert sorted(first) == list(range(n))

    def send(cid: int, busy: int) -> tuple[np.ndarray, float]:
        """A task sent with ``busy`` tasks out and replies buffered: the first fill's i-th
        sees i; a refill (at once) the N - 1 others and the buffer after this reply."""
        scales.append((1.0 + busy / buffer_size) ** -a)
        return w.copy(), scales[-1]

    def train(cid: int, sent: tuple[np.ndarray, float], tau: int) -> tuple[np.ndarray, int]:
        w_sent, scale = sent
        y = w_sent.copy()
        for _ in range(k_steps):
            y -= scale * lr * p.gradient(cid, y)
        return y - w_sent, tau

    def flush(buffer: list[tuple[np.ndarray, int]]) -> None:
        nonlocal w
        w = w + sum((1.0 + t) ** -s_a * dd for dd, t in buffer) / buffer_size
        w = w.astype(np.float32).astype(np.float64)

    buffered_replay(script, n, buffer_size, flushes, send, train, flush, first)
    return w, scales


def test_the_loop_with_scaled_client_lr_equals_the_oracle(tmp_path: Path) -> None:
    raw = {"method": "fedavg", "buffer-size": 2, "num-server-rounds": 5, "staleness": "poly",
           "staleness-a": 0.5, "async-lr-scale": 1.0}
    grid = LrGrid(problem(), async_cfg(raw), SCRIPT, tmp_path / "s")
    loop, _ = make_loop(grid)
    got = loop.run([grid.p.w0.copy()], lambda flush, facts: None)[0]
    first = [cid for cid, _ in grid.sent_lr[:N]]
    want, scales = lr_oracle(problem(), SCRIPT, 2, 5, 1.0, first)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    sent = [lr / LOCAL["lr"] for _, lr in grid.sent_lr]
    np.testing.assert_allclose(sent, scales[:len(sent)], rtol=1e-6)  # what each task got
    # first fill: 1, 1/1.5, 1/2, 1/2.5; then N - 1 = 3 in flight: 1/2.5 or 1/3
    assert scales[:4] == pytest.approx([1.0, 1 / 1.5, 0.5, 0.4])
    assert set(np.round(scales[4:], 6)) == {round(1 / 2.5, 6), round(1 / 3, 6)}
    plain, _, _, _ = run_async({**raw, "async-lr-scale": 0.0}, SCRIPT, tmp_path / "off")
    np.testing.assert_allclose(plain, lr_oracle(problem(), SCRIPT, 2, 5, 0.0, first)[0],
                               rtol=1e-5, atol=1e-6)
    assert np.abs(got - plain).max() > 1e-3


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(("over", "message"), [
    ({"server-momentum": 1.0}, "server-momentum=1.0 is not allowed; allowed: -1 < "
     "server-momentum < 1"),
    ({"server-momentum": 0.9, "method": "fedadam"}, "server-momentum=0.9 is not allowed; "
     "allowed: 0 with method='fedadam' (its Adam step keeps its own first moment"),
    ({"async-lr-scale": -0.5, "rounds": "async"}, "async-lr-scale=-0.5 is not allowed; "
     "allowed: a number >= 0"),
    ({"async-lr-scale": 1.0}, "async-lr-scale=1.0 is not allowed; allowed: 0 with "
     "rounds='sync'"),
])
def test_bad_settings_fail_in_one_line(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as err:
        RunConfig.parse({"personal-eval-every": 0, **over})
    assert "\n" not in str(err.value)
    assert RunConfig.parse({"server-momentum": 0.9}).train.server_momentum == 0.9
