"""The tests' shared Docker engine: two modules on two xdist workers use one dockerd, and the
last one out stops it, never an engine that ran before (tests/deploy_helpers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import deploy_helpers
from tests.deploy_helpers import DockerEngine, is_dockerd


@pytest.fixture
def engine_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A running engine (as `docker info` would say) and a private ENGINE_STATE."""
    state = tmp_path / "dockerd.json"
    monkeypatch.setattr(deploy_helpers, "ENGINE_STATE", state)
    monkeypatch.setattr(DockerEngine, "_engine_up", staticmethod(lambda: True))
    yield state


def sleeper(tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    """A long `sleep` whose command line names it ``name`` (a stand-in for dockerd)."""
    link = tmp_path / name
    link.symlink_to("/bin/sleep")
    return subprocess.Popen([str(link), "300"])


def ended(proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.poll() is not None


def test_the_last_user_stops_the_dockerd_the_tests_started(engine_up: Path,
                                                           tmp_path: Path) -> None:
    dockerd = sleeper(tmp_path, "dockerd")
    other_worker = subprocess.Popen(["sleep", "300"])
    try:
        assert is_dockerd(dockerd.pid) and not is_dockerd(other_worker.pid)
        engine_up.write_text(json.dumps({"pid": dockerd.pid, "users": [other_worker.pid]}))
        first = DockerEngine(tmp_path)
        first.ensure()
        assert json.loads(engine_up.read_text())["users"] == [other_worker.pid, os.getpid()]
        first.stop()  # the other worker still uses it
        assert dockerd.poll() is None
        assert json.loads(engine_up.read_text()) == {"pid": dockerd.pid,
                                                     "users": [other_worker.pid]}
        other_worker.kill()
        other_worker.wait()
        last = DockerEngine(tmp_path)
        last.ensure()  # the dead worker is dropped on the way
        last.stop()
        assert ended(dockerd)
        assert json.loads(engine_up.read_text()) == {"pid": 0, "users": []}
    finally:
        for proc in (dockerd, other_worker):
            proc.kill()
            proc.wait()


def test_an_engine_the_tests_did_not_start_is_left_running(engine_up: Path,
                                                          tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "300"])  # a recorded pid now held by another program
    try:
        engine_up.write_text(json.dumps({"pid": stranger.pid, "users": []}))
        engine = DockerEngine(tmp_path)
        engine.ensure()
        engine.stop()
        assert stranger.poll() is None
        assert json.loads(engine_up.read_text()) == {"pid": 0, "users": []}
    finally:
        stranger.kill()
        stranger.wait()
