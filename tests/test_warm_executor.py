"""The warm ClientApp executor in a real process deployment (TLS + node auth, 127.0.0.1).

One deployment, two runs: first a copy of the app whose ClientApp raises in one task and
SIGKILLs its own worker in another, then the unchanged app with another config (another
FAB). The faults become error replies in their rounds, the next rounds are whole again, the
executor never imports torch a second time, and the second run's numbers equal the same
experiment run in-process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from scripts.deploy_local import Deployment
from scripts.flower_env import REPO
from scripts.inprocess_grid import InProcessGrid
from scripts.simulate import toml_line
from server_app.experiment import run_experiment
from task.config import RunConfig
from tests.deploy_helpers import diffs, rounds, run_dir

APP_PARTS = ("pyproject.toml", "client_app", "server_app", "strategies", "task")
FAULTS = '''
    _round = int(msg.content.config_records[rk.CONFIG][rk.ROUND])
    if (_round, pid) == (2, 0):
        raise RuntimeError("injected fault")
    if (_round, pid) == (3, 1):
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
'''
TOLERANCE = {"test-acc": 5e-4, "test-loss": 1e-5, "divergence": 1e-5, "train-loss": 1e-5}


def faulty_app(dest: Path) -> Path:
    """The app, with a ClientApp that raises (round 2, client 0) and dies (round 3, client 1)."""
    dest.mkdir(parents=True)
    for part in APP_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dest / part)
    app = dest / "client_app" / "app.py"
    anchor = "    pid = partition_of(context, cfg, msg)\n    conf ="
    text = app.read_text()
    assert anchor in text, "client_app/app.py changed: update the fault injection anchor"
    app.write_text(text.replace(anchor, "    pid = partition_of(context, cfg, msg)\n" + FAULTS
                                + "    conf =", 1))
    return dest


def run(dep: Deployment, app: Path, cfg: dict[str, object], work: Path) -> tuple[str, Path]:
    cfg_file = work / f"run-{len(list(work.glob('run-*.toml')))}.toml"
    cfg_file.write_text("\n".join(toml_line(k, v) for k, v in cfg.items()) + "\n")
    _, status, results = dep.run(app, cfg_file, timeout=600)
    assert results is not None
    return status, results


def status(dep: Deployment, i: int) -> dict[str, object]:
    return json.loads(dep.executor_status(i).read_text())


@pytest.mark.slow
def test_warm_executor_survives_faults_and_picks_up_a_new_fab(tmp_path: Path) -> None:
    work = tmp_path / "deploy"
    dep = Deployment(work, num_nodes=3, base_port=29600)
    base = {"num-clients": 3, "fraction-train": 1.0, "train-limit": 1500, "local-epochs": 1,
            "min-replies": 1}
    try:
        dep.up()
        first, results1 = run(dep, faulty_app(tmp_path / "faulty-app"),
                              {**base, "num-server-rounds": 4, "seed": 0,
                               "output-dir": str(tmp_path / "out1")}, work)
        after_first = [status(dep, i) for i in range(3)]
        cfg2 = {**base, "num-server-rounds": 3, "seed": 1, "beta": 0.05,
                "output-dir": str(tmp_path / "out2")}
        second, results2 = run(dep, REPO, cfg2, work)
        after_second = [status(dep, i) for i in range(3)]
    finally:
        dep.stop()

    assert first == "finished:completed", first
    rows1 = rounds(results1)
    print("\nrun 1 (faults):", [(r["round"], r["num-replies"], r["num-rejected"],
                                 round(r["round-seconds"], 1)) for r in rows1])
    assert [r["num-rejected"] for r in rows1] == [0, 1, 1, 0]
    assert [r["num-replies"] for r in rows1] == [3, 2, 2, 3]
    # The killed worker was answered for at once, not after Flower's task-token expiry.
    assert rows1[2]["round-seconds"] < 30, rows1[2]
    link = (work / "logs" / "supernode-1.log").read_text()
    assert "worker died" in link and "error reply sent" in link
    assert "\x1b[" not in link  # a log file gets no colour codes
    raised, killed = after_first[0], after_first[1]
    assert raised["worker_starts"] == 1 and raised["tasks_failed"] == 1
    assert killed["worker_crashes"] == 1 and killed["worker_starts"] == 2
    assert all(s["cold_workers"] == 0 for s in after_first + after_second)

    assert second == "finished:completed", second
    for before, now in zip(after_first, after_second, strict=True):
        assert now["pid"] == before["pid"]  # the same supervisor: torch imported once
        assert now["worker_starts"] == before["worker_starts"] + 1  # new FAB, new worker
    # The second run equals the same experiment through the same code in-process.
    torch.set_num_threads(1)
    ref_out = tmp_path / "ref"
    ref_cfg = RunConfig.parse({**cfg2, "output-dir": str(ref_out)})
    run_experiment(InProcessGrid(3, ref_cfg.to_dict()), ref_cfg, ref_out / "run")
    diff = diffs(rounds(results2), rounds(ref_out / "run"))
    print("run 2 vs in-process:", diff)
    assert all(diff[k] <= TOLERANCE[k] for k in diff), diff
    assert run_dir(tmp_path / "out2") == results2
