"""Federated evaluation: the example-weighted mean of the clients' local scores equals one
evaluation on all their test examples together; a device-data run on the real server loop
and ClientApp handlers (in process) gets its accuracy curve that way, with no data on the
server, and goes on when one device's data does not meet the schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

import server_app.experiment as experiment
from client_app.model_cache import client_test_tensors
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.task.data_paths import default_data_dir
from fedinit.task.datasets import load_dataset
from fedinit.task.evaluation import evaluate
from fedinit.task.models import get_weights, initial_model
from server_app import federated_eval
from server_app.federated_eval import FederatedEvaluator, LocalScore, weighted_mean
from tests.device_data import FMNIST_CLASSES, skewed_fmnist_folders, write_image_folder

pytestmark = pytest.mark.usefixtures("quick_runs")  # 1,000 central test images, no plots

FMNIST = load_dataset("fashion-mnist", str(default_data_dir("fashion-mnist")))
DEVICE = {"dataset": "device", "device-classes": ",".join(FMNIST_CLASSES),
          "device-mean": "0.2860", "device-std": "0.3530", "max-examples-per-client": 500,
          "local-test-fraction": 0.3, "personal-eval-every": 0, "batch-size": 16,
          "local-epochs": 1, "lr": 0.05}


def device_grid(tmp: Path, cfg: RunConfig, folders: list[Path]) -> InProcessGrid:
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    for i, folder in enumerate(folders):
        grid.context_of(i).node_config["data-dir"] = str(folder)
    return grid


def fmnist_folders(tmp: Path, sizes: list[int]) -> list[Path]:
    """Node folders of different sizes and class mixes (so weighting matters)."""
    rng = np.random.default_rng(3)
    folders = []
    for node, n in enumerate(sizes):
        idx = rng.choice(len(FMNIST.train_y), size=n, replace=False)
        keep = FMNIST.train_y[idx] < 3 + 3 * node  # node 0 holds classes 0-2 only, ...
        folders.append(write_image_folder(tmp / f"n{node}", FMNIST.train_x[idx][keep],
                                          FMNIST.train_y[idx][keep], FMNIST_CLASSES))
    return folders


def test_weighted_mean_equals_one_evaluation_of_all_test_examples(tmp_path: Path) -> None:
    cfg = RunConfig.parse({**DEVICE, "num-clients": 3})
    folders = fmnist_folders(tmp_path, [40, 90, 160])
    grid = device_grid(tmp_path, cfg, folders)
    model = initial_model(cfg)
    torch.manual_seed(1)
    with torch.no_grad():  # a model that is not at chance, so the scores differ by client
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    weights = get_weights(model)
    loss, acc, fields = FederatedEvaluator(cfg, {i: 1000 + i for i in range(3)})(
        grid, 1, ArrayRecord(weights), ConfigRecord({}))
    # independently: every client's local test split stacked, one evaluation
    tests = [client_test_tensors(cfg, i, str(f)) for i, f in enumerate(folders)]
    x = torch.cat([t[0] for t in tests])
    y = torch.cat([t[1] for t in tests])
    want_loss, want_acc = evaluate(model, x, y)
    assert fields["fed-eval-examples"] == len(y) and fields["fed-eval-clients"] == 3
    assert acc == pytest.approx(want_acc, abs=1e-12)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    per_client = [evaluate(model, *t)[1] for t in tests]
    assert abs(float(np.mean(per_client)) - want_acc) > 1e-3  # weighting is what made it equal


def test_weighted_mean_by_hand() -> None:
    scores = [LocalScore(0, 10, 2.0, 0.5), LocalScore(1, 30, 1.0, 0.9), LocalScore(2, 0, 0, 0)]
    loss, acc = weighted_mean(scores)
    assert loss == pytest.approx((10 * 2.0 + 30 * 1.0) / 40)
    assert acc == pytest.approx((10 * 0.5 + 30 * 0.9) / 40)
    assert weighted_mean([LocalScore(0, 0, 0.0, 0.0)]) == (None, None)


def test_the_sample_is_seeded_and_fixed() -> None:
    cfg = RunConfig.parse({"num-clients": 20, "federated-eval-clients": 5, "seed": 3})
    first = federated_eval.eval_clients(cfg)
    assert len(first) == 5 == len(set(first)) and first == federated_eval.eval_clients(cfg)
    other = federated_eval.eval_clients(RunConfig.parse({"num-clients": 20,
                                                         "federated-eval-clients": 5}))
    assert first != other
    assert federated_eval.eval_clients(RunConfig.parse({"num-clients": 4})) == [0, 1, 2, 3]


@pytest.mark.parametrize(("metrics", "why"), [
    ({}, "num-test-examples=None"),
    ({"num-test-examples": 3, "eval-loss": 1.0, "eval-acc": 1.5}, "eval-acc=1.5"),
    ({"num-test-examples": 3, "eval-loss": float("nan"), "eval-acc": 0.5}, "eval-loss=nan"),
])
def test_bad_replies_are_refused(metrics: dict[str, Any], why: str) -> None:
    assert why in str(federated_eval.decode(0, metrics))


def test_device_run_evaluates_federated_without_server_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3 good devices and one whose folder holds a 32x32 image: its tasks fail with one line
    naming the file, the run completes, every round's accuracy is federated."""
    cfg = RunConfig.parse({**DEVICE, "num-clients": 4, "fraction-train": 1.0,
                           "num-server-rounds": 3, "eval-every": 2,
                           "output-dir": str(tmp_path / "out")})
    folders = skewed_fmnist_folders(tmp_path / "data", FMNIST.train_x, FMNIST.train_y, 3,
                                    per_node=80, seed=1)
    bad = write_image_folder(tmp_path / "bad", np.zeros((1, 32, 32, 1), np.uint8),
                             np.array([4]), FMNIST_CLASSES)
    grid = device_grid(tmp_path, cfg, [*folders, bad])
    monkeypatch.setattr(experiment, "dataset_of", lambda _c: pytest.fail("server loaded data"))
    monkeypatch.setattr(experiment, "check_present", lambda *_a: pytest.fail("looked for data"))
    warnings: list[str] = []
    for module in ("strategies.operator_log", "server_app.federated_eval"):  # rejected: replies
        monkeypatch.setattr(f"{module}.log", lambda _lvl, fmt, *a: warnings.append(fmt % a))
    summary = experiment.run_experiment(grid, cfg)
    run = Path(summary["results-dir"])
    rows = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    assert [r["test-acc"] is not None for r in rows] == [False, True, True]
    assert all(r["fed-eval-clients"] == 3 for r in rows[1:])
    assert all(r["num-replies"] == 3 and r["num-rejected"] == 1 for r in rows)
    assert summary["eval-source"] == "federated" and summary["final-test-acc"] is not None
    assert json.loads((run / "config.json").read_text())["evaluation"] == "auto"
    named = [w for w in warnings if "bad/coat/00000.png: image is 32x32" in w]
    assert len(named) == 3 + 2  # every train and every evaluate task of the bad device
