"""``strategies.client.method_train`` under local DP (a user's own ClientApp and
``privacy=LocalDP(...)``), as the project's ClientApp runs it: the device's floor refuses a
task that asks for less before anything is read, the upload is clipped and noised on the
device (z x C, checked exactly with the draw fixed), the release is counted in the device's
ledger (its epsilon against ``dp_accounting`` called here), the reply carries no per-client
figure, and a run through the strategy trains on the noised uploads."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from torch import nn

from fedinit.methods import dp
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.store.privacy_ledger import LEDGER_NAME
from strategies import LocalDP
from strategies.catalog import FedInit
from strategies.client import stored_state
from strategies.device_privacy import REFUSED
from tests.test_client_secagg import dp_message
from tests.test_strategies import D, UserGrid, message, problem, user_train

CLIP, Z = 0.05, 2.0


def device(tmp_path: Path, **floor: object) -> Context:
    """A node whose config holds the device's own floor (none: only ``state-dir``)."""
    return Context(run_id=1, node_id=7, node_config={"state-dir": str(tmp_path), **floor},
                   state=RecordDict(), run_config={})


def by_hand_epsilon(releases: int, z: float, channels: int, delta: float = 1e-5) -> float:
    """Replace-one: two inputs' clipped vectors lie in one ball of radius C, so one
    channel's release is a Gaussian mechanism of sensitivity 2C and noise z C."""
    accountant = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dpa.GaussianDpEvent(z / 2.0), releases * channels)
    return float(accountant.get_epsilon(delta))


def test_the_upload_is_the_clipped_move_plus_the_whole_noise_and_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = problem(0)
    plain, _ = user_train(message("fedavg", {}, np.zeros(D), 1, delta=True),
                          device(tmp_path / "a"), x, y, 1)
    move = unpack(plain.content.array_records[rk.ARRAYS])[0].astype(np.float64)
    assert np.linalg.norm(move) > CLIP  # so the clip acts
    monkeypatch.setattr(dp, "gaussian_like",
                        lambda vec, std, rng: [np.full(a.shape, std) for a in vec])
    ctx = device(tmp_path / "b")
    reply, _ = user_train(dp_message("local", clip=CLIP, z=Z), ctx, x, y, 1)
    sent = unpack(reply.content.array_records[rk.ARRAYS])[0].astype(np.float64)
    np.testing.assert_allclose(sent, move * CLIP / np.linalg.norm(move) + Z * CLIP, rtol=1e-6)
    # no loss, step or example count: only whether the saved state was usable
    assert dict(reply.content.metric_records[rk.METRICS]) == {rk.STATE_FALLBACK: 0}
    ledger = json.loads((tmp_path / "b" / LEDGER_NAME).read_text())
    assert ledger["participations"] == 1
    assert ledger["epsilon"] == pytest.approx(by_hand_epsilon(1, Z, 1), rel=1e-9)


@pytest.mark.parametrize(("floor", "mode", "reason"), [
    ({"dp-floor": "local", "dp-max-clip": 0.01, "dp-min-noise": 1.0}, "local",
     "run config dp-clip=0.05 > this device's dp-max-clip=0.01"),
    ({"dp-floor": "local", "dp-max-clip": 1.0, "dp-min-noise": 3.0}, "local",
     "run config dp-noise-multiplier=2 < this device's dp-min-noise=3"),
    ({"dp-floor": "local", "dp-max-clip": 1.0, "dp-min-noise": 1.0}, "central",
     "run config dp='central'; this device's floor is dp-floor='local' (allowed: dp='local' "
     "or dp='distributed')"),
    ({"dp-floor": "local", "dp-min-noise": 1.0}, "local",
     "dp-floor='local' needs dp-max-clip; allowed: a number > 0"),
])
def test_a_task_below_the_devices_floor_is_refused_before_anything_is_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, floor: dict[str, object], mode: str,
        reason: str) -> None:
    x, y = problem(0)
    ctx = device(tmp_path, **floor)
    with caplog.at_level(logging.WARNING):
        reply, seen = user_train(dp_message(mode, clip=CLIP, z=Z), ctx, x, y, 1)
    line = f"device privacy: refused the train message of round 1: {reason}"
    assert reply.has_error() and reply.error.code == REFUSED and reply.error.reason == line
    assert line in caplog.messages
    assert seen == [] and stored_state(ctx) == {}  # no step ran, nothing was stored
    assert list(tmp_path.iterdir()) == []  # no ledger, no state file


def test_the_devices_epsilon_cap_stops_the_release_that_would_pass_it(tmp_path: Path) -> None:
    x, y = problem(0)
    cap = (by_hand_epsilon(1, Z, 1) + by_hand_epsilon(2, Z, 1)) / 2  # one release fits
    ctx = device(tmp_path, **{"dp-floor": "local", "dp-max-clip": 1.0, "dp-min-noise": 1.0,
                              "dp-max-epsilon": cap})
    first, _ = user_train(dp_message("local", clip=CLIP, z=Z), ctx, x, y, 1)
    assert not first.has_error()
    second, seen = user_train(dp_message("local", clip=CLIP, z=Z), ctx, x, y, 1)
    assert second.has_error() and second.error.code == REFUSED
    assert "> dp-max-epsilon=" in second.error.reason and seen == []
    assert json.loads((tmp_path / LEDGER_NAME).read_text())["participations"] == 1


def test_a_failure_under_local_dp_replies_only_that_it_failed(tmp_path: Path) -> None:
    x, y = problem(0)
    bad = [(x, y[:3])]  # a batch whose shapes do not match: the step raises
    reply = user_train_on(bad, dp_message("local", clip=CLIP, z=Z), device(tmp_path))
    assert reply.has_error()
    assert reply.error.reason == ("device privacy: the train message of round 1 failed on "
                                  "this device; the reason is in its log")


def user_train_on(loader: list[tuple[torch.Tensor, torch.Tensor]], msg: object,
                  ctx: Context) -> object:
    from strategies.client import method_train
    from tests.test_strategies import mse_step

    return method_train(msg, ctx, nn.Linear(D, 1, bias=False), loader,  # type: ignore[arg-type]
                        step=mse_step, num_examples=3)


def test_a_users_app_trains_under_local_dp_and_each_round_counts_epsilon() -> None:
    """Through the strategy: every node clips and noises its own move, the server
    aggregates the noised uploads, and each round's metrics carry the server's epsilon;
    the model differs from the noiseless run's by more than rounding."""
    def run(privacy: object) -> tuple[list[np.ndarray], dict[int, dict[str, object]]]:
        torch.manual_seed(0)
        grid = UserGrid([40, 10, 30, 20])
        model = nn.Linear(D, 1, bias=False)
        strategy = FedInit(fraction_train=1.0, min_available_nodes=4, fraction_evaluate=0.0,
                           weighting="uniform", max_update_norm_ratio=0.0, privacy=privacy)
        result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=2,
                                train_config=ConfigRecord({"lr": 0.05}))
        metrics = {r: dict(m) for r, m in result.train_metrics_clientapp.items()}
        return [np.asarray(a) for a in result.arrays.to_numpy_ndarrays()], metrics

    plain, _ = run(None)
    noised, metrics = run(LocalDP(noise_multiplier=Z, clipping_norm=1.0))
    assert sorted(metrics) == [1, 2]
    assert all(m[rk.NUM_REPLIES] == 4 for m in metrics.values())
    assert 0 < metrics[1]["dp-epsilon"] < metrics[2]["dp-epsilon"]
    gap = max(float(np.abs(a - b).max()) for a, b in zip(noised, plain, strict=True))
    assert gap > 1e-3, gap

