"""Bring your own data, deployed: TLS + node auth, 4 SuperNodes, each with its own image
folder made here from Fashion-MNIST with a skewed class mix, one of them holding a bad file.
The server holds no data; the run completes; the bad node's tasks fail with the one line
naming its file and are not aggregated; the accuracy curve is federated."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedinit.cli.deploy_local import Deployment
from fedinit.cli.simulate import RUN_ID
from fedinit.task.data_paths import default_data_dir
from fedinit.task.datasets import load_dataset
from testbeds.deployment_runs import FlwrRun, deployed
from tests.deploy_helpers import rounds
from tests.device_data import FMNIST_CLASSES, skewed_fmnist_folders, write_image_folder

GOOD = 3
BASE_PORT = int(os.environ.get("FEDINIT_TEST_DEVICE_BASE_PORT", "39620"))


class DeviceDeployment(Deployment):
    """deploy_local's Deployment whose node i also gets ``data-dir=<folders[i]>``."""

    folders: list[Path] = []

    def node_command(self, i: int, *args: object, **kwargs: object) -> list[str]:
        cmd = super().node_command(i, *args, **kwargs)  # type: ignore[arg-type]
        at = cmd.index("--node-config") + 1
        cmd[at] += f' data-dir="{self.folders[i]}"'
        return cmd


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[DeviceDeployment]:
    data = load_dataset("fashion-mnist", str(default_data_dir("fashion-mnist")))
    folders = skewed_fmnist_folders(tmp_path / "data", data.train_x, data.train_y, GOOD,
                                    per_node=300, seed=0)
    bad = write_image_folder(tmp_path / "data" / "bad", data.train_x[:20], data.train_y[:20],
                             FMNIST_CLASSES)
    (bad / "sandal" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    dep = DeviceDeployment(tmp_path / "deploy", GOOD + 1, base_port=BASE_PORT)
    dep.folders = [*folders, bad]
    with deployed(dep, tmp_path):
        yield dep


@pytest.mark.slow
def test_devices_bring_their_own_data(deployment: DeviceDeployment, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = {"dataset": "device", "device-classes": ",".join(FMNIST_CLASSES),
           "device-mean": "0.2860", "device-std": "0.3530", "max-examples-per-client": 1000,
           "num-clients": GOOD + 1, "fraction-train": 1.0, "num-server-rounds": 3,
           "local-epochs": 1, "personal-eval-every": 0, "node-wait-timeout": 60.0,
           "round-timeout": 120.0, "node-registry": str(deployment.registry),
           "output-dir": str(out)}
    run = FlwrRun(deployment, "device", cfg)
    status = run.wait(timeout=300)
    text = run.text()
    assert status == "finished:completed", text[-4000:]
    assert RUN_ID.search(text)
    (run_dir,) = [p.parent for p in out.glob("*/summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval-source"] == "federated"
    rows = rounds(run_dir)
    assert len(rows) == 3
    for row in rows:
        assert row["num-replies"] == GOOD and row["num-rejected"] == 1, row
        assert row["fed-eval-clients"] == GOOD and row["test-acc"] is not None, row
    print("federated accuracy curve:", [round(r["test-acc"], 4) for r in rows],
          "examples:", rows[-1]["fed-eval-examples"],
          "round seconds:", [round(r["round-seconds"], 1) for r in rows])
    assert rows[-1]["test-acc"] > 0.3  # 3 rounds on 900 images: well above chance (0.1)
    # the bad node's one line, as the server logged it for every train and evaluate task
    line = f"{deployment.folders[-1]}/sandal/broken.png: cannot decode image"
    assert text.count(line) >= 2 * 3, text[-4000:]
