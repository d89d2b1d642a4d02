"""``stale-correction=dc`` (delay compensation of a stale reply): the pure rule against values
worked by hand, the real FedBuff loop on the least-squares problem against a numpy oracle
that corrects each stale reply itself, its one-line config errors, and a resume after a kill
mid-buffer that ends bit-identical (the correction keeps no state of its own: it needs only
the version a task carried, which the checkpoint already keeps for every task in flight)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.config.errors import ConfigError
from fedinit.methods.stale_correction import dc_contraction, delay_compensated
from server_app.async_rounds import run_async_experiment
from server_app.checkpoint import load_checkpoint
from testbeds.lsq_problem import Problem, buffered_replay
from tests.test_async_fedrelax import async_cfg as fedrelax_cfg
from tests.test_async_resume import config, final_model, killed_beside_reference, rows, same
from tests.test_async_state import LOCAL, SCRIPT, N, problem, run_async

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")


def test_the_rule_on_values_worked_by_hand() -> None:
    delta = [np.array([1.0, 2.0, 3.0, 0.0], np.float32), np.zeros(2, np.float32)]
    sent = [np.array([0.0, 0.0, 0.0, 0.0], np.float32), np.array([1.0, 1.0], np.float32)]
    now = [np.array([1.0, -1.0, 0.5, 4.0], np.float32), np.array([3.0, 0.0], np.float32)]
    # mean(Delta^2) = (1 + 4 + 9 + 0) / 4 = 3.5; lambda 0.7: -J = 0.2, 0.8, 1.8 -> 1, 0
    got = delay_compensated(delta, sent, now, 0.7)
    np.testing.assert_allclose(got[0], [1.0 - 0.2 * 1.0, 2.0 + 0.8 * 1.0, 3.0 - 0.5, 0.0],
                               rtol=1e-6)
    assert got[0].dtype == np.float32
    np.testing.assert_array_equal(got[1], [0.0, 0.0])  # an all-zero update: J = 0
    np.testing.assert_allclose(dc_contraction(delta[0], 0.7), [0.2, 0.8, 1.0, 0.0])
    for unchanged in (delay_compensated(delta, sent, now, 0.0),
                      delay_compensated(delta, sent, sent, 0.7)):
        assert all(np.array_equal(a, b) for a, b in zip(unchanged, delta, strict=True))
    with pytest.raises(ValueError, match="dc-lambda=-0.1 is not allowed"):
        delay_compensated(delta, sent, now, -0.1)
    with pytest.raises(ValueError, match="as many tensors"):
        delay_compensated(delta, sent[:1], now, 0.5)


def oracle(p: Problem, script: list[tuple[int, str]], buffer_size: int, flushes: int,
           lam: float, a: float = 0.5) -> tuple[np.ndarray, list[list[int]]]:
    """FedAvg's FedBuff over ``script`` (full-batch local GD, uniform weights, poly s(tau)),
    each reply of tau > 0 corrected here: Delta - clip(lam Delta^2 / mean Delta^2, 0, 1)
    (w_now - w_sent), w_now the model its flush steps from."""
    k_steps, lr = LOCAL["local-epochs"], LOCAL["lr"]
    w = p.w0.astype(np.float64)

    def train(cid: int, w_sent: np.ndarray, tau: int) -> tuple[np.ndarray, int]:
        y = w_sent.copy()
        for _ in range(k_steps):
            y -= lr * p.gradient(cid, y)
        d = y - w_sent
        if tau > 0:
            undone = np.minimum(lam * d * d / np.mean(d * d), 1.0)
            d = d - undone * (w - w_sent)
        return d, tau

    def flush(buffer: list[tuple[np.ndarray, int]]) -> None:
        nonlocal w
        w = w + sum((1.0 + t) ** -a * d for d, t in buffer) / buffer_size
        w = w.astype(np.float32).astype(np.float64)  # float32 between flushes

    flushed = buffered_replay(script, p.num_clients, buffer_size, flushes,
                              lambda cid, busy: w.copy(), train, flush)
    return w, [sorted(t for _, t in buffer) for buffer in flushed]


@pytest.mark.parametrize("lam", [0.3, 2.0])
def test_the_loop_on_least_squares_equals_the_oracles_corrected_flushes(
        tmp_path: Path, lam: float) -> None:
    """Clients 2 and 3 answer one and two versions late, client 0 loses a reply and client
    2's is rejected (``SCRIPT``); lambda 2 clips -J at 1 on the largest coordinates."""
    raw = {"method": "fedavg", "buffer-size": 2, "num-server-rounds": 5, "staleness": "poly",
           "staleness-a": 0.5, "stale-correction": "dc", "dc-lambda": lam}
    got, _, _, _ = run_async(raw, SCRIPT, tmp_path / "dc")
    want, taus = oracle(problem(), SCRIPT, 2, 5, lam)
    assert any(t > 0 for flush in taus for t in flush)  # stale replies were corrected
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plain, _, _, _ = run_async({**raw, "stale-correction": "off"}, SCRIPT, tmp_path / "off")
    np.testing.assert_allclose(plain, oracle(problem(), SCRIPT, 2, 5, 0.0)[0], rtol=1e-5,
                               atol=1e-6)
    assert np.abs(got - plain).max() > 1e-4  # the correction really moved the model


def test_no_stale_reply_means_no_correction(tmp_path: Path) -> None:
    """One buffer of all clients, each from version 0: the same model as without it."""
    raw = {"method": "fedavg", "buffer-size": N, "num-server-rounds": 1,
           "stale-correction": "dc", "dc-lambda": 1.0}
    script = [(cid, "ok") for cid in range(N)]
    got, _, _, _ = run_async(raw, script, tmp_path / "dc")
    off, _, _, _ = run_async({**raw, "stale-correction": "off"}, script, tmp_path / "off")
    assert got.tobytes() == off.tobytes()


@pytest.mark.parametrize(("over", "message"), [
    ({"stale-correction": "newest"}, "stale-correction='newest' is not allowed; allowed: off | dc"),
    ({"dc-lambda": -1.0}, "dc-lambda=-1.0 is not allowed; allowed: a number >= 0"),
    ({"stale-correction": "dc", "dp": "central", "weighting": "uniform"},
     "stale-correction='dc' is not allowed; allowed: off with dp='central' with rounds='async' "
     "(the correction depends on the clipped Delta"),
])
def test_bad_settings_fail_in_one_line(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("|", r"\|")) as err:
        RunConfig.parse({"rounds": "async", "personal-eval-every": 0, **over})
    assert "\n" not in str(err.value)


def test_killed_mid_buffer_and_resumed_ends_bit_identical(tmp_path: Path) -> None:
    """FedInit with dc on the virtual clock (tests/test_async_resume.py's schedule): the two
    tasks in flight at the checkpoint are re-sent from their versions, and their stale
    replies are corrected towards the checkpoint's model as in the uninterrupted run."""
    over = {"stale-correction": "dc", "dc-lambda": 0.5}
    run_dir, _ = killed_beside_reference(tmp_path, over)
    assert load_checkpoint(run_dir).server_round == 3
    resumed = config(tmp_path, **over, **{"resume-dir": str(run_dir)})
    run_async_experiment(InProcessGrid(3, resumed.to_dict()), resumed)
    assert same(final_model(run_dir), final_model(tmp_path / "ref-run"))
    got, want = rows(run_dir), rows(tmp_path / "ref-run")
    assert [r["buffered"] for r in got] == [r["buffered"] for r in want]
    assert any(b[2] > 0 for r in want for b in r["buffered"])  # stale replies were in it
    plain = config(tmp_path, **{"output-dir": str(tmp_path / "plain")})
    run_async_experiment(InProcessGrid(3, plain.to_dict()), plain, tmp_path / "plain-run")
    assert not same(final_model(tmp_path / "plain-run"), final_model(run_dir))


def test_fedrelax_is_refused_in_one_line(tmp_path: Path) -> None:
    """A FedRelax reply replaces its client's model: there is no step to correct."""
    with pytest.raises(ConfigError, match=r"stale-correction='dc' is not allowed; allowed: off "
                       r"with method='fedrelax' with rounds='async' \(a reply replaces"):
        fedrelax_cfg(tmp_path, **{"stale-correction": "dc"})
    fedrelax_cfg(tmp_path)  # the same config without it runs
