"""The live fleet page of a real TLS + node-auth deployment, in a real browser (slow).

fedinit/cli/deploy_local.py's SuperLink and SuperNodes (3 clients, ``min-clients=2``): client 2's
node starts late, a fourth registered node that says another federation size
(num-partitions=7) joins and is refused, and client 1's train task hangs in round 2 until its
node kills it at the deadline (testbeds/fault_app.py). Once all of that is on the page, client
0's SuperNode is SIGKILLed (with its executor): its row turns not connected once the SuperLink
misses its heartbeats (2 x 30 s in Flower 1.39) and its no-reply / rejected count grows,
while the other nodes stay connected and the run goes on without it. The same mechanisms as
test_deploy_faults.py and test_edge_fleet.py. ``fedinit-dashboard``'s server runs in this
process on 127.0.0.1; Debian's headless chromium (Playwright, tests/browser_page.py) watches
the page.

Each event is shown as such on the page within EVENT_SECONDS of the test first seeing it in
the run's files or log, and so is every round written, as a point of the accuracy curve;
every request the browser makes goes to 127.0.0.1. About 2-3 minutes on a loaded 2-core
machine, most of it the late node's start-up and the killed node's heartbeat lapse.
``FEDINIT_SCREENSHOTS=1`` writes the page as docs/img/fleet-page.png once all of it is on the
page (never in CI: the tree stays as it is).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fedinit.cli.dashboard import make_server
from fedinit.cli.deploy_local import Deployment, pids_mentioning, stop_pids
from fedinit.cli.flower_env import REPO
from server_app.status import STATUS_FILE
from testbeds.deployment_runs import FlwrRun, kill_process
from testbeds.fault_app import fault_app, hang_at
from tests.browser_page import FLEET_LOOK, browse, count

BASE_PORT = int(os.environ.get("FEDINIT_TEST_DASHBOARD_PORT", "44000"))
"""SuperLink on BASE_PORT and +1, nodes on +10..+13, the page on +50."""
CLIENTS, LATE, HUNG, HANG_ROUND, KILLED = 3, 2, 1, 2, 0
WRONG = CLIENTS
"""The fourth registered key: its node says partition-id=1 num-partitions=7."""
ROUNDS = 100
"""More rounds than the test waits for: it ends once everything was shown (the late node's
start-up, 20-40 s on a loaded 2-core machine, and the killed node's heartbeat lapse decide
when), and stops the run."""
TIMEOUT = 20.0
"""round-timeout; task-deadline stays 0 (= round-timeout): the hung task is killed then."""
EVENT_SECONDS = 5.0
WAIT_SECONDS = 150.0
"""For the late, refused and hung nodes to show."""
KILL_WAIT_SECONDS = 150.0
"""For the killed node to show not connected (up to 60 s of heartbeats, a round-timeout on
top, and a round without it)."""
SCREENSHOT = REPO / "docs" / "img" / "fleet-page.png"
TIMED_OUT = "no reply (timed out)"


def rows_of(run: Path | None) -> list[dict[str, Any]]:
    if run is None:
        return []
    try:
        text = (run / "rounds.jsonl").read_text()
    except OSError:
        return []
    return [json.loads(x) for x in text.splitlines() if x.endswith("}")]


def status_nodes(run: Path | None) -> dict[int, dict[str, Any]]:
    try:
        status = json.loads((run / STATUS_FILE).read_text()) if run else {}
    except (OSError, ValueError):
        return {}
    return {int(n["node"]): n for n in status.get("fleet", {}).get("nodes", [])}


def failed(cells: dict[str, Any]) -> int:
    """A fleet row's tasks that came to nothing: no reply (timed out) plus rejected."""
    return count(cells.get(TIMED_OUT)) + count(cells.get("rejected"))


def tails(dep: Deployment, run: FlwrRun | None) -> str:
    """The node, link and run log tails: what a stall report needs."""
    out = [p.tail(20) for p in dep.procs]
    if run is not None:
        out.append("    run| " + "\n    run| ".join(run.text().splitlines()[-30:]))
    return "\n".join(out)


@pytest.mark.slow
def test_a_browser_sees_a_tls_deployments_late_refused_hung_and_killed_nodes(
    tmp_path: Path,
) -> None:
    t0 = time.monotonic()
    dep = Deployment(tmp_path / "deploy", CLIENTS + 1, base_port=BASE_PORT, num_partitions=CLIENTS)
    child_pid_file = tmp_path / "hung-child.pid"
    app = fault_app(tmp_path / "app", hang_at(HANG_ROUND, HUNG, child_pid_file))
    out = tmp_path / "out"
    run: FlwrRun | None = None
    run_dir: Path | None = None
    server = None
    urls: list[str] = []
    away: list[str] = []
    seen: list[tuple[int, int, float]] = []  # (points on the page, rows on disk just after, when)
    on_file: dict[str, float] = {}  # event -> when the test first saw it in the files/log
    on_page: dict[str, float] = {}  # event -> when the page first showed it
    first_look: dict[str, dict[str, Any]] = {}
    nodes: dict[str, dict[str, Any]] = {}  # the page's last look at the fleet
    killed_at: float | None = None
    at_kill: dict[str, Any] = {}  # the page's killed node's row, and rows, when killed
    gone: dict[str, Any] = {}  # the page's look when it first showed the node not connected
    try:
        with browse() as tab:
            dep.up(start=[0, 1])
            registry = json.loads(dep.registry.read_text())
            node_of = {i: int(n) for n, i in registry.items()}
            del registry[str(node_of[WRONG])]  # registered with the SuperLink, no client
            dep.registry.write_text(json.dumps(registry))
            late, wrong, hung, killed = (str(node_of[i]) for i in (LATE, WRONG, HUNG, KILLED))
            cfg = {
                "method": "fedavg",
                "num-clients": CLIENTS,
                "min-clients": 2,
                "fraction-train": 1.0,
                "num-server-rounds": ROUNDS,
                "train-limit": 300,
                "local-epochs": 1,
                "seed": 0,
                "personal-eval-every": 0,
                "node-wait-timeout": 60.0,
                "round-timeout": TIMEOUT,
                "node-registry": str(dep.registry),
                "output-dir": str(out),
            }
            run = flwr = FlwrRun(dep, "run", cfg, app)
            flwr.run_id()
            deadline = time.monotonic() + 180
            while not list(out.glob(f"*/{STATUS_FILE}")):  # the run started on nodes 0, 1
                assert time.monotonic() < deadline, "no status.json:\n" + tails(dep, run)
                assert run.popen.poll() is None, "run ended:\n" + tails(dep, run)
                time.sleep(0.2)
            (run_dir,) = [p.parent for p in out.glob(f"*/{STATUS_FILE}")]
            dep.start_node(LATE)
            cmd = dep.node_command(WRONG)
            at = cmd.index("--node-config") + 1
            was = f"partition-id={WRONG} num-partitions={CLIENTS}"
            assert was in cmd[at], cmd[at]
            cmd[at] = cmd[at].replace(was, "partition-id=1 num-partitions=7")
            dep.start_node(WRONG, cmd=cmd, name="supernode-wrong")

            def read_files() -> None:
                """What the run's files and log say now (before each look at the page)."""
                now, rows, fleet = time.monotonic(), rows_of(run_dir), status_nodes(run_dir)
                there = {
                    "late": fleet.get(int(late), {}).get("state") == "identified",
                    "refused": f"refused node {wrong}: it has num-partitions=7" in flwr.text(),
                    "hung": any(
                        r["round"] == HANG_ROUND and r["num-missing"] + r["num-rejected"] >= 1
                        for r in rows
                    ),
                    "killed": killed_at is not None
                    and fleet.get(int(killed), {}).get("connected") is False,
                }
                for event in (e for e, yes in there.items() if yes):
                    on_file.setdefault(event, now)

            def stalled(what: str) -> str:
                table = [
                    (r["round"], r["clients-trained"], r["num-missing"], r["num-rejected"])
                    for r in rows_of(run_dir)
                ]
                return (
                    f"stalled ({what}): on the page {sorted(on_page)}, in the files "
                    f"{sorted(on_file)}, {seen[-1:] or 'no look'} (points, rows, when); the "
                    f"killed node's row {nodes.get(killed)} (at the kill {at_kill}); "
                    f"(round, trained, missing, rejected) {table}\n" + tails(dep, run)
                )

            server = make_server(run_dir, port=BASE_PORT + 50, refresh=1)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            tab.page.goto(f"http://127.0.0.1:{BASE_PORT + 50}/")
            for look in tab.looks(FLEET_LOOK, WAIT_SECONDS, before=read_files):
                nodes = look["nodes"]
                for node, cells in nodes.items():
                    first_look.setdefault(node, cells)
                shown = {
                    "late": nodes.get(late, {}).get("state") == "identified"
                    and nodes[late]["connected"] == "yes",
                    "refused": nodes.get(wrong, {}).get("state") == "refused"
                    and "num-partitions=7" in nodes[wrong]["reason"],
                    "hung": failed(nodes.get(hung, {})) >= 1,
                }
                for event in (e for e, yes in shown.items() if yes):
                    on_page.setdefault(event, time.monotonic())
                points = int(look["points"])
                seen.append((points, len(rows_of(run_dir)), time.monotonic()))
                trained_late = [
                    r["round"] for r in rows_of(run_dir) if LATE in r["clients-trained"]
                ]
                if len(on_page) == len(shown) and trained_late and points > trained_late[0]:
                    break
                assert flwr.popen.poll() is None, stalled("the run ended")
            else:
                pytest.fail(stalled(f"late, refused, hung: {WAIT_SECONDS:g} s"))

            # Client 0's SuperNode dies with its executor, as a device losing power does.
            at_kill = {"failed": failed(nodes[killed]), "rows": len(rows_of(run_dir))}
            kill_process(dep, f"supernode-{KILLED}")
            killed_at = time.monotonic()
            for look in tab.looks(FLEET_LOOK, KILL_WAIT_SECONDS, before=read_files):
                nodes = look["nodes"]
                points = int(look["points"])
                seen.append((points, len(rows_of(run_dir)), time.monotonic()))
                if nodes[killed]["connected"] == "no" and not gone:
                    on_page.setdefault("killed", time.monotonic())
                    gone = {"points": points, "nodes": nodes}
                # done: a round finished (and shown) after the page said it was gone
                if gone and points > gone["points"] and failed(nodes[killed]) > at_kill["failed"]:
                    break
                assert flwr.popen.poll() is None, stalled("the run ended")
            else:
                pytest.fail(stalled(f"killed node: {KILL_WAIT_SECONDS:g} s"))
            for _ in range(3 if os.environ.get("FEDINIT_SCREENSHOTS") == "1" else 0):
                try:  # between two reloads of the page
                    tab.shoot(SCREENSHOT)
                    break
                except tab.reloading:
                    continue
            urls, away = list(tab.requests), tab.off_host()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if run is not None:
            run.stop()
        dep.stop()
        stop_pids(pids_mentioning(str(tmp_path)))
    rows = rows_of(run_dir)
    lag = {e: round(on_page[e] - on_file[e], 2) for e in on_file if e in on_page}
    counts = [p for p, _, _ in seen]
    after = [(r["round"], r["clients-trained"]) for r in rows[at_kill["rows"] :]]
    print(
        json.dumps(
            {
                "dashboard-deploy-seconds": round(time.monotonic() - t0, 1),
                "page-minus-file-seconds": lag,
                "requests": len(urls),
                "counts-seen": sorted(set(counts)),
                "late-node-first-seen": first_look.get(late, {}).get("state"),
                "killed-shown-after-seconds": round(on_page["killed"] - killed_at, 1),
                "killed-failed-tasks": [at_kill["failed"], failed(nodes[killed])],
                "rounds-after-kill": after,
            }
        )
    )
    assert set(on_file) == {"late", "refused", "hung", "killed"}, on_file  # they happened
    assert child_pid_file.exists(), "the hang was never reached"
    assert all(lag[e] <= EVENT_SECONDS for e in on_file), lag
    # Before it connected, the late node was listed from node-registry, not connected.
    assert first_look[late]["state"] == "registered", first_look[late]
    assert first_look[late]["connected"] == "no", first_look[late]
    # The killed node: not connected, its failed tasks grew; the others stayed connected,
    # in the look that first showed it gone and in the last one (the refused node is
    # connected too: authenticated by the SuperLink, just no client).
    for look in (gone["nodes"], nodes):
        assert look[killed]["connected"] == "no", look[killed]
        assert all(look[n]["connected"] == "yes" for n in (hung, late, wrong)), look
    assert failed(nodes[killed]) > at_kill["failed"], (at_kill, nodes[killed])
    # The run went on: rounds after the kill, the last ones without client 0.
    assert len(after) >= 2 and KILLED not in after[-1][1], after
    assert {HUNG, LATE} <= set(after[-1][1]), after
    assert counts == sorted(counts), counts  # the curve only grows
    assert all(p <= n for p, n, _ in seen)  # a point is a written row
    # Every written row is on the page within EVENT_SECONDS (two rounds that end within one
    # refresh arrive together: the curve may step by two, CI 2026-12-05).
    behind = [(p, n, round(t - when, 1)) for p, _, t in seen for _, n, when in seen
              if when <= t - EVENT_SECONDS and p < n]
    assert not behind, behind[:5]  # (points shown, rows written earlier, seconds earlier)
    assert len(set(counts)) >= 4, counts  # the curve grew while the page was watched
    assert max(counts) >= HANG_ROUND + 1
    assert urls and not away, away
