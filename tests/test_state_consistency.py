"""Client state stays what the server accounted for when replies are lost or rejected.

SCAFFOLD's server c is (1/N) sum_i c_i and FedDyn's H is sum_i h_i over ALL clients only if a
client's change counts on both sides or on neither. Here replies are dropped after the client
saved its new state (a lost or late reply) and others are rejected by the norm filter; after
every round the server's state (checkpoint.npz) is compared with an independent sum over the
clients' state files: for each client, the file of the round the server says it aggregated
last (zeros before any). Flower's simulation engine runs in this process (tests/sim_engine.py),
so the messages, Contexts and state files are the real ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, MessageType

from fedinit.config import RunConfig
from fedinit.methods.feddyn import H_LOCAL
from fedinit.methods.packed_arrays import pack, unpack
from fedinit.methods.robust import move_select
from fedinit.methods.scaffold import C_LOCAL, DELTA_C
from fedinit.methods.wire import ARRAYS
from fedinit.store.files import read_record
from fedinit.store.simulated_state import RUN_SUBDIR
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from strategies.method_strategy import ACCOUNTED_STATE
from tests.sim_engine import InProcessSimulation

pytestmark = pytest.mark.usefixtures("quick_runs")

BASE = {"num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 6, "train-limit": 600,
        "local-epochs": 1, "beta": 0.1, "eval-every": 6, "personal-eval-every": 0,
        "max-update-norm-ratio": 1.3}
"""3 of 6 clients a round; a tight norm filter rejects some honest replies."""


def client_sum(run_dir: Path, key: str, accounted: np.ndarray, like: list[np.ndarray]
               ) -> list[np.ndarray]:
    """sum_i of ``key`` over all clients, each from the file of its accounted round."""
    exp = run_dir / RUN_SUBDIR / run_dir.name
    total = [np.zeros(a.shape, dtype=np.float64) for a in like]
    for cid, rnd in enumerate(accounted):
        if rnd == 0:
            continue
        groups, _ = read_record(exp / f"client-{cid}" / f"r{int(rnd):06d}.npz")
        for acc, a in zip(total, groups[key], strict=True):
            acc += a
    return total


def relative_gap(server: list[np.ndarray], clients: list[np.ndarray]) -> float:
    gap = np.sqrt(sum(float(np.sum((s.astype(np.float64) - c) ** 2))
                      for s, c in zip(server, clients, strict=True)))
    norm = np.sqrt(sum(float(np.sum(s.astype(np.float64) ** 2)) for s in server))
    return gap / norm if norm else gap  # c is still 0 while no Delta_c was counted


def lose_train_replies(grid: Any, rng: np.random.Generator, drop: float, run_dir: Path,
                       check: Callable[[], None], counts: dict[str, int],
                       after: Callable[[list[Message], list[Message]], None] | None = None,
                       ) -> None:
    """Wrap ``grid.send_and_receive``: before each train round after the first, ``check()``
    the state after the previous round; drop a seeded share ``drop`` of the train replies
    (counted in ``counts["dropped"]``), then ``after(sent, kept)`` may change the kept ones."""
    send = grid.send_and_receive

    def lossy(messages: Iterable[Message], *, timeout: float | None = None
              ) -> Iterable[Message]:
        msgs = list(messages)
        train = bool(msgs) and msgs[0].metadata.message_type == MessageType.TRAIN
        if train and (run_dir / "checkpoint.npz").exists():
            check()  # the state after the previous round
        replies = list(send(msgs, timeout=timeout))
        if not train:
            return replies
        kept = [r for r in replies if rng.random() >= drop]
        counts["dropped"] += len(replies) - len(kept)
        if after is not None:
            after(msgs, kept)
        return kept

    grid.send_and_receive = lossy


def run_with_losses(tmp: Path, method: str, drop: float, over: dict[str, Any] | None = None,
                    tamper: Callable[[list[Message]], None] | None = None,
                    ) -> tuple[list[float], dict[str, int]]:
    """Run ``method`` dropping a seeded share ``drop`` of the train replies (and ``tamper``
    changing the rest); the relative gap between the server state and the client sum after
    every round, and reply counts."""
    overrides: dict[str, Any] = {**BASE, "method": method, "output-dir": str(tmp / "out"),
                                 **(over or {})}
    cfg = RunConfig.parse(overrides)
    rng = np.random.default_rng(5)
    gaps: list[float] = []
    counts = {"dropped": 0, "rejected": 0, "aggregated": 0}
    run_dir = tmp / method

    def check() -> None:
        ckpt = load_checkpoint(run_dir)
        accounted = ckpt.strategy_state[ACCOUNTED_STATE][0]
        if method == "scaffold":
            c = ckpt.strategy_state["c"]
            mean = [s / cfg.num_clients
                    for s in client_sum(run_dir, C_LOCAL, accounted, c)]
            gaps.append(relative_gap(c, mean))
        else:
            h_sum = ckpt.strategy_state["h_sum"]
            gaps.append(relative_gap(h_sum, client_sum(run_dir, H_LOCAL, accounted, h_sum)))
        row = ckpt.rows[-1] if ckpt.rows else {}
        counts["rejected"] += int(row.get("num-rejected", 0))
        counts["aggregated"] += int(row.get("num-replies", 0))

    with InProcessSimulation(cfg.num_clients, overrides) as sim:
        lose_train_replies(sim.grid, rng, drop, run_dir, check, counts,
                           None if tamper is None else lambda _sent, kept: tamper(kept))
        run_experiment(sim.grid, cfg, out_dir=run_dir)
    check()
    return gaps, counts


@pytest.mark.parametrize("method", ["scaffold", "feddyn"])
def test_server_state_equals_the_clients_accounted_state_after_every_round(
        tmp_path: Path, method: str) -> None:
    gaps, counts = run_with_losses(tmp_path, method, drop=0.3)
    # the scenario really loses and rejects replies, and still aggregates some
    assert counts["dropped"] >= 2 and counts["rejected"] >= 1 and counts["aggregated"] >= 4
    assert len(gaps) == BASE["num-server-rounds"]
    assert max(gaps) < 1e-5, gaps


@pytest.mark.parametrize("aggregation", ["krum", "multi-krum"])
def test_c_stays_the_mean_of_the_c_i_when_the_selection_screens_a_delta_c(
        tmp_path: Path, aggregation: str, caplog: pytest.LogCaptureFixture) -> None:
    """SCAFFOLD, all 6 clients a round, f = 1, the norm filter off. In every round the Delta_c
    of the reply the rule selects first is multiplied by 50 on its way to the server (the
    client saved its own honest c_i): the screen keeps it out of c, and its client is not
    accounted, so c = (1/N) sum of the accounted c_i after every round. Counted in c,
    it would leave a gap of the order of 1 (the oracle: the screen must have fired)."""
    def tamper(replies: list[Message]) -> None:
        # tamper the reply the rule will select: Krum judges the moves' pairwise distances,
        # which the model uploads (w_iK = w_t + move) have too; the arrival order does not
        # say which reply that is (CI once tampered a never-selected reply in all 6 rounds)
        train = [r for r in replies if not r.has_error() and DELTA_C in r.content]
        if train:
            uploads = [unpack(r.content[ARRAYS]) for r in train]
            r = train[move_select(uploads, aggregation, 1)[0]]
            r.content[DELTA_C] = pack([50.0 * a for a in unpack(r.content[DELTA_C])])

    over = {"fraction-train": 1.0, "aggregation": aggregation, "byzantine-f": 1,
            "max-update-norm-ratio": 0.0}
    with caplog.at_level("WARNING"):
        gaps, counts = run_with_losses(tmp_path, "scaffold", drop=0.0, over=over,
                                       tamper=tamper)
    assert counts["aggregated"] >= 5 * BASE["num-server-rounds"]
    assert len(gaps) == BASE["num-server-rounds"]
    assert max(gaps) < 1e-5, gaps
    screens = caplog.text.count("scaffold-delta-c and state do not")
    assert screens == BASE["num-server-rounds"], caplog.text
