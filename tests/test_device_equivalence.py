"""Device data trains exactly what the partitioned benchmark trains, given the same examples.

Each client's Dirichlet partition of Fashion-MNIST is written to its own array file, and the
same experiment runs twice through the real server loop and ClientApp handlers (in-process
grid): once as the benchmark (every node reads partition ``partition-id`` of the whole data
set), once with ``dataset=device`` (every node reads only its own file, the server holds no
data, evaluation is federated). The final models must be equal bit for bit: the schema builds
the same initial model, the local test split and shuffling are seeded by (seed, client) alike.
The device run's final model is then scored on the central test set as well.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.data_sets.fashion_mnist import SPEC as FASHION
from fedinit.task.federated_data import dataset_of, partition_indices
from server_app.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("quick_runs")

BENCH = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 3, "train-limit": 800,
         "local-epochs": 1, "personal-eval-every": 0, "method": "scaffold", "beta": 0.1}
CLASSES = "tshirt,trouser,pullover,dress,coat,sandal,shirt,sneaker,bag,boot"


def final_model(run: Path) -> list[np.ndarray]:
    with np.load(run / "final_model.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


@pytest.mark.parametrize("method", ["scaffold", "fedavg"])
def test_device_data_run_equals_the_partitioned_run_bit_for_bit(tmp_path: Path,
                                                               method: str) -> None:
    bench = RunConfig.parse({**BENCH, "method": method, "output-dir": str(tmp_path / "b")})
    data = dataset_of(bench)
    files = []
    for cid in range(bench.num_clients):
        idx = partition_indices(bench, cid)
        files.append(tmp_path / f"device-{cid}.npz")
        np.savez(files[-1], x=data.train_x[idx], y=data.train_y[idx])
    schema = FASHION.schema
    assert schema is not None
    device = RunConfig.parse({
        **BENCH, "method": method, "output-dir": str(tmp_path / "d"), "dataset": "device",
        "device-classes": CLASSES, "device-image-size": 28, "device-channels": 1,
        "device-mean": ",".join(f"{m:g}" for m in schema.mean),
        "device-std": ",".join(f"{s:g}" for s in schema.std),
        "max-examples-per-client": 1000})
    assert device.eval_source == "federated"

    run_experiment(InProcessGrid(bench.num_clients, bench.to_dict()), bench,
                   out_dir=tmp_path / "bench")
    grid = InProcessGrid(device.num_clients, device.to_dict())
    for cid, path in enumerate(files):
        grid.context_of(cid).node_config["data-dir"] = str(path)
    summary = run_experiment(grid, device, out_dir=tmp_path / "device")

    want, got = final_model(tmp_path / "bench"), final_model(tmp_path / "device")
    assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got, strict=True))
    assert summary["eval-source"] == "federated"
