"""SCAFFOLD under ``rounds=async``: the real FedBuff loop, strategy and client code on the
least-squares problem with a hand-written completion order (``testbeds/lsq_async.py``: who
answers next, and whether that reply is lost or rejected); and why FedDyn is refused (its
rule, built the same way, diverges where its sync round converges).

The oracle below replays the script with numpy: full-batch local gradient steps, each
client's accounted c_i, the buffer, s(tau) and the flushes, none of it read from the code
under test.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedinit.config import RunConfig
from fedinit.methods.registry import METHODS
from fedinit.methods.scaffold import C_LOCAL
from fedinit.store.state_dir import StateDir
from server_app.checkpoint import load_checkpoint
from strategies.async_loop import AsyncLoop, BufferedStrategy
from testbeds import lsq_resume
from testbeds.lsq_async import (
    EXPERIMENT,
    Script,
    ScriptedGrid,
    run_lsq_async,
    speed_order,
)
from testbeds.lsq_problem import Federation, Problem, buffered_replay, lsq_optimum, lsq_problem
from testbeds.lsq_resume import resumable_run

N, DIM, K_STEPS, LR = 4, 5, 5, 0.05
FLUSHES = 40
"""FedDyn's divergence test: flushes (and sync rounds)."""
LOCAL = {"num-clients": N, "lr": LR, "local-epochs": K_STEPS, "batch-size": 1000,
         "weighting": "uniform", "weight-decay": 0.0, "clip-norm": 0.0, "lr-decay": 1.0,
         "beta": 0.0, "max-update-norm-ratio": 0.0, "personal-eval-every": 0,
         "output-dir": "/tmp/unused"}
"""Full-batch steps (batch-size > n), no RI, decay, clipping or norm filter: the oracle stays
short (as ``testbeds.lsq_problem.Federation``)."""


def problem() -> Problem:
    return lsq_problem(num_clients=N, dim=DIM, n=20, seed=3)


def async_cfg(raw: dict[str, Any]) -> RunConfig:
    return RunConfig.parse({**LOCAL, "rounds": "async", "concurrency": N, **raw})


def run_async(raw: dict[str, Any], script: Script, root: Path, p: Problem | None = None,
              ) -> tuple[np.ndarray, BufferedStrategy, ScriptedGrid, AsyncLoop]:
    """The real loop over ``script``; its final model, strategy, grid and loop."""
    return run_lsq_async(p or problem(), async_cfg(raw), script, root)


# ---------------------------------------------------------------------------- the oracle
def oracle(script: Script, buffer_size: int, flushes: int, s: dict[int, float],
           max_staleness: int = 0, server_lr: float = 1.0) -> dict[str, Any]:
    """FedBuff with SCAFFOLD's c over ``script``, in float64."""
    p = problem()
    w, c = p.w0.astype(np.float64), np.zeros(DIM)
    acc = {cid: np.zeros(DIM) for cid in range(N)}  # each client's accounted c_i

    def train(cid: int, sent: tuple[np.ndarray, np.ndarray], tau: int
              ) -> tuple[np.ndarray, int, np.ndarray] | None:
        w_sent, c_sent = sent
        y = w_sent.copy()
        for _ in range(K_STEPS):
            y -= LR * (p.gradient(cid, y) + c_sent - acc[cid])
        if max_staleness and tau > max_staleness:
            return None
        new = acc[cid] - c_sent + (w_sent - y) / (K_STEPS * LR)
        buffered = (y - w_sent, tau, new - acc[cid])
        acc[cid] = new
        return buffered

    def flush(buffer: list[tuple[np.ndarray, int, np.ndarray]]) -> None:
        nonlocal w, c
        w = w + server_lr * sum(s[t] * d for d, t, _ in buffer) / buffer_size
        c = c + sum(dc for _, _, dc in buffer) / N  # unweighted, each reply once
        w = w.astype(np.float32).astype(np.float64)  # the model is float32 between flushes

    flushed = buffered_replay(script, N, buffer_size, flushes,
                              lambda cid, busy: (w.copy(), c.copy()), train, flush)
    taus = [sorted(t for _, t, _ in buffer) for buffer in flushed]
    return {"w": w, "c": c, "acc": acc, "taus": taus}


SCRIPT: Script = [(0, "ok"), (1, "ok"), (0, "ok"), (2, "ok"), (0, "lost"), (1, "ok"),
                  (3, "ok"), (0, "ok"), (2, "nan"), (1, "ok"), (3, "ok"), (0, "ok"),
                  (2, "ok"), (1, "ok")]
"""Client 3 first answers after two flushes (tau 2), client 2 after one; client 0 loses a
reply and client 2 sends a rejected one; replies of one flush started from up to three
versions."""
POLY = {t: (1.0 + t) ** -0.5 for t in range(10)}


@pytest.mark.parametrize("server_lr", [1.0, 0.7])
def test_stale_lost_and_rejected_replies_match_the_oracle(tmp_path: Path,
                                                          server_lr: float) -> None:
    raw = {"method": "scaffold", "buffer-size": 2, "num-server-rounds": 5,
           "staleness": "poly", "staleness-a": 0.5, "server-lr": server_lr}
    w, strategy, _, _ = run_async(raw, SCRIPT, tmp_path)
    want = oracle(SCRIPT, 2, 5, POLY, server_lr=server_lr)
    assert max(want["taus"][i][-1] for i in range(5)) == 2  # stale replies are in the buffers
    np.testing.assert_allclose(w, want["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(strategy.state.c[0], want["c"], rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(want["c"]) > 1e-2  # c moved
    flat = oracle(SCRIPT, 2, 5, dict.fromkeys(range(10), 1.0), server_lr=server_lr)
    assert np.abs(flat["w"] - want["w"]).max() > 1e-4  # s(tau) really changes the model


def test_server_c_is_the_mean_of_the_clients_accounted_c_i(tmp_path: Path) -> None:
    """After lost, rejected and stale-dropped replies (max-staleness=1 drops client 3's
    first reply), c is (1/N) sum_i c_i over each client's state file of the round the server
    last accounted for it (read from disk); the newest files differ (a lost reply's change is
    there, not counted)."""
    raw = {"method": "scaffold", "buffer-size": 2, "num-server-rounds": 5,
           "staleness": "poly", "staleness-a": 0.5, "max-staleness": 1}
    _, strategy, grid, _ = run_async(raw, SCRIPT, tmp_path)
    rounds = strategy.accounted or {}
    accounted, newest = [], []
    for cid in range(N):
        disk = StateDir(tmp_path, EXPERIMENT, cid)
        a = rounds.get(cid, 0)
        accounted.append(disk.load_version(a, [np.zeros(DIM)])[C_LOCAL][0].astype(np.float64)
                         if a else np.zeros(DIM))
        newest.append(grid.store(cid).get(C_LOCAL)[0].astype(np.float64))  # type: ignore[index]
    assert set(rounds) == set(range(N)) and min(rounds.values()) >= 1
    got = strategy.state.c[0]
    np.testing.assert_allclose(got, np.mean(accounted, axis=0), rtol=1e-5, atol=1e-6)
    assert np.abs(np.mean(newest, axis=0) - got).max() > 1e-3  # the newest c_i were not all
    np.testing.assert_allclose(got, oracle(SCRIPT, 2, 5, POLY, max_staleness=1)["c"],
                               rtol=1e-5, atol=1e-6)


def test_one_buffer_of_all_clients_is_the_sync_round(tmp_path: Path) -> None:
    """concurrency = buffer-size = N, no delays, constant staleness: flush 1 is sync round 1
    of ``Federation`` (the sync strategy on the same problem): model, c and every c_i."""
    raw = {"method": "scaffold", "buffer-size": N, "num-server-rounds": 1,
           "staleness": "constant", "server-lr": 1.0}
    script: Script = [(cid, "ok") for cid in range(N)]
    w, strategy, grid, _ = run_async(raw, script, tmp_path)
    fed = Federation(problem(), {k: v for k, v in {**LOCAL, **raw}.items()
                                 if k not in ("buffer-size", "staleness")}
                     | {"fraction-train": 1.0})
    sync = fed.run(1)
    np.testing.assert_allclose(w, sync, rtol=1e-6, atol=1e-7)
    assert np.abs(w - problem().w0).max() > 1e-2
    np.testing.assert_allclose(strategy.state.c[0], fed.strategy.state.c[0],
                               rtol=1e-6, atol=1e-7)
    assert np.abs(strategy.state.c[0]).max() > 1e-2
    for cid in range(N):
        mine = StateDir(tmp_path, EXPERIMENT, cid).load_version(1, [np.zeros(DIM)])[C_LOCAL][0]
        np.testing.assert_allclose(mine, fed.state_of(cid, C_LOCAL)[0],  # type: ignore[index]
                                   rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------- kill and resume
KILLED: Script = [(1, "ok"), (0, "ok"), (1, "nan"), (2, "ok"), (3, "ok"), (1, "ok")]
"""Version 2's checkpoint (after the 5th reply) has client 1 accounted at its round 1 (its
round-2 reply was rejected) with its round-3 task, sent version 1, in flight. Its round-3
reply is then buffered (accounted: round 3) and its round-4 task sent before the kill, so
it has saved rounds 1 to 4 and names round 3 as accounted: round 1, which the resumed run
names again, is kept only because the server asks for it (``keep-accounted``)."""
AFTER: Script = [(1, "ok"), (0, "ok"), (2, "ok"), (3, "ok"), (1, "ok"), (0, "ok"),
                 (2, "ok"), (3, "ok")]
"""What follows the checkpoint in the uninterrupted run (the resumed one redoes the first)."""


def uninterrupted_and_killed(tmp_path: Path) -> tuple[Any, np.ndarray, Any, Path, Path]:
    """The SCAFFOLD run of both resume tests: its config, the uninterrupted run's model and
    loop, and the run and state directories of the same run killed after checkpoint 2."""
    raw = {"method": "scaffold", "buffer-size": 2, "num-server-rounds": 5,
           "staleness": "poly", "staleness-a": 0.5}
    cfg = async_cfg(raw)
    return cfg, *lsq_resume.uninterrupted_and_killed(problem(), cfg, tmp_path, KILLED, AFTER,
                                                     ckpt_at=2)


def test_killed_after_the_accounted_round_moved_and_resumed_ends_bit_identical(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Fresh nodes (no memory) over the same state directories: the resumed run redoes the
    tasks in flight at version 2 (client 1's from version 1, with c of version 1) and ends
    with the uninterrupted run's model and state, bit for bit, with no state fallback."""
    cfg, ref_w, ref, run_dir, states = uninterrupted_and_killed(tmp_path)
    assert sorted(int(f.stem[1:]) for f in (states / EXPERIMENT / "client-1").glob("r*")) \
        == [1, 2, 3, 4]
    ckpt = load_checkpoint(run_dir)
    assert "version-1/scaffold-c" in ckpt.extra  # client 1's task in flight carries c_1
    caplog.set_level(logging.WARNING)
    w, got = resumable_run(ScriptedGrid(problem(), cfg, AFTER, states), run_dir,
                           ckpt_at=0, resume=True)
    assert "accounted for is lost" not in caplog.text
    assert w.tobytes() == ref_w.tobytes()
    mine, want = got.server_state(), ref.server_state()
    assert set(mine) == set(want)
    assert all(a.tobytes() == b.tobytes() for k in want
               for a, b in zip(mine[k], want[k], strict=True))


def test_without_keep_accounted_the_resumed_client_loses_its_accounted_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The same kill with the pin left out: client 1's round 1 is gone when its redone task
    rebases c_i on it (a state fallback), and the run ends elsewhere."""
    monkeypatch.setattr(AsyncLoop, "accounted_at_checkpoint", lambda self: {})
    cfg, ref_w, _, run_dir, states = uninterrupted_and_killed(tmp_path)
    assert sorted(int(f.stem[1:]) for f in (states / EXPERIMENT / "client-1").glob("r*")) \
        == [2, 3, 4]
    caplog.set_level(logging.WARNING)
    w, _ = resumable_run(ScriptedGrid(problem(), cfg, AFTER, states), run_dir,
                         ckpt_at=0, resume=True)
    assert "accounted for is lost" in caplog.text
    assert np.abs(w - ref_w).max() > 1e-6


# ---------------------------------------------------------------------------- FedDyn: refused
def test_feddyn_under_fedbuff_diverges_where_its_sync_round_converges(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why ``rounds=async`` refuses FedDyn (its ``MethodSpec.async_refusal``). Its rule built
    as SCAFFOLD's is (H += each buffered move once, unweighted; w <- w + D + H / N per flush)
    on the 8-client problem of tests/test_methods_lsq.py, alpha 1, 4 of 8 clients a flush, all
    equally fast (round robin: after the first flush every reply is one version stale): the
    error to the optimum grows past w_0's, while sync FedDyn with 4 of 8 clients a round
    converges, and so does SCAFFOLD in the same asynchronous schedule."""
    monkeypatch.setattr("fedinit.methods.feddyn.SPEC",
                        dataclasses.replace(METHODS["feddyn"], async_refusal=None))
    p = lsq_problem(num_clients=8, dim=5, n=20, seed=0)
    opt = lsq_optimum(p)

    def error(w: np.ndarray) -> float:
        return float(np.linalg.norm(w - opt) / np.linalg.norm(opt))

    eight = {"num-clients": 8, "concurrency": 8, "lr": 0.1, "local-epochs": 10,
             "feddyn-alpha": 1.0, "buffer-size": 4, "staleness": "constant",
             "num-server-rounds": FLUSHES}
    script = speed_order([1.0] * 8, 4 * FLUSHES + 8)  # round robin
    got = {m: error(run_async({**eight, "method": m}, script, tmp_path / m, p)[0])
           for m in ("feddyn", "scaffold")}
    sync = Federation(p, {**LOCAL, **eight, "method": "feddyn", "fraction-train": 0.5})
    assert error(sync.run(FLUSHES)) < 1e-2
    assert got["feddyn"] > 1.0 == error(p.w0)  # worse than not training at all
    assert got["scaffold"] < 0.2
