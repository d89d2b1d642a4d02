"""The live fleet page: the status file a run writes (server_app/status.py) and the read-only
page that shows it (fedinit/cli/dashboard.py), on small in-process runs with late, refused,
silent, failing and dropped nodes."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Error, Message, MessageType

from fedinit.cli.dashboard import main, make_server, run_body, run_facts
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app import clients
from server_app.experiment import run_experiment
from server_app.status import STATUS_FILE
from tests.test_fleet import SMALL, ChangingGrid

pytestmark = pytest.mark.usefixtures("quick_runs")  # 1,000 central test images, no plots

FAILING_ROUND, DROPPED_ROUND = 2, 3


def rows_of(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()]


class Faults:
    """Replies as a faulty fleet gives them: 7777 never answers its identity query, node
    1001's round-2 train task fails (an error reply), node 1000's round-3 reply never comes."""

    def __init__(self) -> None:
        self.train_round: Counter[int] = Counter()

    def __call__(self, reply: Message) -> Message | None:
        node = reply.metadata.src_node_id
        kind = reply.metadata.message_type
        if kind == MessageType.QUERY:
            return None if node == 7777 else reply
        if kind != MessageType.TRAIN:
            return reply
        self.train_round[node] += 1
        if node == 1001 and self.train_round[node] == FAILING_ROUND:
            return Message(Error(code=1, reason="Traceback ...\nRuntimeError: disk full"),
                           reply_to=_request(reply))
        if node == 1000 and self.train_round[node] == DROPPED_ROUND:
            return None
        return reply


def _request(reply: Message) -> Message:
    """A stand-in for the train message a reply answers (only its routing is used)."""
    msg = Message(content=reply.content, message_type=MessageType.TRAIN,
                  dst_node_id=reply.metadata.src_node_id)
    msg.metadata.__dict__["_message_id"] = reply.metadata.reply_to_message_id
    return msg


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, InProcessGrid]:
    tmp = tmp_path_factory.mktemp("fleet")
    mp = pytest.MonkeyPatch()
    mp.setattr(clients, "RETRY_SECONDS", 0.0)
    mp.setattr(clients, "IDENTITY_WAIT_SECONDS", 0.0)
    raw = {**SMALL, "num-server-rounds": 4, "min-clients": 2, "output-dir": str(tmp)}
    grid = ChangingGrid(raw)
    grid.reply_filter = Faults()
    try:
        run_experiment(grid, RunConfig.parse(raw), out_dir=tmp / "run")
    finally:
        mp.undo()
    return tmp / "run", grid


def status_of(run: Path) -> dict[str, Any]:
    return json.loads((run / STATUS_FILE).read_text())


def test_the_status_file_names_every_node_with_its_client_state_and_counts(
        faulty_run: tuple[Path, InProcessGrid]) -> None:
    run, grid = faulty_run
    status = status_of(run)
    assert status["run"]["state"] == "done" and status["run"]["round"] == 4
    assert status["run"]["rounds"] == 4 and status["run"]["eval-source"] == "central"
    nodes = {n["node"]: n for n in status["fleet"]["nodes"]}
    assert set(nodes) == {1000, 1001, 1002, 5555, 6666, 7777}
    for node, client in ((1000, 0), (1001, 1), (1002, 2)):
        assert (nodes[node]["client"], nodes[node]["state"]) == (client, "identified")
    assert nodes[5555]["state"] == "refused" and nodes[5555]["client"] is None
    assert nodes[5555]["reason"] == "it has num-partitions=7 but num-clients=3"
    assert nodes[6666]["state"] == "refused-retrying"
    assert nodes[6666]["reason"] == ("the identity query failed: ValueError: invalid literal "
                                     "for int() with base 10: 'not a number'")
    assert nodes[7777]["state"] == "waiting-for-identity" and nodes[7777]["reason"] is None

    # Counts, from what the grid really carried (not from the server's own bookkeeping).
    sent = Counter(m.metadata.dst_node_id for m in grid.sent
                   if m.metadata.message_type == MessageType.TRAIN)
    assert {n: nodes[n]["tasks"]["sent"] for n in sent} == dict(sent)
    assert sent == {1000: 4, 1001: 4, 1002: 2}
    assert nodes[1001]["tasks"] == {"sent": 4, "replied": 3, "rejected": 1, "missing": 0}
    assert nodes[1001]["rejected-reasons"] == {"client error: RuntimeError: disk full": 1}
    assert nodes[1000]["tasks"] == {"sent": 4, "replied": 3, "rejected": 0, "missing": 1}
    assert nodes[1002]["tasks"] == {"sent": 2, "replied": 2, "rejected": 0, "missing": 0}
    assert nodes[1002]["rounds"] == [3, 4] and nodes[1000]["rounds"] == [1, 2, 3, 4]
    assert isinstance(nodes[1002]["train-seconds"], float) and nodes[1002]["train-seconds"] > 0

    # ...and they add up to the rows.
    rows = rows_of(run)
    totals = status["fleet"]["totals"]
    assert totals["replied"] == sum(r["num-replies"] for r in rows) == 8
    assert totals["rejected"] == sum(r["num-rejected"] for r in rows) == 1
    assert totals["missing"] == sum(r["num-missing"] for r in rows) == 1
    assert totals["sent"] == sum(sent.values())
    assert status["fleet"]["rejected-by-reason"] == {"client error: RuntimeError: disk full": 1}


def test_under_dp_the_status_file_holds_no_per_client_participation(tmp_path: Path) -> None:
    raw = {**SMALL, "num-server-rounds": 3, "fraction-train": 0.67, "dp": "central",
           "weighting": "uniform", "dp-clip": 0.05, "dp-target-epsilon": 500.0,
           "output-dir": str(tmp_path)}
    grid = InProcessGrid(3, raw)
    run_experiment(grid, RunConfig.parse(raw), out_dir=tmp_path / "run")
    status = status_of(tmp_path / "run")
    rows = rows_of(tmp_path / "run")
    assert status["run"]["dp"] == "central"
    assert status["run"]["dp-epsilon"] == rows[-1]["dp-epsilon"] > 0
    assert status["run"]["dp-target-epsilon"] == 500.0
    assert status["fleet"]["per-node-tasks"].startswith("withheld under dp=central")
    for node in status["fleet"]["nodes"]:
        assert node["state"] == "identified"
        assert not {"tasks", "rounds", "train-seconds", "last-seen",
                    "rejected-reasons", "connected", "last-connected"} & set(node)
    # rewritten each round, any total is a round's count: none (server_app/status.py)
    assert status["fleet"]["totals"] == {} and status["fleet"]["rejected-by-reason"] == {}
    assert status["run"]["round-seconds"] is None and status["run"]["elapsed-seconds"] is None
    body = run_body("run", run_facts(tmp_path / "run"), status["written"])
    assert 'id="dp-note"' in body and "withheld under dp=central" in body  # the page says so
    assert "participation" not in body.split('id="fleet"')[1].split("</table>")[0]
    eps = re.search(r'<svg class="curve" data-key="dp-epsilon".*?</svg>', body)
    assert eps is not None and eps.group(0).count('<circle class="pt"') == 3
    assert 'class="target"' in eps.group(0)  # the budget line


# ---------------------------------------------------------------- the page
@pytest.fixture(scope="module")
def page(faulty_run: tuple[Path, InProcessGrid]) -> Iterator[tuple[str, int]]:
    run, _ = faulty_run
    (run / "checkpoint.npz").exists() or pytest.fail("the run wrote no checkpoint")
    server = make_server(run.parent, port=0)  # the output directory: a sweep of one run
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield str(host), int(port)
    server.shutdown()
    server.server_close()


def request(addr: tuple[str, int], method: str, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(*addr, timeout=5)
    conn.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode(errors="replace")
    conn.close()
    return resp.status, body


def test_the_page_shows_the_fleet_and_one_point_per_row(
        page: tuple[str, int], faulty_run: tuple[Path, InProcessGrid]) -> None:
    run, _ = faulty_run
    code, sweep = request(page, "GET", "/")
    assert code == 200 and 'href="/run/"' in sweep and "<td>done</td>" in sweep
    code, body = request(page, "GET", "/run/")
    assert code == 200
    assert 'id="fleet"' in body and "http://" not in body.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # nothing to load from anywhere
    for node, state in ((5555, "refused"), (7777, "waiting-for-identity"),
                        (1002, "identified")):
        assert re.search(rf'<tr class="{state}" data-node="{node}" data-connected="yes">',
                         body)
    assert "it has num-partitions=7 but num-clients=3" in body
    assert "client error: RuntimeError: disk full" in body
    rows = rows_of(run)
    acc = re.search(r'<svg class="curve" data-key="test-acc".*?</svg>', body)
    assert acc is not None
    assert acc.group(0).count('<circle class="pt"') == len(rows) == 4
    code, status = request(page, "GET", "/run/status.json")
    assert code == 200 and json.loads(status) == status_of(run)
    assert request(page, "GET", "/run/rounds.jsonl") == (
        200, (run / "rounds.jsonl").read_text())
    assert request(page, "HEAD", "/run/")[0] == 200


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "BREW"])
def test_every_method_but_get_and_head_is_405(page: tuple[str, int], method: str) -> None:
    assert request(page, method, "/run/")[0] == 405


@pytest.mark.parametrize("path", [
    "/run/checkpoint.npz", "/run/client-state/", "/run/config.json",
    "/../run/status.json", "/run/../run/status.json", "/%2e%2e/%2e%2e/etc/passwd",
    "/run/%2e%2e/run/status.json", "/run/..%2fcheckpoint.npz", "//etc/passwd",
    "/etc/passwd", "http://127.0.0.1/run/status.json", "/run%00/status.json",
    "/run\\..\\checkpoint.npz",
])
def test_nothing_else_is_served(page: tuple[str, int], path: str) -> None:
    code, body = request(page, "GET", path)
    assert code in (400, 403, 404), (path, code)
    assert "root:" not in body and "PK" not in body[:4]


@pytest.mark.parametrize("argv, want", [
    (["/no/such/dir"], "'/no/such/dir' is not a directory"),
    (["{tmp}", "--port", "70000"], "--port=70000 is not allowed: 0..65535"),
    (["{tmp}", "--refresh", "-1"], "--refresh=-1 is not allowed"),
])
def test_bad_arguments_get_one_line_naming_the_value(
        argv: list[str], want: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main([a.format(tmp=tmp_path) for a in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert want in err


# ---------------------------------------------------------------- connected or not
class LeavingGrid(InProcessGrid):
    """Nodes 1000 and 1001 connected, 1002 registered but never connecting; 1001 leaves
    (drops out of ``get_node_ids``, as the SuperLink drops a node that missed its
    heartbeats) right after round 2's training."""

    def __init__(self, run_config: dict[str, Any]) -> None:
        super().__init__(3, run_config)
        self.contexts.pop(1002)
        self.trained = 0
        self.gone_at = 0.0

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        msgs = list(messages)
        out = super().send_and_receive(msgs, timeout=timeout)
        if msgs and msgs[0].metadata.message_type == MessageType.TRAIN:
            self.trained += 1
            if self.trained == 2:
                self.contexts.pop(1001)
                self.gone_at = time.time()
        return out


def test_the_status_file_and_the_page_say_which_registered_nodes_are_connected(
        tmp_path: Path) -> None:
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps({"1000": 0, "1001": 1, "1002": 2}))
    raw = {**SMALL, "num-server-rounds": 4, "min-clients": 2, "node-registry": str(registry),
           "output-dir": str(tmp_path)}
    grid = LeavingGrid(raw)
    t0 = time.time()
    run_experiment(grid, RunConfig.parse(raw), out_dir=tmp_path / "run")
    status = status_of(tmp_path / "run")
    nodes = {n["node"]: n for n in status["fleet"]["nodes"]}
    assert set(nodes) == {1000, 1001, 1002}  # the registry's nodes, connected or not
    assert [nodes[n]["connected"] for n in (1000, 1001, 1002)] == [True, False, False]
    assert nodes[1001]["state"] == "identified" and nodes[1001]["client"] == 1
    assert t0 < nodes[1001]["last-connected"] <= grid.gone_at < nodes[1000]["last-connected"]
    assert nodes[1002]["state"] == "registered" and nodes[1002]["client"] is None
    assert nodes[1002]["registered-client"] == 2 and nodes[1002]["last-connected"] is None
    assert nodes[1001]["tasks"]["sent"] == 2  # not sampled once it was gone
    body = run_body("run", run_facts(tmp_path / "run"), status["written"])
    assert '<tr class="identified" data-node="1000" data-connected="yes">' in body
    assert '<tr class="identified" data-node="1001" data-connected="no">' in body
    assert re.search(r'data-node="1002" data-connected="no"><td>1002</td>'
                     r'<td>\(2 registered\)</td><td>registered</td><td>no</td>', body)
    assert re.search(r'data-node="1001" data-connected="no"><td>1001</td><td>1</td>'
                     r'<td>identified</td><td>no \(last \d+ s ago\)</td>', body)
