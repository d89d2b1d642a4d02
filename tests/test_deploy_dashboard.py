"""The live fleet page of a real TLS + node-auth deployment, in a real browser (slow).

scripts/deploy_local.py's SuperLink and SuperNodes (3 clients, ``min-clients=2``): client 2's
node starts late, a fourth registered node that says another federation size
(num-partitions=7) joins and is refused, and client 1's train task hangs in round 2 until its
node kills it at the deadline (tests/fault_app.py). The same mechanisms as
test_deploy_faults.py and test_edge_fleet.py. ``fedinit-dashboard``'s server runs in this
process on 127.0.0.1; Debian's headless chromium (Playwright) watches the page.

Each event is shown as such on the page within EVENT_SECONDS of the test first seeing it in
the run's files or log; the accuracy curve grows one point per round; every request the
browser makes goes to 127.0.0.1. ``FEDINIT_SCREENSHOTS=1`` writes the page as
docs/img/fleet-page.png once all of it is on the page (never in CI: the tree stays as it is).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from scripts.dashboard import make_server
from scripts.deploy_local import Deployment, stop_pids
from scripts.flower_env import REPO
from server_app.status import STATUS_FILE
from tests.deploy_helpers import pids_mentioning
from tests.fault_app import fault_app, hang_at
from tests.test_dashboard_browser import FLAGS, chromium
from tests.test_deploy_faults import FlwrRun

BASE_PORT = int(os.environ.get("FEDINIT_TEST_DASHBOARD_PORT", "44000"))
"""SuperLink on BASE_PORT and +1, nodes on +10..+13, the page on +50."""
CLIENTS, LATE, HUNG, HANG_ROUND = 3, 2, 1, 2
WRONG = CLIENTS
"""The fourth registered key: its node says partition-id=1 num-partitions=7."""
ROUNDS = 30
"""More rounds than the test waits for: it ends once everything was shown (the late node's
start-up, 20-40 s on a loaded 2-core machine, decides when), and stops the run."""
TIMEOUT = 20.0
"""round-timeout; task-deadline stays 0 (= round-timeout): the hung task is killed then."""
EVENT_SECONDS = 5.0
WAIT_SECONDS = 150.0
SCREENSHOT = REPO / "docs" / "img" / "fleet-page.png"
LOOK = """() => {
  const t = document.getElementById('fleet');
  if (document.readyState !== 'complete' || !t || t.tagName !== 'TABLE') return {loaded: false};
  const head = [...t.rows[0].cells].map(c => c.textContent);
  const nodes = {};
  for (const tr of t.querySelectorAll('tr[data-node]')) {
    const cells = [...tr.cells].map(c => c.textContent);
    nodes[tr.dataset.node] = {state: tr.className, connected: tr.dataset.connected,
                              ...Object.fromEntries(head.map((h, i) => [h, cells[i]]))};
  }
  return {loaded: true, nodes,
          points: document.querySelectorAll('svg[data-key="test-acc"] circle.pt').length};
}"""
"""What the test reads off the page, in one evaluation of one loaded document."""
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


def count(cell: Any) -> int:
    """A page cell's count ("3", "1 (client error: ...)", "-")."""
    head = str(cell or "-").split(" ", 1)[0]
    return int(head) if head.isdigit() else 0


def tails(dep: Deployment, run: FlwrRun | None) -> str:
    """The node, link and run log tails: what a stall report needs."""
    out = [p.tail(20) for p in dep.procs]
    if run is not None:
        out.append("    run| " + "\n    run| ".join(run.text().splitlines()[-30:]))
    return "\n".join(out)


@pytest.mark.slow
def test_a_browser_sees_a_tls_deployments_late_refused_and_hung_nodes(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright "
                                   "(pyproject's dev extras)")
    exe = chromium()
    t0 = time.monotonic()
    dep = Deployment(tmp_path / "deploy", CLIENTS + 1, base_port=BASE_PORT,
                     num_partitions=CLIENTS)
    child_pid_file = tmp_path / "hung-child.pid"
    app = fault_app(tmp_path / "app", hang_at(HANG_ROUND, HUNG, child_pid_file))
    out = tmp_path / "out"
    run: FlwrRun | None = None
    server = None
    urls: list[str] = []
    seen: list[tuple[int, int]] = []  # (points on the page, rows on disk just after)
    on_file: dict[str, float] = {}  # event -> when the test first saw it in the files/log
    on_page: dict[str, float] = {}  # event -> when the page first showed it
    first_look: dict[str, dict[str, Any]] = {}
    nodes: dict[str, dict[str, Any]] = {}  # the page's last look at the fleet
    try:
        dep.up(start=[0, 1])
        registry = json.loads(dep.registry.read_text())
        node_of = {i: int(n) for n, i in registry.items()}
        del registry[str(node_of[WRONG])]  # registered with the SuperLink, no client of the run
        dep.registry.write_text(json.dumps(registry))
        late, wrong, hung = (str(node_of[i]) for i in (LATE, WRONG, HUNG))
        cfg = {"method": "fedavg", "num-clients": CLIENTS, "min-clients": 2,
               "fraction-train": 1.0, "num-server-rounds": ROUNDS, "train-limit": 300,
               "local-epochs": 1, "seed": 0, "personal-eval-every": 0,
               "node-wait-timeout": 60.0, "round-timeout": TIMEOUT,
               "node-registry": str(dep.registry), "output-dir": str(out)}
        run = FlwrRun(dep, "run", cfg, app)
        run.run_id()
        deadline = time.monotonic() + 180
        while not list(out.glob(f"*/{STATUS_FILE}")):  # the run started on nodes 0 and 1
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

        server = make_server(run_dir, port=BASE_PORT + 50, refresh=1)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, headless=True, args=FLAGS)
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.on("request", lambda r: urls.append(r.url))
            page.goto(f"http://127.0.0.1:{BASE_PORT + 50}/")
            deadline = time.monotonic() + WAIT_SECONDS
            while True:
                now = time.monotonic()
                rows = rows_of(run_dir)
                files = {
                    "late": status_nodes(run_dir).get(int(late), {}).get("state")
                    == "identified",
                    "refused": f"refused node {wrong}: it has num-partitions=7" in run.text(),
                    "hung": any(r["round"] == HANG_ROUND and r["num-missing"]
                                + r["num-rejected"] >= 1 for r in rows)}
                for event, there in files.items():
                    if there:
                        on_file.setdefault(event, now)
                try:  # one look at one document: a reload in between cannot mix two
                    look = page.evaluate(LOOK)
                except sync_api.Error:  # the page is being reloaded (meta refresh)
                    continue
                if not look["loaded"]:
                    page.wait_for_timeout(100)
                    continue
                nodes = look["nodes"]
                for node, cells in nodes.items():
                    first_look.setdefault(node, cells)
                shown = {
                    "late": nodes.get(late, {}).get("state") == "identified"
                    and nodes[late]["connected"] == "yes",
                    "refused": nodes.get(wrong, {}).get("state") == "refused"
                    and "num-partitions=7" in nodes[wrong]["reason"],
                    "hung": count(nodes.get(hung, {}).get(TIMED_OUT))
                    + count(nodes.get(hung, {}).get("rejected")) >= 1}
                for event, there in shown.items():
                    if there:
                        on_page.setdefault(event, time.monotonic())
                points = int(look["points"])
                seen.append((points, len(rows_of(run_dir))))
                trained_late = [r["round"] for r in rows if LATE in r["clients-trained"]]
                if len(on_page) == len(shown) and trained_late and points > trained_late[0]:
                    break
                if now > deadline or run.popen.poll() is not None:
                    pytest.fail(f"stalled: on the page {sorted(on_page)}, in the files "
                                f"{sorted(on_file)}, {points} points, {len(rows)} rows\n"
                                + tails(dep, run))
                page.wait_for_timeout(250)
            if os.environ.get("FEDINIT_SCREENSHOTS") == "1":
                page.screenshot(path=str(SCREENSHOT), full_page=True)
            browser.close()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if run is not None:
            run.stop()
        dep.stop()
        stop_pids(pids_mentioning(str(tmp_path)))
    lag = {e: round(on_page[e] - on_file[e], 2) for e in on_file if e in on_page}
    counts = [p for p, _ in seen]
    print(json.dumps({"dashboard-deploy-seconds": round(time.monotonic() - t0, 1),
                      "page-minus-file-seconds": lag, "requests": len(urls),
                      "counts-seen": sorted(set(counts)),
                      "late-node-first-seen": first_look.get(late, {}).get("state")}))
    assert set(on_file) == {"late", "refused", "hung"}, on_file  # the events happened
    assert child_pid_file.exists(), "the hang was never reached"
    assert all(lag[e] <= EVENT_SECONDS for e in on_file), lag
    # Before it connected, the late node was listed from node-registry, not connected.
    assert first_look[late]["state"] == "registered", first_look[late]
    assert first_look[late]["connected"] == "no", first_look[late]
    # The refused node is connected (authenticated by the SuperLink), just no client.
    assert (nodes[wrong]["connected"], nodes[late]["connected"]) == ("yes", "yes"), nodes
    assert counts == sorted(counts), counts  # the curve only grows
    assert all(p <= n for p, n in seen)  # a point is a written row
    assert sorted(set(counts)) == list(range(min(counts), max(counts) + 1)), counts
    assert max(counts) >= HANG_ROUND + 1
    assert urls and all(urlsplit(u).hostname == "127.0.0.1" for u in urls), urls
