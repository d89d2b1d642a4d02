"""The defence table's attackers (``bench/defence_table.py``): each hostile upload has the
intended move, and exactly k replies of every round are hostile, in a real in-process run."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from bench.defence_table import (
    KINDS,
    MEAN_DC,
    FirstK,
    Selections,
    hostile_selected,
    hostile_upload,
    unit_direction,
)
from fedinit.cli.inprocess_grid import InProcessGrid, set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.norms import vector_norm
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.scaffold import DELTA_C
from server_app.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("quick_runs")  # 1,000 central test images, no plots


def flat(w: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.astype(np.float64).ravel() for a in w])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_each_hostile_upload_has_the_intended_move() -> None:
    rng = np.random.default_rng(1)
    base = [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(5).astype(
        np.float32)]
    up = [(b + 0.1 * rng.standard_normal(b.shape)).astype(np.float32) for b in base]
    honest = flat(up) - flat(base)
    d = unit_direction(up)
    assert vector_norm(d) == pytest.approx(1.0)
    assert np.array_equal(flat(d), flat(unit_direction(up)))  # fixed: the same every call
    assert abs(cosine(flat(d), flat(unit_direction(up, seed=23)))) < 0.9
    moves = {k: flat(hostile_upload(up, base, k, d)) - flat(base) for k in KINDS}
    np.testing.assert_allclose(moves["sign-flip"], -honest, atol=1e-6)
    np.testing.assert_allclose(moves["x15"], 15.0 * honest, atol=1e-5)
    assert np.linalg.norm(moves["direction"]) == pytest.approx(np.linalg.norm(honest), rel=1e-5)
    assert cosine(moves["direction"], flat(d)) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="'flip' is not allowed"):
        hostile_upload(up, base, "flip", d)


def test_exactly_k_replies_of_every_round_upload_the_fixed_direction(tmp_path: Path) -> None:
    """6 clients, 3 per round, 3 rounds, k = 2: per round two moves along the one direction
    (each as long as a normal move), one honest move that is not."""
    cfg = RunConfig.parse({"num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 3,
                           "train-limit": 600, "local-epochs": 1, "beta": 0.0,
                           "eval-every": 1000, "personal-eval-every": 0,
                           "max-update-norm-ratio": 0.0, "output-dir": str(tmp_path / "out")})
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    attack = FirstK(grid, "direction", 2, cfg.train.ri_aggregation)
    seen: dict[int, list[np.ndarray]] = {}

    def record(reply: Message) -> Message:
        out = attack(reply)
        if reply.metadata.message_type == "train":
            sent = grid.sent[-1].content
            w_t = flat(unpack(sent[rk.ARRAYS]))
            seen.setdefault(int(sent[rk.CONFIG][rk.ROUND]), []).append(
                flat(unpack(out.content[rk.ARRAYS])) - w_t)
        return out

    grid.reply_filter = record
    run_experiment(grid, cfg, out_dir=tmp_path / "run")
    assert attack.poisoned == {1: 2, 2: 2, 3: 2}
    assert sorted(attack.hostile) == [1, 2, 3]
    assert all(len(parts) == 2 for parts in attack.hostile.values())
    first = next(m for m in grid.sent if m.metadata.message_type == "train")
    d = flat(unit_direction(unpack(first.content[rk.ARRAYS])))
    honest = np.median(attack.honest_norms)
    for rnd, moves in seen.items():
        along = [cosine(m, d) > 0.999 for m in moves]
        assert along == [True, True, False], rnd
        for m in moves[:2]:
            assert 0.2 * honest < np.linalg.norm(m) < 5.0 * honest


def test_hostile_selected_counts_rounds_whose_selection_let_an_attacker_in() -> None:
    """Read from the server's own log line; rounds 1 and 3 let partition 4 or 7 in."""
    seen = Selections()
    for rnd, chosen in ((1, "[4]"), (2, "[5, 9]"), (3, "[2, 7, 8]")):
        seen.handle(logging.makeLogRecord({
            "msg": "round %d: %s aggregates partitions %s, leaves out %s",
            "args": (rnd, "multi-krum", chosen, "[1]"), "levelno": logging.INFO}))
    attack = FirstK.__new__(FirstK)
    attack.hostile = {1: {4}, 2: {3}, 3: {7, 1}}
    assert seen.chosen == {1: {4}, 2: {5, 9}, 3: {2, 7, 8}}
    assert hostile_selected(attack, seen) == 2
    assert hostile_selected(attack, Selections()) is None


class StubGrid:
    """What ``FirstK`` reads of the grid: the last message sent and each node's partition."""

    def __init__(self, w_t: list[np.ndarray]) -> None:
        self.sent = [Message(content=RecordDict({rk.ARRAYS: ArrayRecord(w_t),
                                                 rk.CONFIG: ConfigRecord({rk.ROUND: 4})}),
                             dst_node_id=1000, message_type="train")]
        self.contexts = {1000 + i: type("Ctx", (), {"node_config": {"partition-id": i}})()
                         for i in range(4)}


def test_flip_mean_dc_flips_the_move_and_uploads_the_mean_honest_delta_c() -> None:
    """One round, 4 SCAFFOLD replies, the first hostile: its move is minus its own, its
    Delta_c the mean of the three honest ones (rewritten as they arrive), theirs untouched."""
    set_task_identity()
    rng = np.random.default_rng(4)
    w_t = [rng.standard_normal(3).astype(np.float32)]
    grid = StubGrid(w_t)
    attack = FirstK(grid, MEAN_DC, 1, "model")  # type: ignore[arg-type]
    moves = [[rng.standard_normal(3).astype(np.float32)] for _ in range(4)]
    dcs = [[rng.standard_normal(3).astype(np.float32)] for _ in range(4)]
    out = []
    for i in range(4):
        sent = Message(content=RecordDict(), dst_node_id=1000 + i, message_type="train")
        content = RecordDict({rk.ARRAYS: ArrayRecord([w_t[0] + moves[i][0]]),
                              DELTA_C: ArrayRecord(dcs[i])})
        out.append(attack(Message(content=content, reply_to=sent)))
    np.testing.assert_allclose(unpack(out[0].content[rk.ARRAYS])[0] - w_t[0], -moves[0][0],
                               atol=1e-6)
    np.testing.assert_allclose(unpack(out[0].content[DELTA_C])[0],
                               np.mean([dcs[i][0] for i in (1, 2, 3)], axis=0), rtol=1e-6)
    for i in (1, 2, 3):
        assert np.array_equal(unpack(out[i].content[DELTA_C])[0], dcs[i][0])
    assert attack.hostile == {4: {0}}
