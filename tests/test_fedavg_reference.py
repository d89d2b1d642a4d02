"""The pipeline with beta = 0 against an independent FedAvg written here from its definition."""

from pathlib import Path

import numpy as np
import pytest
import torch

from client_app.trainer import local_sgd
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods.sampling import sample_clients
from fedinit.task.datasets import to_tensor
from fedinit.task.federated_data import client_examples, dataset_of
from fedinit.task.models import get_weights, initial_model, set_weights
from server_app.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 5, "fraction-train": 0.6, "num-server-rounds": 3, "train-limit": 1000,
         "local-epochs": 1, "batch-size": 20}


def reference_fedavg(cfg: RunConfig) -> list[np.ndarray]:
    """McMahan's FedAvg: every sampled client trains from w_t; w_{t+1} = sum n_i w_i / sum n_i."""
    data = dataset_of(cfg)
    model = initial_model(cfg, data)
    w = [a.astype(np.float64) for a in get_weights(model)]
    t = cfg.train
    for rnd in range(1, cfg.train.num_server_rounds + 1):
        acc = [np.zeros_like(a) for a in w]
        total = 0
        for cid in sample_clients(cfg.seed, rnd, cfg.num_clients, cfg.clients_per_round):
            set_weights(model, [a.astype(np.float32) for a in w])
            x, y = client_examples(cfg, cid)
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence(
                [cfg.seed, rnd, cid]).generate_state(1)[0]))
            local_sgd(model, to_tensor(x, data.mean, data.std), torch.tensor(y),
                      epochs=t.local_epochs, batch_size=t.batch_size, lr=t.lr_at(rnd),
                      weight_decay=t.weight_decay, clip_norm=t.clip_norm, generator=gen)
            for s, a in zip(acc, get_weights(model), strict=True):
                s += len(y) * a.astype(np.float64)
            total += len(y)
        w = [s / total for s in acc]
    return [a.astype(np.float32) for a in w]


def pipeline(tmp: Path, **over: object) -> list[np.ndarray]:
    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp), **over})
    run_experiment(InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg, out_dir=tmp)
    with np.load(tmp / "final_model.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def test_beta_zero_equals_independent_fedavg(tmp_path: Path) -> None:
    ref = reference_fedavg(RunConfig.parse(SMALL))
    for variant in ("model", "update"):
        got = pipeline(tmp_path / variant, beta=0.0, **{"ri-aggregation": variant})
        assert max_diff(got, ref) < 1e-5, variant
    relaxed = pipeline(tmp_path / "ri", beta=0.1)
    assert max_diff(relaxed, ref) > 1e-3  # RI really changes the trajectory


def test_same_seed_same_run_bit_for_bit(tmp_path: Path) -> None:
    a = pipeline(tmp_path / "a")
    b = pipeline(tmp_path / "b")
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))
