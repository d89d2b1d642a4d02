"""``strategies.client.method_train`` and ``method_query`` under SecAgg+ (a user's own
ClientApp and ``secure_aggregation=SecAgg()``): the protocol's stages are answered, only the
masked upload leaves, and the server's mean is the plain run's within the quantisation's
bound, worked out from the settings. Under ``privacy=DistributedDP(...)`` the client clips
its upload and adds its noise share, z x C / sqrt(t_min), as the server's message says
(local DP: ``tests/test_client_local_dp.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType
from torch import nn

from fedinit.methods import dp
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism
from fedinit.methods.packed_arrays import unpack
from fedinit.secure_aggregation import wire as sw
from strategies import DistributedDP, SecAgg
from strategies.catalog import FedInit, Scaffold
from strategies.client import method_query, stored_state
from strategies.wire import release_config
from tests.test_strategies import D, UserGrid, message, node, problem, user_train

CLIP, BITS = 4.0, 16
NODES = [40, 10, 30, 20]


class SecAggUserGrid(UserGrid):
    """``UserGrid`` whose nodes also answer queries with ``method_query``, as a user's
    ClientApp's ``@app.query()`` does."""

    def __init__(self, node_ids: Iterable[int]) -> None:
        super().__init__(node_ids)
        self.replies: list[Message] = []

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        msgs = list(messages)
        queries = [m for m in msgs if m.metadata.message_type == MessageType.QUERY]
        out = [method_query(m, self.contexts[m.metadata.dst_node_id]) for m in queries]
        rest = [m for m in msgs if m.metadata.message_type != MessageType.QUERY]
        trained = list(super().send_and_receive(rest, timeout=timeout)) if rest else []
        self.replies += [r for r in trained if not r.has_error()]
        return out + trained


def run(cls: type, secure: bool, rounds: int = 1,
        **more: Any) -> tuple[list[np.ndarray], SecAggUserGrid]:
    torch.manual_seed(0)
    grid = SecAggUserGrid(NODES)
    model = nn.Linear(D, 1, bias=False)
    extra = {"secure_aggregation": SecAgg(num_shares=3, threshold=2, clip=CLIP, bits=BITS)} \
        if secure else {}
    strategy = cls(fraction_train=1.0, min_available_nodes=len(NODES), fraction_evaluate=0.0,
                   weighting="uniform", max_update_norm_ratio=0.0, **extra, **more)
    result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=rounds,
                            train_config=ConfigRecord({"lr": 0.05}))
    return [np.asarray(a) for a in result.arrays.to_numpy_ndarrays()], grid


@pytest.mark.parametrize("cls", [FedInit, Scaffold], ids=lambda c: c.__name__)
def test_a_users_app_trains_under_secagg_and_only_masked_uploads_leave(cls: type) -> None:
    torch.manual_seed(0)
    w0 = [p.detach().numpy().copy() for p in nn.Linear(D, 1, bias=False).parameters()]
    plain, clear = run(cls, secure=False)
    masked, grid = run(cls, secure=True)
    # each coordinate of each client's move is quantised to a grid of 2^bits levels over
    # [-c, c]: the mean of the quantised moves is within one step, 2c / (2^bits - 1), of the
    # mean of the moves, when no move is clipped (checked on the plain run's uploads, the
    # same clients' final models: round 1 starts every client from w_0)
    for reply in clear.replies:
        final = unpack(reply.content.array_records[rk.ARRAYS])
        assert all(np.abs(f - w).max() < CLIP for f, w in zip(final, w0, strict=True))
    step = 2 * CLIP / (2**BITS - 1)
    gap = max(float(np.abs(a - b).max()) for a, b in zip(masked, plain, strict=True))
    moved = max(float(np.abs(a - b).max()) for a, b in zip(plain, w0, strict=True))
    assert gap <= step, (gap, step)
    assert moved > 100 * step, moved  # the run trained: the bound is not met by standing still
    assert len(grid.replies) == len(NODES)
    for reply in grid.replies:  # the masked sum's share only: no array, no client figure
        assert set(reply.content.array_records) == set()
        assert sw.RECORD in reply.content.config_records
        assert dict(reply.content.metric_records[rk.METRICS]) == {}


def test_a_query_without_a_protocol_stage_gets_an_empty_reply() -> None:
    x, y = problem(0)
    ctx = node()
    msg = message("fedavg", {}, np.zeros(D), 1)
    msg.metadata.__dict__["_message_type"] = MessageType.QUERY
    reply = method_query(msg, ctx)
    assert not reply.has_error() and len(reply.content) == 0
    trained, _ = user_train(message("fedavg", {}, np.zeros(D), 1), ctx, x, y, 1)
    assert rk.ARRAYS in trained.content.array_records  # no SecAgg+ record: a plain upload


def dp_message(mode: str, *, clip: float = 0.05, z: float = 2.0, shares: int = 4) -> Message:
    """A train message as a ``privacy=`` strategies server sends it (``release_config``)."""
    msg = message("fedavg", {}, np.zeros(D), 1, delta=True)
    conf = msg.content.config_records[rk.CONFIG]
    conf.update(release_config(Mechanism(mode=mode, clip=clip, clip_extra=clip,
                                         noise_multiplier=z, expected_clients=1,
                                         noise_shares=shares)))
    return msg


def test_distributed_dp_clips_and_adds_this_clients_noise_share(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the noise draw fixed at +1 sd per coordinate, the upload is exactly the clipped
    move plus z x C / sqrt(t_min): clipped first, then this client's share of the noise."""
    x, y = problem(0)
    plain, _ = user_train(message("fedavg", {}, np.zeros(D), 1, delta=True), node(), x, y, 1)
    move = unpack(plain.content.array_records[rk.ARRAYS])[0].astype(np.float64)
    clip, z, shares = 0.05, 2.0, 4
    assert np.linalg.norm(move) > clip  # so the clip acts
    monkeypatch.setattr(dp, "gaussian_like",
                        lambda vec, std, rng: [np.full(a.shape, std) for a in vec])
    reply, _ = user_train(dp_message("distributed", clip=clip, z=z, shares=shares), node(),
                          x, y, 1)
    sent = unpack(reply.content.array_records[rk.ARRAYS])[0].astype(np.float64)
    want = move * clip / np.linalg.norm(move) + z * clip / np.sqrt(shares)
    np.testing.assert_allclose(sent, want, rtol=1e-6)


def test_central_dp_sends_the_move_as_it_is_and_an_unknown_mode_is_refused() -> None:
    x, y = problem(0)
    plain, _ = user_train(message("fedavg", {}, np.zeros(D), 1, delta=True), node(), x, y, 1)
    central, _ = user_train(dp_message("central"), node(), x, y, 1)  # the server clips
    assert np.array_equal(unpack(plain.content.array_records[rk.ARRAYS])[0],
                          unpack(central.content.array_records[rk.ARRAYS])[0])
    ctx = node()
    with pytest.raises(ValueError) as err:
        user_train(dp_message("sample"), ctx, x, y, 1)
    assert str(err.value) == ("the train message asks for privacy mode dp='sample'; "
                              "strategies.client serves off | central | distributed | local")
    assert stored_state(ctx) == {}  # nothing trained, nothing stored


def test_a_users_app_runs_distributed_dp_inside_secagg() -> None:
    """End to end through the strategy: the round completes with every masked upload
    aggregated, and the noise moves the model off the plain SecAgg+ run's by far more than
    the quantisation step."""
    secure, _ = run(FedInit, secure=True)
    noised, grid = run(FedInit, secure=True,
                       privacy=DistributedDP(noise_multiplier=1.0, clipping_norm=0.2),
                       min_replies=2)
    assert len(grid.replies) == len(NODES)
    gap = max(float(np.abs(a - b).max()) for a, b in zip(noised, secure, strict=True))
    assert gap > 100 * 2 * CLIP / (2**BITS - 1), gap
