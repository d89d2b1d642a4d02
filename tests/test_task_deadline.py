"""The task deadline of the warm executor: how it is derived, and that a kill at the deadline
takes the worker's children too (real processes; the whole path, with a ClientApp task that
hangs in a deployment, is in tests/test_warm_executor.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from fedinit.config import ConfigError, RunConfig, load_defaults
from fedinit.node.deadline import task_deadline, timeout_reason
from fedinit.node.launch import executor_command
from fedinit.node.launch import parse_args as launch_args
from fedinit.node.warm_executor import InFlight, Worker, parse_args


@pytest.mark.parametrize(("run_config", "override", "want"), [
    ({"task-deadline": 0.0, "round-timeout": 45.0}, 0.0, 45.0),  # 0 -> round-timeout
    ({"task-deadline": 12.5, "round-timeout": 45.0}, 0.0, 12.5),  # the run's own value
    ({"task-deadline": 12.5, "round-timeout": 45.0}, 3.0, 3.0),  # the node's flag wins
    ({"task-deadline": 0.0, "round-timeout": 45.0}, 3.0, 3.0),
    ({"round-timeout": 30}, 0.0, 30.0),  # an older app without the key
    ({}, 0.0, 0.0),  # another app: no deadline
    ({}, 7.0, 7.0),
    ({"task-deadline": "10", "round-timeout": True}, 0.0, 0.0),  # not numbers: unset
    ({"task-deadline": float("nan"), "round-timeout": 20.0}, 0.0, 20.0),
])
def test_deadline_derivation(run_config: dict[str, object], override: float,
                             want: float) -> None:
    assert task_deadline(run_config, override) == want


def test_the_default_run_config_gives_round_timeout() -> None:
    cfg = RunConfig.parse({"round-timeout": 33.0}).to_dict()
    assert load_defaults()["task-deadline"] == 0.0
    assert task_deadline(cfg) == 33.0
    assert task_deadline(RunConfig.parse({"task-deadline": 5}).to_dict()) == 5.0


def test_a_negative_task_deadline_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({"task-deadline": -1.0})
    msg = str(err.value)
    assert "\n" not in msg and "task-deadline=-1.0" in msg and "round-timeout" in msg


def test_the_node_flag_reaches_the_executor_and_bad_values_are_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    args, _ = launch_args(["--task-deadline", "30", "--", "--insecure"])
    cmd = executor_command(args, "127.0.0.1:9094")
    assert cmd[cmd.index("--task-deadline") + 1] == "30.0"
    assert parse_args(["--runtime-api-address", "x:1", "--insecure", *cmd[-2:]]
                      ).task_deadline == 30.0
    assert "--task-deadline" not in executor_command(launch_args([])[0], "127.0.0.1:9094")
    for bad in (["--task-deadline", "-2"], ["--task-deadline", "inf"],
                ["--task-deadline", "5", "--executor", "flower"]):
        with pytest.raises(SystemExit):
            launch_args(bad)
        assert "--task-deadline" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--runtime-api-address", "x:1", "--insecure", "--task-deadline", "nan"])
    assert "not allowed" in capsys.readouterr().err


def test_timeout_reason_is_one_line_naming_the_deadline() -> None:
    assert timeout_reason(30.0) == "task exceeded task-deadline=30s; killed"
    assert timeout_reason(2.5) == "task exceeded task-deadline=2.5s; killed"


def test_in_flight_is_overdue_only_past_a_deadline() -> None:
    task = InFlight(1, "token", started=100.0, deadline=10.0)
    assert not task.overdue(109.9) and task.overdue(110.1)
    assert not InFlight(2, "token", started=100.0).overdue(10**9)  # 0: no deadline


def _hang_with_a_child(conn: Connection, address: str, insecure: bool,
                       certificates: bytes | None, deadline_override: float) -> None:
    """Stands in for worker_main's task: a child (a data-loader worker) and no return."""
    del address, insecure, certificates, deadline_override
    os.setpgid(0, 0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"])
    conn.send(child.pid)
    while True:
        time.sleep(3600)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_kill_takes_the_worker_and_its_children(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedinit.node.warm_executor.worker_main", _hang_with_a_child)
    worker = Worker("f" * 64, "127.0.0.1:1", True, None)
    conn = worker.conn
    assert conn.poll(30), "the stand-in worker did not start its child"
    child = int(conn.recv())
    pid = worker.process.pid
    assert pid is not None and os.getpgid(pid) == pid  # a process group of its own
    assert os.getpgid(child) == pid and not gone(child)
    worker.kill()
    deadline = time.monotonic() + 10
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert gone(child), "the worker's child outlived the kill"
        assert worker.process.exitcode == -signal.SIGKILL
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_worker_has_its_own_process_group_before_any_task() -> None:
    worker = Worker("e" * 64, "127.0.0.1:1", True, None)
    try:
        pid = worker.process.pid
        assert pid is not None and os.getpgid(pid) == pid != os.getpgid(0)
    finally:
        worker.stop()
