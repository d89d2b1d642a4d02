"""The numbers of a results row against values worked out here, not read from the code.

By hand (tests/test_methods_by_hand.py's setup): three clients, f_i(w) = 0.5 * ||w - a_i||^2,
seed 3 samples clients 0 and 1, w_0 = (0, 0), batch size 1, lr 0.5, two local epochs: a step
is y <- 0.5 * y + 0.5 * a_i and its loss (the client's reported figure is the mean over its
steps, each taken before the step) is 0.5 * ||y - a_i||^2. The row's ``divergence`` is
(1/|S|) * sum_i ||w_iK - w_{t+1}||^2 (against w_{t+1}, the model the round produced, not
w_t), its ``train-loss`` the example-weighted mean of the replies' losses.

Then a real run (the CNN, the real ClientApp in-process) with one reply corrupted and one
lost: its row's counts by hand, and its divergence, train loss, test accuracy and loss
computed here from the replies and the saved model with plain numpy / torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MessageType
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.task.datasets import to_tensor
from fedinit.task.federated_data import dataset_of
from fedinit.task.models import initial_model
from server_app.experiment import run_experiment
from testbeds.lsq_problem import Federation, Problem, half_sq_norm, quadratic_problem
from tests.conftest import SMALL_TEST_SET

A = [[2.0, 0.0], [0.0, 4.0], [-3.0, 1.0]]
BASE = {"method": "fedavg", "lr": 0.5, "local-epochs": 2, "batch-size": 1,
        "fraction-train": 0.67, "seed": 3}


def test_equal_counts_two_rounds_by_hand() -> None:
    f = Federation(quadratic_problem(A, [0.0, 0.0]), dict(BASE))
    assert f.step() == [0, 1]
    # c0: (0,0) -> (1,0) -> (1.5,0), losses 0.5*4 = 2 and 0.5*1 = .5: mean 1.25
    # c1: (0,0) -> (0,2) -> (0,3), losses 0.5*16 = 8 and 0.5*4 = 2: mean 5
    # w_1 = (.75, 1.5); divergence ((.75^2 + 1.5^2) * 2) / 2 = 2.8125
    # (against w_0 it would be (2.25 + 9) / 2 = 5.625)
    m = f.metrics[-1]
    assert m[rk.DIVERGENCE] == pytest.approx(2.8125, abs=1e-6)
    assert m[rk.ROUND_TRAIN_LOSS] == pytest.approx(3.125, abs=1e-6)
    assert (m[rk.NUM_REPLIES], m[rk.NUM_REJECTED], m[rk.NUM_MISSING]) == (2, 0, 0)
    f.step()
    # c0 from (.75,1.5): (1.375,.75) -> (1.6875,.375), losses 0.5*(1.25^2+1.5^2) = 1.90625,
    #   0.5*(.625^2+.75^2) = .4765625: mean 1.19140625
    # c1 from (.75,1.5): (.375,2.75) -> (.1875,3.375), losses 0.5*(.75^2+2.5^2) = 3.40625,
    #   0.5*(.375^2+1.25^2) = .8515625: mean 2.12890625
    # w_2 = (.9375, 1.875): both finals at (.75, 1.5) from it, 2.8125 again
    # (against w_1: (.87890625 + 1.265625 + .31640625 + 3.515625) / 2 = 2.98828125)
    m = f.metrics[-1]
    assert m[rk.DIVERGENCE] == pytest.approx(2.8125, abs=1e-6)
    assert m[rk.ROUND_TRAIN_LOSS] == pytest.approx((1.19140625 + 2.12890625) / 2, abs=1e-6)


def unequal_problem() -> Problem:
    """Client 1 holds two copies of a_1 = (0, 4): two examples, two steps an epoch."""
    xs = [torch.tensor([a], dtype=torch.float32) for a in A]
    xs[1] = torch.tensor([A[1], A[1]], dtype=torch.float32)
    return Problem(xs, [torch.zeros(len(x)) for x in xs], np.zeros(2, dtype=np.float32),
                   False, half_sq_norm)


def test_unequal_example_counts_weight_the_train_loss_and_the_model() -> None:
    f = Federation(unequal_problem(), dict(BASE))
    assert f.step() == [0, 1]
    # c0 (1 example, 2 steps): (0,0) -> (1,0) -> (1.5,0), losses 2, .5: mean 1.25
    # c1 (2 examples, 4 steps): (0,0) -> (0,2) -> (0,3) -> (0,3.5) -> (0,3.75),
    #   losses 8, 2, .5, .125: mean 2.65625
    # train-loss (1 * 1.25 + 2 * 2.65625) / 3 = 2.1875 (unweighted it would be 1.953125)
    # w_1 = (1 * (1.5,0) + 2 * (0,3.75)) / 3 = (.5, 2.5)
    # divergence (||(1,-2.5)||^2 + ||(-.5,1.25)||^2) / 2 = (7.25 + 1.8125) / 2 = 4.53125
    # (against w_0: (2.25 + 14.0625) / 2 = 8.15625)
    np.testing.assert_allclose(f.weights, [0.5, 2.5], rtol=0, atol=1e-6)
    m = f.metrics[-1]
    assert m[rk.ROUND_TRAIN_LOSS] == pytest.approx(2.1875, abs=1e-6)
    assert m[rk.DIVERGENCE] == pytest.approx(4.53125, abs=1e-6)
    assert (m[rk.NUM_REPLIES], m[rk.NUM_REJECTED], m[rk.NUM_MISSING]) == (2, 0, 0)


# ---------------------------------------------------------------- a real run's row
RUN = {"num-clients": 5, "fraction-train": 1.0, "num-server-rounds": 1, "train-limit": 400,
       "local-epochs": 1, "batch-size": 32, "partition": "dirichlet", "dirichlet-alpha": 0.5,
       "max-update-norm-ratio": 0.0}
CORRUPTED, LOST = 1001, 1003
"""Node 1001's train reply carries a NaN (rejected); node 1003's never comes (missing)."""


def corrupt_and_lose(reply: Message) -> Message | None:
    if reply.metadata.message_type != MessageType.TRAIN or reply.has_error():
        return reply
    if reply.metadata.src_node_id == LOST:
        return None
    if reply.metadata.src_node_id == CORRUPTED:
        arrays = unpack(reply.content[rk.ARRAYS])
        arrays[0] = arrays[0].copy()
        arrays[0].flat[0] = np.nan
        reply.content[rk.ARRAYS] = ArrayRecord(arrays)
    return reply


@pytest.mark.usefixtures("quick_runs")
def test_a_real_rows_numbers_against_the_replies_and_the_model(tmp_path: Path) -> None:
    raw: dict[str, Any] = {**RUN, "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    grid = InProcessGrid(5, cfg.to_dict())
    grid.reply_filter = corrupt_and_lose
    run_experiment(grid, cfg, out_dir=tmp_path / "run")
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text()
              .splitlines()]
    # 5 sampled, 1 NaN reply rejected, 1 lost: 3 aggregated
    assert (row[rk.NUM_REPLIES], row[rk.NUM_REJECTED], row[rk.NUM_MISSING]) == (3, 1, 1)
    # bytes-down: the 5 train messages sent (the lost reply's too), each every object of its
    # content as Flower deflates it (tests/test_bytes_down.py works one out by hand): the
    # CNN's float32 bytes and under 2 kB of headers, config and packing per message
    sent = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert len(sent) == 5
    assert row[rk.BYTES_DOWN] == sum(len(o.deflate()) for m in sent
                                     for o in get_all_nested_objects(m.content).values())
    floats = 4 * sum(a.size for a in unpack(sent[0].content[rk.ARRAYS]))
    assert 5 * floats < row[rk.BYTES_DOWN] < 5 * (floats + 2000)
    good = [r for r in grid.replies if r.metadata.message_type == MessageType.TRAIN
            and r.metadata.src_node_id not in (CORRUPTED, LOST)]
    assert len(good) == 3
    counts = [int(r.content[rk.METRICS][rk.NUM_EXAMPLES]) for r in good]
    losses = [float(r.content[rk.METRICS][rk.TRAIN_LOSS]) for r in good]
    assert len(set(counts)) > 1, counts  # unequal, so the weighting shows
    weighted = sum(n * x for n, x in zip(counts, losses, strict=True)) / sum(counts)
    assert row[rk.ROUND_TRAIN_LOSS] == pytest.approx(weighted, rel=1e-9)
    assert abs(weighted - float(np.mean(losses))) > 1e-4  # the unweighted mean is not it
    state = torch.load(tmp_path / "run" / "model.pt")
    w_next = [v.detach().numpy().astype(np.float64) for v in state.values()]
    finals = [[a.astype(np.float64) for a in unpack(r.content[rk.ARRAYS])] for r in good]
    div = np.mean([sum(float(np.sum((a - b) ** 2)) for a, b in zip(f, w_next, strict=True))
                   for f in finals])
    assert row[rk.DIVERGENCE] == pytest.approx(div, rel=1e-5)
    # the test set the run scored on (quick_runs: its first SMALL_TEST_SET images)
    data = dataset_of(cfg)
    x = to_tensor(data.test_x[:SMALL_TEST_SET], data.mean, data.std)
    y = torch.from_numpy(data.test_y[:SMALL_TEST_SET].copy()).long()
    model = initial_model(cfg)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        logits = model(x).double()
    loss = float(torch.nn.functional.cross_entropy(logits, y))
    acc = float((logits.argmax(1) == y).double().mean())
    assert row["test-loss"] == pytest.approx(loss, rel=1e-4)
    assert row["test-acc"] == pytest.approx(acc, abs=1e-9)
