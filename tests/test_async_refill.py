"""``refill=balanced``: a freed slot goes to an idle client sent the fewest tasks so far (ties:
the seeded draw). Checked by hand on ``choose``, against an event simulation of the virtual
clock written here (who trains in each flush, in arrival order) with the model against
FedBuff worked out over those replies, and through a kill and a resume (the counts are loop
state: the resumed run chooses as the uninterrupted one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.config.errors import ConfigError
from server_app.async_rounds import run_async_experiment
from server_app.checkpoint import load_checkpoint
from strategies import async_loop
from strategies.virtual_clock import VirtualClock
from tests.test_async_resume import SIMULATED, KilledGrid, config, final_model, rows, same
from tests.test_async_rounds import HeldGrid, fedbuff_by_hand, first_model
from tests.test_fedavg_reference import max_diff

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")

SPEEDS = (1.0, 1.3, 1.7, 2.2, 2.9)
"""Client 0 is three times as fast as client 4: a uniform refill lets it train most."""
OVER = {"concurrency": 2, "buffer-size": 2, "num-server-rounds": 8}


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(async_loop, "POLL_SECONDS", 0.001)


def pick(idle: set[int], free: int, counts: dict[int, int], seed: int = 0,
         benched: frozenset[int] = frozenset()) -> list[int]:
    return async_loop.choose(idle, set(benched), free, np.random.default_rng([seed, 32]),
                               counts)


def test_the_least_sent_idle_clients_take_the_slots_ties_seeded() -> None:
    counts = {0: 2, 2: 1, 3: 0}  # client 1 never sent: 0
    for seed in range(6):  # whatever the draw: 1 and 3 (0 tasks) first, then 2, then 0
        got = pick({0, 1, 2, 3}, 4, counts, seed)
        assert sorted(got[:2]) == [1, 3] and got[2:] == [2, 0]
    assert {tuple(pick({0, 1, 2, 3}, 2, counts, s)) for s in range(6)} == {(1, 3), (3, 1)}
    assert pick({0, 1, 2}, 3, {0: 5, 1: 3, 2: 4}, 0) == pick({0, 1, 2}, 3, {0: 5, 1: 3, 2: 4},
                                                             7) == [1, 2, 0]  # no tie: no draw
    # a client chosen in this call counts: two slots, two clients at 0 and one at 1
    assert sorted(pick({0, 1, 2}, 2, {2: 1}, 0)) == [0, 1]
    assert counts == {0: 2, 2: 1, 3: 0}  # the caller's counts are not changed
    # the bench comes first: a benched client only takes a slot no other can
    assert pick({0, 1}, 1, {1: 9}, 0, benched=frozenset({0})) == [1]
    assert pick({0}, 1, {}, 0, benched=frozenset({0})) == [0]


def simulated_flushes(cfg: RunConfig) -> list[list[int]]:
    """Who each flush aggregates, in arrival order, worked out here: tasks end at send time +
    d_i (ties: the earlier dispatch), every freed slot goes at once to an idle client with
    the fewest tasks so far, a tie drawn from the ``[seed, 32]`` stream over those clients
    in id order; every K replies a flush."""
    clock = VirtualClock.for_run(cfg)
    assert clock is not None
    d = clock.task_seconds
    rng = np.random.default_rng([cfg.seed, 32])
    sent = [0] * cfg.num_clients
    out: list[tuple[float, int, int]] = []  # (finish, dispatch, client)
    now, seq, buffer, flushes = 0.0, 0, [], []

    def fill() -> None:
        nonlocal seq
        while len(out) < cfg.async_concurrency:
            idle = [p for p in range(cfg.num_clients) if p not in {c for _, _, c in out}]
            least = [p for p in idle if sent[p] == min(sent[q] for q in idle)]
            cid = least[int(rng.integers(len(least)))]
            sent[cid] += 1
            out.append((now + d[cid], seq, cid))
            seq += 1

    fill()
    while len(flushes) < cfg.train.num_server_rounds:
        out.sort()
        now, _, cid = out.pop(0)
        buffer.append(cid)
        if len(buffer) == cfg.async_buffer_size:
            flushes.append(buffer)
            buffer = []
        fill()
    return flushes


def test_the_loop_chooses_as_the_simulation_written_here(tmp_path: Path) -> None:
    """Who trains, against the simulation; the model, against FedBuff worked out here over
    the replies in the order the loop took them (s = (1 + tau)^-0.5, example weights)."""
    cfg = config(tmp_path, SPEEDS, **OVER, refill="balanced", beta=0.0)
    grid = HeldGrid(cfg.to_dict(), slow=-1, release=0)  # holds nothing back: records pulls
    run_async_experiment(grid, cfg, tmp_path / "run")
    got = [[c for c, *_ in r["buffered"]] for r in rows(tmp_path / "run")]
    assert got == simulated_flushes(cfg)
    s = {t: (1.0 + t) ** -0.5 for t in range(10)}
    want, taus, _ = fedbuff_by_hand(grid, first_model(grid), 2, 8, s)
    assert max_diff(final_model(tmp_path / "run"), want) < 1e-6
    assert [sorted(t for *_, t, _ in r["buffered"]) for r in rows(tmp_path / "run")] == taus
    random_cfg = config(tmp_path, SPEEDS, **OVER)
    run_async_experiment(InProcessGrid(5, random_cfg.to_dict()), random_cfg,
                         tmp_path / "random")
    trained = {name: np.bincount([c for r in rows(tmp_path / name) for c in
                                  r["clients-trained"]], minlength=5)
               for name in ("run", "random")}
    # the fast client's share falls, the slow one's rises (16 replies each run)
    assert trained["run"][0] < trained["random"][0]
    assert trained["run"][4] > trained["random"][4]
    assert trained["run"].max() - trained["run"].min() <= 2
    assert load_checkpoint(tmp_path / "run").async_state["sent-count"]  # saved for a resume


def test_killed_and_resumed_the_counts_go_on_bit_identical(tmp_path: Path) -> None:
    """A resume that forgot the counts (every client at 0 again) would send the clients that
    trained most again, and end elsewhere."""
    cfg = config(tmp_path, SPEEDS, **OVER, refill="balanced")
    run_async_experiment(InProcessGrid(5, cfg.to_dict()), cfg, tmp_path / "ref-run")
    run_dir = tmp_path / "crash-run"
    with pytest.raises(KeyboardInterrupt):
        run_async_experiment(KilledGrid(9, cfg), cfg, run_dir)
    assert len(rows(run_dir)) in range(2, 8)
    resumed = config(tmp_path, SPEEDS, **OVER, refill="balanced",
                     **{"resume-dir": str(run_dir)})
    run_async_experiment(InProcessGrid(5, resumed.to_dict()), resumed)
    got, want = rows(run_dir), rows(tmp_path / "ref-run")
    assert [{k: r.get(k) for k in SIMULATED} for r in got] == \
        [{k: r.get(k) for k in SIMULATED} for r in want]
    assert same(final_model(run_dir), final_model(tmp_path / "ref-run"))


def test_a_bad_refill_fails_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"refill='least' is not allowed.*random \| balanced"):
        RunConfig.parse({"refill": "least"})
