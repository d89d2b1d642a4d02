"""The live fleet page in a real headless browser (Debian's chromium, driven by Playwright)
while an in-process run fills the run directory: the fleet table with its refused and silent
nodes, the accuracy curve growing a point per round, and no request leaving 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from flwr.app import Message, MessageType

from fedinit.cli.dashboard import make_server
from fedinit.config import RunConfig
from server_app import clients
from server_app.experiment import run_experiment
from tests.browser_page import FLEET_LOOK, browse
from tests.test_fleet import SMALL, ChangingGrid, silent_7777

ROUNDS = 5
ROUND_PAUSE = 1.2
"""Seconds each train reply is held back: rounds slow enough to watch the curve grow."""


def slow_replies(reply: Message) -> Message | None:
    if reply.metadata.message_type == MessageType.TRAIN:
        time.sleep(ROUND_PAUSE)
    return silent_7777(reply)


def rows(run: Path) -> int:
    try:
        return len((run / "rounds.jsonl").read_text().splitlines())
    except OSError:
        return 0


@pytest.mark.slow
def test_a_browser_sees_the_fleet_and_the_curve_grow_while_the_run_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clients, "RETRY_SECONDS", 0.0)
    monkeypatch.setattr(clients, "IDENTITY_WAIT_SECONDS", 0.0)
    raw = {**SMALL, "num-server-rounds": ROUNDS, "min-clients": 2, "output-dir": str(tmp_path)}
    grid = ChangingGrid(raw)
    grid.reply_filter = slow_replies
    run = tmp_path / "run"
    failure: list[BaseException] = []

    def experiment() -> None:
        try:
            run_experiment(grid, RunConfig.parse(raw), out_dir=run)
        except BaseException as err:  # noqa: BLE001 - reported by the test below
            failure.append(err)

    server = make_server(run, port=0, refresh=1)  # the run directory, before it exists
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    worker = threading.Thread(target=experiment, daemon=True)
    t0 = time.monotonic()
    urls: list[str] = []
    away: list[str] = []
    seen: list[tuple[int, int]] = []  # (points on the page, rows on disk just after)
    states: dict[str, str] = {}
    try:
        # The browser first: on a fresh machine browse() installs chromium (minutes), and a
        # run started before it would be over before the page is first read.
        with browse() as tab:
            worker.start()
            while not (run / "status.json").exists() and worker.is_alive():
                time.sleep(0.1)
            tab.page.goto(f"http://127.0.0.1:{port}/")
            for look in tab.looks(FLEET_LOOK, timeout=120):
                points = int(look["points"])
                states.update({n: cells["state"] for n, cells in look["nodes"].items()})
                seen.append((points, rows(run)))
                if points == ROUNDS and not worker.is_alive():
                    break
            urls, away = list(tab.requests), tab.off_host()
    finally:
        if worker.is_alive():
            worker.join(timeout=120)
        server.shutdown()
        server.server_close()
    assert not failure, failure
    counts = [p for p, _ in seen]
    assert counts == sorted(counts), counts  # it only grows
    assert counts[-1] == ROUNDS == rows(run)
    assert all(p <= n for p, n in seen)  # a point is a written row
    # one point per round: every count from the first seen to the last showed up
    assert sorted(set(counts)) == list(range(min(counts), ROUNDS + 1)), sorted(set(counts))
    assert len(set(counts)) >= 3
    assert states["5555"] == "refused" and states["7777"] == "waiting-for-identity"
    assert states["1002"] == "identified" and states["1000"] == "identified"
    assert urls and not away, away
    print(
        json.dumps(
            {
                "browser-test-seconds": round(time.monotonic() - t0, 1),
                "requests": len(urls),
                "counts-seen": sorted(set(counts)),
            }
        )
    )
