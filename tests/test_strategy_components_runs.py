"""One engine, two front doors: the same settings given to a strategy's constructor as
components (``strategies/components.py``) and given to the project's run config train the
same model, bit for bit, on the in-process grid (the project's ClientApp on every node):
FedInit under central DP, FedInit with Krum, SCAFFOLD under SecAgg+, FedInit under
distributed DP inside SecAgg+, FedInit under buffered asynchronous rounds and FedInit
over-selected. FedInit + central DP + Krum is refused by both
doors with the same line (``test_strategy_components.py``): the noise is calibrated to the
sum, which a selection of replies is not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import Result

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import dp as dp_module
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.secure_aggregation import quant
from fedinit.task.models import initial_weights
from server_app.async_rounds import run_async_experiment
from server_app.experiment import run_experiment
from strategies import FedInit, Scaffold
from strategies.components import (
    BufferedAsync,
    CentralDP,
    DistributedDP,
    Krum,
    OverSelect,
    SecAgg,
)
from strategies.round_stages.sampling import SEED_ENV
from tests.test_strategy_components import train_users_app

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("quick_runs")]

SMALL = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 2, "train-limit": 400,
         "local-epochs": 1, "personal-eval-every": 0, "eval-every": 2, "tracking": "off"}


def seeded_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """DP's sample and noise from fixed seeds in both runs (each is fresh OS entropy by
    design): the secret sampling seed by its test variable, each round's noise draw from a
    generator seeded alike."""
    monkeypatch.setenv(SEED_ENV, "7")
    replies = dp_module.Mechanism.replies

    def seeded(self: Any, updates: Any, rng: Any = None) -> Any:
        return replies(self, updates, np.random.default_rng(11) if rng is None else rng)

    monkeypatch.setattr(dp_module.Mechanism, "replies", seeded)


def seeded_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    """SecAgg+'s stochastic rounding (Flower's ``quantize``, numpy's global generator) from
    a fixed seed at each upload in both runs; the masks cancel exactly whatever their seeds."""
    quantise = quant.quantize

    def seeded(*args: Any, **kwargs: Any) -> Any:
        np.random.seed(5)
        return quantise(*args, **kwargs)

    monkeypatch.setattr(quant, "quantize", seeded)


def by_run_config(tmp: Path, keys: dict[str, Any]) -> tuple[RunConfig, list[np.ndarray]]:
    cfg = RunConfig.parse({**SMALL, **keys, "output-dir": str(tmp)})
    run = run_async_experiment if cfg.schedule.rounds == "async" else run_experiment
    run(InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg, tmp / "run")
    with np.load(tmp / "run" / "final_model.npz") as z:
        return cfg, [z[f"arr_{i}"] for i in range(len(z.files))]


def by_constructor(cfg: RunConfig, cls: type, **args: Any) -> list[np.ndarray]:
    return started(cfg, cls, **args)[0]


def started(cfg: RunConfig, cls: type, **args: Any) -> tuple[list[np.ndarray], Result]:
    strategy = cls(fraction_train=cfg.train.fraction_train, min_train_nodes=1,
                   min_available_nodes=cfg.num_clients, fraction_evaluate=0.0,
                   lr=cfg.train.lr, lr_decay=cfg.train.lr_decay, seed=cfg.seed, **args)
    result = strategy.start(InProcessGrid(cfg.num_clients, cfg.to_dict()),
                            ArrayRecord(initial_weights(cfg)),
                            num_rounds=cfg.train.num_server_rounds,
                            train_config=ConfigRecord({rk.EXPERIMENT: "run"}))
    assert strategy.inner is not None and strategy.inner.cfg.method == cfg.method
    return unpack(result.arrays), result


def same(want: list[np.ndarray], got: list[np.ndarray]) -> bool:
    return len(want) == len(got) and all(a.tobytes() == b.tobytes()
                                         for a, b in zip(want, got, strict=True))


def epsilons_agree(result: Result, run_dir: Path) -> bool:
    """The strategy's result reports each round's dp-epsilon as the run's rounds.jsonl does."""
    rows = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    return [m["dp-epsilon"] for m in result.train_metrics_clientapp.values()] == [
        r["dp-epsilon"] for r in rows]


def test_fedinit_under_central_dp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded_noise(monkeypatch)
    cfg, want = by_run_config(tmp_path, {"method": "fedavg", "beta": 0.1, "dp": "central",
                                         "dp-clip": 0.5, "dp-noise-multiplier": 0.8,
                                         "weighting": "uniform"})
    got, result = started(cfg, FedInit, beta=0.1, weighting="uniform",
                          privacy=CentralDP(noise_multiplier=0.8, clipping_norm=0.5))
    assert same(want, got)
    assert epsilons_agree(result, tmp_path / "run")


def test_fedinit_with_krum(tmp_path: Path) -> None:
    cfg, want = by_run_config(tmp_path, {"method": "fedavg", "beta": 0.1, "fraction-train": 1.0,
                                         "aggregation": "krum", "byzantine-f": 0})
    assert same(want, by_constructor(cfg, FedInit, beta=0.1, aggregation=Krum(byzantine_f=0)))


def test_scaffold_under_secagg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded_rounding(monkeypatch)
    keys = {"method": "scaffold", "beta": 0.0, "fraction-train": 1.0,
            "secure-aggregation": "secagg+",
            "secagg-num-shares": 3, "secagg-threshold": 2, "weighting": "uniform",
            "max-update-norm-ratio": 0.0}
    cfg, want = by_run_config(tmp_path, keys)
    got = by_constructor(cfg, Scaffold, weighting="uniform", max_update_norm_ratio=0.0,
                         secure_aggregation=SecAgg(num_shares=3, threshold=2))
    assert same(want, got)


def test_fedinit_under_distributed_dp_inside_secagg(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each client's share of the noise (``Mechanism.release``, fresh entropy by design)
    from a fixed seed in both runs, as the server's in ``seeded_noise``."""
    seeded_noise(monkeypatch)
    seeded_rounding(monkeypatch)
    release = dp_module.Mechanism.release

    def seeded(self: Any, upload: Any, extras: Any, rng: Any = None) -> Any:
        return release(self, upload, extras, np.random.default_rng(13) if rng is None else rng)

    monkeypatch.setattr(dp_module.Mechanism, "release", seeded)
    cfg, want = by_run_config(tmp_path, {
        "method": "fedavg", "beta": 0.1, "fraction-train": 1.0, "weighting": "uniform",
        "max-update-norm-ratio": 0.0, "min-replies": 2, "secure-aggregation": "secagg+",
        "secagg-num-shares": 3, "secagg-threshold": 2, "secagg-clip": 20.0,
        "dp": "distributed", "dp-clip": 1.0, "dp-noise-multiplier": 0.5})
    got, result = started(cfg, FedInit, beta=0.1, weighting="uniform", min_replies=2,
                          max_update_norm_ratio=0.0,
                          secure_aggregation=SecAgg(num_shares=3, threshold=2, clip=20.0),
                          privacy=DistributedDP(noise_multiplier=0.5, clipping_norm=1.0))
    assert same(want, got)
    assert epsilons_agree(result, tmp_path / "run")


def test_fedinit_under_buffered_async(tmp_path: Path) -> None:
    cfg, want = by_run_config(tmp_path, {"method": "fedavg", "beta": 0.1, "rounds": "async",
                                         "concurrency": 3, "buffer-size": 2,
                                         "staleness": "poly", "staleness-a": 0.5})
    got = by_constructor(cfg, FedInit, beta=0.1, rounds=BufferedAsync(
        concurrency=3, buffer_size=2, staleness="poly", staleness_a=0.5))
    assert same(want, got)


def test_fedinit_over_selected(tmp_path: Path) -> None:
    cfg, want = by_run_config(tmp_path, {"method": "fedavg", "beta": 0.1, "over-select": 0.5})
    assert same(want, by_constructor(cfg, FedInit, beta=0.1, rounds=OverSelect(fraction=0.5)))



def test_a_users_app_under_central_dp() -> None:
    """``method_train`` needs nothing for central DP (the server re-clips each reply and
    noises the sum): the rounds aggregate, the model moves, epsilon grows per round."""
    rounds, _ = train_users_app({"privacy": CentralDP(noise_multiplier=0.1, clipping_norm=5.0),
                              "weighting": "uniform"})
    assert 0.0 < rounds[0]["dp-epsilon"] < rounds[1]["dp-epsilon"]
