"""The arithmetic of bench/fleet_events.py and its on-order hang (fast: no deployment)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.fleet_events import Events, event_costs
from testbeds.fault_app import hang_when_told


def rows(seconds: list[float]) -> list[dict[str, Any]]:
    return [{"round": i + 1, "round-seconds": s, "collect-seconds": s - 0.1}
            for i, s in enumerate(seconds)]


def test_each_event_costs_its_round_and_the_rounds_after_until_back_to_baseline() -> None:
    base = rows([10.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0])
    events = rows([9.0, 4.5, 24.0, 9.0, 4.2, 20.0, 20.0, 6.0])
    ev = Events(hits={"hung": 3, "dead": 6}, notes={"hung": "h", "dead": "d"})
    hung, dead = event_costs(events, base, ev)
    assert (hung["event"], hung["round"]) == ("hung", 3)
    assert hung["extra-seconds"] == pytest.approx(20.0)
    assert hung["extra-collect-seconds"] == pytest.approx(20.0)
    # round 4 is 5 s over (> max(1 s, 25 %)); round 5's 0.2 s is back to baseline
    assert hung["after-rounds"] == [4]
    assert hung["total-extra-seconds"] == pytest.approx(25.0)
    # the dead node's window runs to the end: rounds 7 and 8 are both above the tolerance
    assert dead["after-rounds"] == [7, 8]
    assert dead["after-extra-seconds"] == pytest.approx(18.0)


def test_an_event_window_ends_at_the_next_event() -> None:
    base = rows([4.0] * 6)
    events = rows([4.0, 20.0, 20.0, 20.0, 20.0, 4.0])
    ev = Events(hits={"a": 2, "b": 4})
    a, b = event_costs(events, base, ev)
    assert a["after-rounds"] == [3]
    assert b["after-rounds"] == [5]


def _handler(snippet: str) -> str:
    """The snippet inside a train handler of its own, returning when it does not hang."""
    return "def train(_round, cid):\n" + snippet + "    return 'served'\n"


def test_hang_when_told_hangs_only_the_named_client_in_the_ordered_round(tmp_path: Path
                                                                       ) -> None:
    order, child = tmp_path / "order", tmp_path / "child.pid"
    code = _handler(hang_when_told(order, 0, child))
    scope: dict[str, Any] = {}
    exec(compile(code, "snippet", "exec"), scope)  # noqa: S102 - the generated handler
    assert scope["train"](3, 0) == "served"  # no order yet
    order.write_text("3")
    assert scope["train"](2, 0) == "served"  # another round
    assert scope["train"](3, 1) == "served"  # another client
    # Run it in a process of its own: once its child is up, it must still be running a
    # second later (it sleeps forever), where waiting out a 5 s timeout idled a test worker.
    task = subprocess.Popen([sys.executable, "-c", code + "train(3, 0)\n"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (child.exists() and child.read_text()):
            assert task.poll() is None, f"the task ended (exit {task.returncode}), not hung"
            assert time.monotonic() < deadline, "the hung task did not start its child process"
            time.sleep(0.05)
        time.sleep(1.0)
        assert task.poll() is None, "the task returned after starting its child: no hang"
    finally:
        task.kill()
        task.wait()
        grandchild = child.read_text() if child.exists() else ""
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(grandchild), signal.SIGKILL)
