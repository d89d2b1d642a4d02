"""The warm ClientApp executor in a real process deployment (TLS + node auth, 127.0.0.1).

One deployment, two runs: first a copy of the app whose ClientApp raises in one task,
SIGKILLs its own worker in another and hangs forever (beside a child process) in a third,
then the unchanged app with another config (another FAB). The faults become error replies in
their rounds (the hung task's at its ``task-deadline``, its worker and child killed), the
next rounds are whole again, the executor never imports torch a second time, and the second
run's numbers equal the same experiment run in-process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fedinit.cli.deploy_local import Deployment
from fedinit.cli.flower_env import REPO
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.cli.simulate import toml_line
from fedinit.config import RunConfig
from server_app.experiment import run_experiment
from testbeds.fault_app import fault_app, hang_at, raise_at, sigkill_at
from tests.deploy_helpers import diffs, rounds, run_dir

TOLERANCE = {"test-acc": 5e-4, "test-loss": 1e-5, "divergence": 1e-5, "train-loss": 1e-5}
DEADLINE = 15.0
"""The first run's task-deadline: a hung task is answered this long after it started."""
BASE_PORT = int(os.environ.get("FEDINIT_TEST_WARM_BASE_PORT", "29600"))
"""SuperLink on BASE_PORT and +1, nodes on +10..+12; the environment moves them."""


def faulty_app(dest: Path, child_pid_file: Path) -> Path:
    """The app, with a ClientApp that raises (round 2, client 0), dies (round 3, client 1)
    and hangs forever beside a child process (round 4, client 2)."""
    return fault_app(dest, raise_at(2, 0), sigkill_at(3, 1), hang_at(4, 2, child_pid_file))


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


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
    dep = Deployment(work, num_nodes=3, base_port=BASE_PORT)
    child_pid_file = tmp_path / "hung-child.pid"
    base = {"num-clients": 3, "fraction-train": 1.0, "train-limit": 1500, "local-epochs": 1,
            "min-replies": 1}
    try:
        dep.up()
        first, results1 = run(dep, faulty_app(tmp_path / "faulty-app", child_pid_file),
                              {**base, "num-server-rounds": 5, "seed": 0,
                               "task-deadline": DEADLINE,
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
    assert [r["num-rejected"] for r in rows1] == [0, 1, 1, 1, 0]
    assert [r["num-replies"] for r in rows1] == [3, 2, 2, 2, 3]
    # The killed worker was answered for at once, not after Flower's task-token expiry.
    assert rows1[2]["round-seconds"] < 30, rows1[2]
    link = (work / "logs" / "supernode-1.log").read_text()
    assert "worker died" in link and "error reply sent" in link
    assert "\x1b[" not in link  # a log file gets no colour codes
    raised, killed, hung = after_first
    assert raised["worker_starts"] == 1 and raised["tasks_failed"] == 1
    assert killed["worker_crashes"] == 1 and killed["worker_starts"] == 2
    # The hung task was killed at its deadline (not before) with its child process and
    # answered with the deadline's error reply; round 5 was served by a fresh worker.
    assert DEADLINE < rows1[3]["round-seconds"] < DEADLINE + 10, rows1[3]
    hung_log = (work / "logs" / "supernode-2.log").read_text()
    assert f"task exceeded task-deadline={DEADLINE:g}s; killed" in hung_log
    assert hung["tasks_timed_out"] == 1 and hung["worker_crashes"] == 0
    assert hung["worker_starts"] == 2 and hung["tasks_failed"] == 1
    assert gone(int(child_pid_file.read_text())), "the hung task's child outlived the kill"
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
