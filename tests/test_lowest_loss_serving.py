"""IFCA's inference rule at personalized evaluation (``relax-serve`` / ``cluster-serve``
``lowest-loss``; issue 45 item 3): the evaluate message carries every group's (cluster's)
model and the client is scored on the one with the lowest loss on its own TRAINING data.

The server half through the real strategy on f_i(w) = 0.5 ||w - a_i||^2 against the hand
computation of the group models (the FedRelax rounds of ``test_fedrelax_groups_by_loss``); the
client half through ``personal_evaluation`` with a linear classifier whose two candidate
models are right and wrong by construction."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from torch import nn

from client_app.personal_accuracy import personal_evaluation
from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import pack, unpack
from fedinit.methods.weights import stacked, unstacked
from fedinit.store.client_store import ClientStore
from testbeds.lsq_problem import NODE_BASE, Federation
from tests.test_clustered import clustered
from tests.test_fedrelax import two_regimes
from tests.test_fedrelax_groups import EXAMPLES, W0, fedavg, local
from tests.test_fedrelax_groups_by_loss import by_loss


def evaluation_messages(f: Federation) -> dict[int, Message]:
    """The personalized-evaluation messages after the rounds run so far, by client."""
    messages = f.strategy.configure_evaluate(f.round, f.arrays, ConfigRecord(),
                                             cast(Grid, None))
    return {m.metadata.dst_node_id - NODE_BASE: m for m in messages}


def choices_in(msg: Message) -> list[np.ndarray] | None:
    """The models an evaluate message lets its client choose from (first array each)."""
    if rk.EVAL_CHOICES not in msg.content.array_records:
        return None
    return [m[0] for m in unstacked(unpack(msg.content.array_records[rk.EVAL_CHOICES]))]


def test_fedrelax_sends_every_groups_model_after_the_warm_up(tmp_path: Path) -> None:
    """Groups {0, 1} and {2, 3} (margin 0.9: nobody moves), warm-up 1 round. After round 2
    every client's evaluate message carries group 1's model (FedAvg of 0 and 1's uploads from
    w_1) then group 2's, by hand; with ``relax-serve=chosen`` none does."""
    raw = {"relax-group-margin": 0.9, "personal-eval-every": 1, "personal-eval-clients": 0}
    f = by_loss(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)], **raw, **{"relax-serve": "lowest-loss"})
    f.run(2)
    ups = {i: local(W0, i) for i in range(4)}
    w1 = W0 + sum(EXAMPLES[i] * (ups[i] - W0) for i in range(4)) / sum(EXAMPLES)
    a2 = fedavg({0: local(w1, 0), 1: local(w1, 1)})
    b2 = fedavg({2: local(w1, 2), 3: local(w1, 3)})
    sent = evaluation_messages(f)
    assert sorted(sent) == [0, 1, 2, 3]
    for msg in sent.values():
        got = choices_in(msg)
        assert got is not None and len(got) == 2
        np.testing.assert_allclose(got[0], a2, atol=1e-6)
        np.testing.assert_allclose(got[1], b2, atol=1e-6)
    plain = by_loss(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)], **raw, **{"relax-serve": "chosen"})
    plain.run(2)
    assert all(choices_in(m) is None for m in evaluation_messages(plain).values())


def test_fedrelax_offers_no_choice_during_the_warm_up(tmp_path: Path) -> None:
    """After round 1 of a 3-round warm-up the groups do not exist yet: no choice."""
    raw = {"personal-eval-every": 1, "personal-eval-clients": 0, "relax-warmup": 3,
           "relax-serve": "lowest-loss"}
    f = by_loss(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)], **raw)
    f.run(1)
    assert all(choices_in(m) is None for m in evaluation_messages(f).values())


def test_lowest_loss_is_refused_where_the_method_has_no_groups_to_choose_from() -> None:
    with pytest.raises(ConfigError, match="relax-serve='lowest-loss'.*relax-groups-by='graph'"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-serve": "lowest-loss"})
    with pytest.raises(ConfigError, match="cluster-serve='nearest'.*assigned | lowest-loss"):
        RunConfig.parse({"method": "clustered", "beta": 0.0, "cluster-serve": "nearest"})


def test_clustered_sends_the_model_of_every_cluster_with_members() -> None:
    """Two regimes, K = 2 by loss: before the warm-up has clustered no message offers a
    choice; after it, every client's evaluate message carries the two cluster models as the
    state holds them; under ``cluster-serve=assigned`` (the default) none."""
    p = two_regimes()
    raw = {"num-clusters": 2, "cluster-warmup": 2, "personal-eval-every": 1,
           "personal-eval-clients": 0}
    f = clustered(p, **raw, **{"cluster-serve": "lowest-loss"})
    f.run(1)
    assert all(choices_in(m) is None for m in evaluation_messages(f).values())
    f.run(3)
    state = f.strategy.state  # type: ignore[attr-defined]
    members = np.unique(state.assignment[0])
    assert members.tolist() == [0, 1]  # both clusters are in use in this run
    for msg in evaluation_messages(f).values():
        got = choices_in(msg)
        assert got is not None and len(got) == 2
        for c in (0, 1):
            np.testing.assert_array_equal(got[c], state.models[0][c])
    plain = clustered(p, **raw)
    plain.run(4)
    assert all(choices_in(m) is None for m in evaluation_messages(plain).values())


# The client half: a linear classifier on x in R^2; "right" predicts class 1 for x_0 > 0.
RIGHT = [np.asarray([[-1.0, 0.0], [1.0, 0.0]], dtype=np.float32), np.zeros(2, np.float32)]
WRONG = [-RIGHT[0], RIGHT[1].copy()]


def labelled(n: int, flipped: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(np.random.default_rng(seed).normal(size=(n, 2)).astype(np.float32))
    y = (x[:, 0] > 0).long()
    return x, (1 - y) if flipped else y


def served(train_flipped: bool, with_choices: bool) -> dict[str, float | int]:
    """The personalized-evaluation metrics of a client whose test split follows RIGHT's rule
    and whose training split follows RIGHT's (or, ``train_flipped``, WRONG's), sent WRONG as
    its model and, ``with_choices``, [WRONG, RIGHT] to choose from."""
    cfg = RunConfig.parse({"method": "clustered", "beta": 0.0, "cluster-serve": "lowest-loss"})
    content = RecordDict({rk.ARRAYS: pack(WRONG), rk.CONFIG: ConfigRecord(
        {rk.ROUND: 3, rk.LR: 0.0, rk.PERSONAL_EVAL: True})})
    if with_choices:
        content[rk.EVAL_CHOICES] = cast(ArrayRecord, pack(stacked([WRONG, RIGHT], RIGHT)))
    out = personal_evaluation(cfg, cfg.spec.client(cfg.params), content,
                              ClientStore(memory=RecordDict()), nn.Linear(2, 2),
                              labelled(64, train_flipped, 1), labelled(40, False, 2),
                              partition_id=0)
    return dict(out)


def test_the_client_is_scored_on_the_model_its_training_data_fits_best() -> None:
    """Sent WRONG alone it scores 0 on its test split; given [WRONG, RIGHT] it chooses RIGHT
    (position 1) by its training loss and scores 1 (the message's lr 0: the fine-tuned (b)
    equals (a)). When its training split follows WRONG's rule it chooses WRONG, though its
    test split would have scored RIGHT higher: the choice reads the training data only."""
    alone = served(train_flipped=False, with_choices=False)
    assert alone[rk.ACC_GLOBAL] == 0.0 and rk.SERVED_CHOICE not in alone
    chose = served(train_flipped=False, with_choices=True)
    assert chose[rk.SERVED_CHOICE] == 1
    assert chose[rk.ACC_GLOBAL] == 1.0 and chose[rk.ACC_FINETUNED] == 1.0
    misled = served(train_flipped=True, with_choices=True)
    assert misled[rk.SERVED_CHOICE] == 0 and misled[rk.ACC_GLOBAL] == 0.0
