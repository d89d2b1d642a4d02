"""fedinit/cli/deploy_local.py's node environment and its error when `flwr run` starts nothing.

Found on a GPU host where Flower was installed with ``pip install --target`` (on PYTHONPATH,
not in the venv): the SuperNodes got PYTHONPATH=<repo> alone, died at ``import flwr``, and the
error said only "`flwr run` did not start a run"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedinit.cli.deploy_local import REPO, Deployment, Proc, Watcher


@pytest.mark.parametrize(("callers", "want"), [
    ("/opt/site-a" + os.pathsep + "/opt/site-b", [str(REPO), "/opt/site-a", "/opt/site-b"]),
    (None, [str(REPO)]),
])
def test_nodes_get_the_repo_then_the_callers_pythonpath(
        callers: str | None, want: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if callers is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", callers)
    dep = Deployment(tmp_path, num_nodes=1, insecure=True)
    seen: dict[str, str] = {}
    monkeypatch.setattr(dep, "start", lambda name, cmd, env: seen.update(env))
    dep.start_node(0, cmd=["true"])
    assert seen["PYTHONPATH"].split(os.pathsep) == want


def test_watcher_names_the_process_that_died(tmp_path: Path) -> None:
    log = tmp_path / "supernode-0.log"
    log.write_text("ModuleNotFoundError: No module named 'flwr'\n")
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    watcher = Watcher([Proc("supernode-0", dead, log)], timeout=60.0)
    watcher.watch(run)
    try:
        assert run.wait(timeout=10) != 0  # terminated by the watcher, not finished
    finally:
        watcher.stop()
        run.kill()
    assert "supernode-0 exited with 3" in watcher.reason
    assert "No module named 'flwr'" in watcher.reason
