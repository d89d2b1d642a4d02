"""``dp=central`` under ``rounds=async``: each flush of K buffered replies is one release.

The real FedBuff loop, strategy and client path on the least-squares problem with a
hand-written completion order (``testbeds/lsq_async.py``), its noise from a seeded stream:
- each flush equals an oracle written here (each Delta_i clipped to C, weighted by s(tau),
  summed, one N(0, (z C)^2) draw from the same stream, divided by the fixed K), with stale,
  lost and rejected replies (a rejected one a zero contribution in its slot, never a skip);
- epsilon after T flushes equals ``dp_accounting`` at q = 1 called here, and is larger than
  the sync figure with sampling at m / N;
- the stop at ``dp-target-epsilon`` (before the flush that would pass it) and the count
  before any task carries a flush's model;
- one reply per client per flush: a client with a reply in the buffer gets no task until the
  flush (outside DP it does);
- the run's files leave out who was in a flush, and summary.json says what epsilon promises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from flwr.app import Message

from fedinit.config import ConfigError, RunConfig
from fedinit.methods.dp_budget import Budget
from server_app.async_privacy import FlushPrivacy
from server_app.async_rounds import run_async_experiment
from server_app.privacy import LEDGER_FILE
from strategies.async_loop import AsyncLoop
from testbeds.lsq_async import Script, ScriptedGrid, make_loop
from testbeds.lsq_problem import Problem, lsq_problem

N, DIM, K_STEPS, LR = 4, 5, 5, 0.05
CLIP, Z, SEED = 0.5, 0.8, 7
BASE = {"num-clients": N, "lr": LR, "local-epochs": K_STEPS, "batch-size": 1000,
        "weight-decay": 0.0, "clip-norm": 0.0, "lr-decay": 1.0, "beta": 0.0,
        "max-update-norm-ratio": 0.0, "personal-eval-every": 0, "output-dir": "/tmp/unused",
        "rounds": "async", "concurrency": N, "buffer-size": 2, "staleness": "poly",
        "staleness-a": 0.5, "dp": "central", "dp-clip": CLIP, "dp-noise-multiplier": Z,
        "weighting": "uniform"}
"""Full-batch steps, no RI, decay or clipping in training: the oracle stays short."""

SCRIPT: Script = [(0, "ok"), (1, "ok"),    # flush 1: both from version 0
                  (2, "ok"), (0, "ok"),    # flush 2: client 2 at tau 1
                  (3, "ok"), (1, "nan"),   # flush 3: client 3 at tau 2, client 1 rejected
                  (3, "lost"), (2, "ok"), (3, "ok")]  # flush 4: a lost task re-sent
"""Under DP a client answers again only after the flush that took its reply."""
FLUSHES = 4


def problem() -> Problem:
    return lsq_problem(num_clients=N, dim=DIM, n=20, seed=3)


class WatchedGrid(ScriptedGrid):
    """Records each task pushed as (client, loop version, flushes counted in the ledger)."""

    loop: AsyncLoop | None = None
    pushes: list[tuple[int, int, int]]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ledger = self.root / LEDGER_FILE
        counted = json.loads(ledger.read_text())["rounds-counted"] if ledger.is_file() else 0
        assert self.loop is not None
        for msg in messages:
            self.pushes.append((msg.metadata.dst_node_id - 1000, self.loop.buffer.version,
                                counted))
        return super().push_messages(messages)


def run(root: Path, script: Script, flushes: int, **over: Any) -> tuple[
        np.ndarray, AsyncLoop, WatchedGrid, list[dict[str, Any]]]:
    """The real loop over ``script`` with DP's noise from ``default_rng(SEED)``: its final
    model, loop, grid and flush rows."""
    cfg = RunConfig.parse({**BASE, "num-server-rounds": flushes, **over})
    grid = WatchedGrid(problem(), cfg, script, root)
    grid.pushes = []
    loop, strategy = make_loop(grid)
    grid.loop = loop
    loop.privacy = FlushPrivacy.for_run(cfg, tuple(strategy.rule.up_keys), root, 0, None)
    rows: list[dict[str, Any]] = []
    if loop.privacy is not None:
        loop.privacy.rng = np.random.default_rng(SEED)
    final = loop.run([problem().w0.copy()], lambda flush, facts: rows.append(facts))
    return final[0], loop, grid, rows


# ---------------------------------------------------------------------------- the oracle
def clipped(v: np.ndarray, bound: float) -> np.ndarray:
    length = float(np.linalg.norm(v))
    return v if length <= bound else v * (bound / length)


def oracle(script: Script, flushes: int, *, clip: float | None, noise: bool,
           k: int = 2) -> dict[str, Any]:
    """FedBuff with central DP over ``script`` in float64: each task's reply from the version
    it was sent, clipped (``clip`` None: not), s(tau) = (1 + tau)^-0.5, a rejected reply a
    zero in its slot, a lost one nothing; the sum plus one draw of N(0, (z C)^2) per flush
    from ``default_rng(SEED)`` (``noise``), over K."""
    p, rng = problem(), np.random.default_rng(SEED)
    w = p.w0.astype(np.float64)
    version, buffer, norms = 0, [], []
    task = {cid: (0, w.copy()) for cid in range(N)}
    for cid, fate in script:
        if version == flushes:
            break
        v_sent, w_sent = task.pop(cid)
        y = w_sent.copy()
        for _ in range(K_STEPS):
            y -= LR * p.gradient(cid, y)
        norms.append(float(np.linalg.norm(y - w_sent)))
        tau = version - v_sent
        if fate == "ok":
            buffer.append(((1.0 + tau) ** -0.5, y - w_sent if clip is None
                           else clipped(y - w_sent, clip)))
        elif fate == "nan":
            buffer.append((1.0, np.zeros(DIM)))
        else:  # lost: re-sent at once from the current version
            task[cid] = (version, w.copy())
        if len(buffer) == k:
            total = sum(s * d for s, d in buffer)
            if noise:
                total = total + rng.normal(0.0, Z * CLIP, size=DIM)
            d = (total / k).astype(np.float32).astype(np.float64)
            w = (w + d).astype(np.float32).astype(np.float64)
            version, buffer = version + 1, []
            for idle in set(range(N)) - set(task):  # every idle client is sent the new model
                task[idle] = (version, w.copy())
    assert version == flushes, "the script ends before the last flush"
    return {"w": w, "norms": norms}


def test_each_flush_is_the_clipped_weighted_sum_plus_one_noise_draw_over_k(
        tmp_path: Path) -> None:
    got, loop, grid, rows = run(tmp_path, SCRIPT, FLUSHES)
    want = oracle(SCRIPT, FLUSHES, clip=CLIP, noise=True)
    np.testing.assert_allclose(got, want["w"], rtol=1e-5, atol=1e-5)
    assert max(want["norms"]) > 2 * CLIP  # clipping really binds on some replies
    for clip, noise in ((None, True), (CLIP, False)):  # each of clip and noise changes it
        other = oracle(SCRIPT, FLUSHES, clip=clip, noise=noise)
        assert np.abs(other["w"] - got).max() > 1e-2
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert [r["num-replies"] for r in rows] == [2, 2, 2, 2]  # the rejected reply filled a slot
    assert rows[2]["num-rejected"] == 1 and rows[3]["num-missing"] == 1
    assert [r["staleness-max"] for r in rows] == [0, 1, 2, 1]
    assert [r["dp-rounds-counted"] for r in rows] == [1, 2, 3, 4]


def test_a_rejected_reply_still_releases_the_noised_sum(tmp_path: Path) -> None:
    """Both replies of the only flush rejected: the model moves by the noise over K alone
    (outside DP the two replies would be thrown away and the buffer would wait)."""
    script: Script = [(0, "nan"), (1, "nan")]
    got, _, _, rows = run(tmp_path, script, 1)
    noise = np.random.default_rng(SEED).normal(0.0, Z * CLIP, size=DIM)
    np.testing.assert_allclose(got, problem().w0 + noise / 2, rtol=1e-6, atol=1e-6)
    assert rows[0]["num-rejected"] == 2 and rows[0]["train-loss"] is None


def exact_epsilon(flushes: int, z: float, relation: Any, sensitivity: float,
                  delta: float = 1e-5) -> float:
    accountant = RdpAccountant(neighboring_relation=relation)
    accountant.compose(dpa.GaussianDpEvent(z / sensitivity), flushes)
    return float(accountant.get_epsilon(delta))


def test_epsilon_per_flush_is_unamplified_gaussian_composition(tmp_path: Path) -> None:
    _, _, _, rows = run(tmp_path, SCRIPT, FLUSHES)
    rel = dpa.NeighboringRelation
    for t, row in enumerate(rows, 1):
        assert row["dp-epsilon"] == pytest.approx(
            exact_epsilon(t, Z, rel.REPLACE_ONE, 2.0), rel=1e-9)
        assert row["dp-epsilon-add-remove"] == pytest.approx(
            exact_epsilon(t, Z, rel.ADD_OR_REMOVE_ONE, 1.0), rel=1e-9)
    # a sync run's figure (m = 10 of N = 100 sampled from a secret seed) is amplified:
    # smaller; the async figure does not depend on N
    raw = {**BASE, "rounds": "sync", "num-clients": 100, "fraction-train": 0.1}
    sync = Budget.for_run(RunConfig.parse(raw), channels=1).epsilon(FLUSHES)
    assert sync < 0.7 * rows[-1]["dp-epsilon"]


def test_the_target_stops_before_the_flush_that_would_pass_it(tmp_path: Path) -> None:
    rel = dpa.NeighboringRelation.REPLACE_ONE
    target = (exact_epsilon(2, Z, rel, 2.0) + exact_epsilon(3, Z, rel, 2.0)) / 2
    got, loop, grid, rows = run(tmp_path, SCRIPT, FLUSHES, **{"dp-target-epsilon": target})
    assert [r["round"] for r in rows] == [1, 2] and loop.stopped
    np.testing.assert_allclose(got, oracle(SCRIPT, 2, clip=CLIP, noise=True)["w"],
                               rtol=1e-5, atol=1e-5)
    assert json.loads((tmp_path / LEDGER_FILE).read_text())["rounds-counted"] == 2
    assert max(v for _, v, _ in grid.pushes) == 1  # nothing of version 2 was sent out


def test_a_target_below_the_first_flush_is_refused_before_any_task(tmp_path: Path) -> None:
    rel = dpa.NeighboringRelation.REPLACE_ONE
    with pytest.raises(ConfigError, match="dp-target-epsilon=.* is not allowed"):
        run(tmp_path, SCRIPT, FLUSHES,
            **{"dp-target-epsilon": exact_epsilon(1, Z, rel, 2.0) * 0.9})
    assert not (tmp_path / LEDGER_FILE).exists()


def test_each_flush_is_counted_before_a_task_carries_its_model(tmp_path: Path) -> None:
    _, _, grid, _ = run(tmp_path, SCRIPT, FLUSHES)
    assert {v for _, v, _ in grid.pushes} == {0, 1, 2, 3}
    assert all(counted >= version for _, version, counted in grid.pushes)


def test_a_client_in_the_buffer_gets_no_task_until_the_flush(tmp_path: Path) -> None:
    """K = 2, every client busy: client 0 answers first. Under DP it waits for the flush
    (one reply per client per flush); outside DP its slot is refilled at once, by itself."""
    script: Script = [(0, "ok"), (1, "ok")]
    _, _, dp_grid, _ = run(tmp_path / "dp", script, 1)
    _, _, plain, _ = run(tmp_path / "off", script, 1, dp="off")
    assert sorted(cid for cid, _, _ in dp_grid.pushes) == [0, 1, 2, 3]
    assert sorted(cid for cid, _, _ in plain.pushes) == [0, 0, 1, 2, 3]
    assert plain.pushes[-1][0] == 0


# ------------------------------------------------------------------------- the whole run
SMALL = {"num-clients": 3, "train-limit": 150, "local-epochs": 1, "batch-size": 50,
         "personal-eval-every": 0, "tracking": "off", "rounds": "async", "concurrency": 3,
         "buffer-size": 2, "num-server-rounds": 2, "dp": "central", "dp-clip": 1.0,
         "dp-noise-multiplier": 1.0, "weighting": "uniform"}


@pytest.mark.usefixtures("quick_runs", "fake_clock")
def test_the_run_files_hide_who_was_in_a_flush_and_label_epsilon(tmp_path: Path) -> None:
    from fedinit.cli.inprocess_grid import InProcessGrid

    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp_path)})
    summary = run_async_experiment(InProcessGrid(3, cfg.to_dict()), cfg, tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [r["dp-rounds-counted"] for r in rows] == [1, 2]
    for row in rows:
        assert "clients-trained" not in row and "buffered" not in row
    assert summary["dp-epsilon"] == rows[-1]["dp-epsilon"]
    assert "q = 1" in summary["dp-epsilon-conventions"]["dp-epsilon"]
    assert json.loads((tmp_path / LEDGER_FILE).read_text())["rounds-counted"] == 2



CLIP_C = 1.5
"""``dp-clip-extra``: SCAFFOLD's Delta_c_i bound."""


def scaffold_oracle(script: Script, flushes: int, k: int = 2) -> dict[str, Any]:
    """SCAFFOLD's async rule under central DP in float64: each client's accounted c_i moves
    by its unclipped Delta_c_i when its reply is buffered; the server's w by the clipped,
    weighted sum plus noise over K, its c by (sum of clipped Delta_c_i + noise of std
    z C_c) / N, the two draws in that order from ``default_rng(SEED)``."""
    p, rng = problem(), np.random.default_rng(SEED)
    w, c = p.w0.astype(np.float64), np.zeros(DIM)
    acc = {cid: np.zeros(DIM) for cid in range(N)}
    version, buffer = 0, []
    task = {cid: (0, w.copy(), c.copy()) for cid in range(N)}
    for cid, fate in script:
        if version == flushes:
            break
        v_sent, w_sent, c_sent = task.pop(cid)
        y = w_sent.copy()
        for _ in range(K_STEPS):
            y -= LR * (p.gradient(cid, y) + c_sent - acc[cid])
        new = acc[cid] - c_sent + (w_sent - y) / (K_STEPS * LR)
        tau = version - v_sent
        if fate == "ok":
            buffer.append(((1.0 + tau) ** -0.5, clipped(y - w_sent, CLIP),
                           clipped(new - acc[cid], CLIP_C)))
            acc[cid] = new
        elif fate == "nan":
            buffer.append((1.0, np.zeros(DIM), np.zeros(DIM)))
        else:
            task[cid] = (version, w.copy(), c.copy())
        if len(buffer) == k:
            total = sum(s * d for s, d, _ in buffer) + rng.normal(0.0, Z * CLIP, size=DIM)
            total_c = sum(dc for _, _, dc in buffer) + rng.normal(0.0, Z * CLIP_C, size=DIM)
            w = (w + (total / k).astype(np.float32)).astype(np.float32).astype(np.float64)
            c = (c + total_c / N).astype(np.float32).astype(np.float64)
            version, buffer = version + 1, []
            for idle in set(range(N)) - set(task):
                task[idle] = (version, w.copy(), c.copy())
    assert version == flushes
    return {"w": w, "c": c}


def test_scaffold_c_takes_the_noised_sum_of_clipped_delta_c(tmp_path: Path) -> None:
    got, loop, _, _ = run(tmp_path, SCRIPT, FLUSHES, method="scaffold",
                          **{"dp-clip-extra": CLIP_C})
    want = scaffold_oracle(SCRIPT, FLUSHES)
    np.testing.assert_allclose(got, want["w"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loop.strategy.state.c[0], want["c"], rtol=1e-5, atol=1e-5)
    assert np.abs(want["c"]).max() > 0.1  # c moved


def test_a_resume_counts_the_flushes_the_ledger_holds(tmp_path: Path) -> None:
    """A flush counted but never checkpointed (the server died after the ledger counted
    it) stays counted: the resume's next flush is the ledger's count + 1."""
    cfg = RunConfig.parse({**BASE, "num-server-rounds": FLUSHES})
    run(tmp_path, SCRIPT, FLUSHES)
    resumed = FlushPrivacy.for_run(cfg, (), tmp_path, 2, [{"round": 1, "dp-rounds-counted": 1},
                                                          {"round": 2, "dp-rounds-counted": 2}])
    assert resumed is not None and resumed.ledger.counted == FLUSHES
    assert FlushPrivacy.for_run(cfg, (), tmp_path / "new", 0, None).ledger.counted == 0
