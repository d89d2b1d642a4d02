"""``fedinit-dashboard --metrics``: the fleet page's figures in Prometheus' text format, scraped
over HTTP from a status file the ServerApp's own writer wrote (the faulty fleet of
tests/test_dashboard.py and a DP run), parsed with prometheus_client's own parser."""

from __future__ import annotations

import http.client
import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedinit.cli.dashboard import make_server
from fedinit.cli.dashboard_metrics import NODE_STATES, Families, add_run
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app.experiment import run_experiment
from server_app.status import STATUS_FILE
from tests import test_dashboard
from tests.test_dashboard import rows_of, status_of
from tests.test_fleet import SMALL

pytestmark = pytest.mark.usefixtures("quick_runs")  # no test here reads a plot

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]
faulty_run = test_dashboard.faulty_run
"""The faulty fleet's run (late, refused, silent, failing and dropped nodes), shared."""
PER_NODE_TASKS = ("fedinit_node_tasks_total", "fedinit_node_rejected_replies_total",
                  "fedinit_node_train_seconds", "fedinit_node_last_seen_timestamp_seconds")


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory: pytest.TempPathFactory, quick_runs: None) -> Path:
    tmp = tmp_path_factory.mktemp("dp")
    raw = {**SMALL, "num-server-rounds": 3, "fraction-train": 0.67, "dp": "central",
           "weighting": "uniform", "dp-clip": 0.05, "dp-target-epsilon": 500.0,
           "output-dir": str(tmp)}
    run_experiment(InProcessGrid(3, raw), RunConfig.parse(raw), out_dir=tmp / "run")
    return tmp / "run"


@contextmanager
def serving(root: Path, metrics: bool = True) -> Iterator[tuple[str, int]]:
    server = make_server(root, port=0, metrics=metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield str(host), int(port)
    finally:
        server.shutdown()
        server.server_close()


def fetch(addr: tuple[str, int], method: str = "GET",
          path: str = "/metrics") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection(*addr, timeout=5)
    conn.putrequest(method, path, skip_accept_encoding=True)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode(errors="replace")
    conn.close()
    return resp.status, resp.getheader("Content-Type", ""), body


def scrape(addr: tuple[str, int]) -> tuple[Series, dict[str, tuple[str, str]]]:
    """{(sample name, sorted labels): value} and {family: (type, help)} of one scrape."""
    code, kind, text = fetch(addr)
    assert code == 200 and kind.startswith("text/plain; version=0.0.4"), (code, kind)
    series: Series = {}
    families = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith("fedinit_") and fam.documentation, fam.name
        families[fam.name] = (fam.type, fam.documentation)
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in series, key  # one sample per series
            series[key] = s.value
    return series, families


def expected(run: str, path: Path) -> Series:
    """What the scrape must say of one run: each figure as status.json and the rows hold it,
    derived here from the files (not from the collector)."""
    status, rows = status_of(path), rows_of(path)
    info, fleet, last = status["run"], status["fleet"], rows[-1]
    private = info["dp"] != "off"
    out: Series = {}

    def put(name: str, value: Any, **labels: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            lab = {"run": run, **{k: "" if v is None else str(v) for k, v in labels.items()}}
            out[(name, tuple(sorted(lab.items())))] = float(value)

    put("fedinit_run_info", 1, state=info["state"], method=info["method"], dp=info["dp"],
        eval_source=info["eval-source"], rounds_mode="sync")
    def put_all(source: dict[str, Any], names: dict[str, str], **labels: Any) -> None:
        for name, key in names.items():  # a field the file withholds (DP) gives no series
            put(name, source.get(key), **labels)

    put("fedinit_status_written_timestamp_seconds", status["written"])
    put_all(info, {"fedinit_round": "round", "fedinit_rounds_planned": "rounds",
                   "fedinit_run_elapsed_seconds": "elapsed-seconds",
                   "fedinit_round_seconds": "round-seconds",
                   "fedinit_round_collect_seconds": "collect-seconds"})
    tested = [r for r in rows if r.get("test-acc") is not None][-1]
    put_all(tested, {"fedinit_test_accuracy_ratio": "test-acc", "fedinit_test_loss": "test-loss",
                     "fedinit_test_round": "round"})
    if private:
        put_all(info, {"fedinit_dp_epsilon": "dp-epsilon",
                       "fedinit_dp_target_epsilon": "dp-target-epsilon",
                       "fedinit_dp_delta": "dp-delta"})
    put_all(last, {"fedinit_round_replies": "num-replies", "fedinit_round_rejected": "num-rejected",
                   "fedinit_round_missing": "num-missing"})
    put_all(fleet, {"fedinit_fleet_clients": "num-clients",
                    "fedinit_fleet_identified": "identified"})
    for outcome, count in fleet["totals"].items():
        put("fedinit_tasks_total", count, outcome=outcome)
    for reason, count in fleet["rejected-by-reason"].items():
        put("fedinit_rejected_replies_total", count, reason=reason)
    for n in fleet["nodes"]:
        node = {"node": n["node"], "client": n["client"]}
        for state in NODE_STATES:
            put("fedinit_node_state", int(n["state"] == state), **node, state=state)
        if "connected" in n:  # withheld under DP
            put("fedinit_node_connected", int(n["connected"]), **node)
        put_all(n, {"fedinit_node_last_connected_timestamp_seconds": "last-connected",
                    "fedinit_node_identity_seen_timestamp_seconds": "identity-seen",
                    "fedinit_node_waiting_seconds": "waiting-seconds"}, **node)
        if private:
            continue
        put("fedinit_node_last_seen_timestamp_seconds", n["last-seen"], **node)
        for outcome, count in n["tasks"].items():
            put("fedinit_node_tasks_total", count, **node, outcome=outcome)
        for reason, count in n["rejected-reasons"].items():
            put("fedinit_node_rejected_replies_total", count, **node, reason=reason)
        put("fedinit_node_train_seconds", n["train-seconds"], **node)
    return out


def value(series: Series, name: str, **labels: str) -> float:
    return series[(name, tuple(sorted(labels.items())))]


def test_every_figure_equals_the_status_file_and_the_rows(faulty_run: Any) -> None:
    run, _ = faulty_run
    with serving(run.parent) as addr:  # an output directory: series labelled by run
        series, families = scrape(addr)
    assert series == expected("run", run)  # every figure, and nothing else
    # ...and the figures are the fleet's real ones (tests/test_dashboard.py's faults).
    n1001 = {"run": "run", "node": "1001", "client": "1"}
    assert value(series, "fedinit_node_tasks_total", **n1001, outcome="sent") == 4
    assert value(series, "fedinit_node_rejected_replies_total", **n1001,
                 reason="client error: RuntimeError: disk full") == 1
    assert value(series, "fedinit_node_state", run="run", node="5555", client="",
                 state="refused") == 1
    assert value(series, "fedinit_node_state", run="run", node="7777", client="",
                 state="waiting-for-identity") == 1
    assert value(series, "fedinit_round", run="run") == 4
    assert value(series, "fedinit_tasks_total", run="run", outcome="missing") == 1
    assert families["fedinit_tasks"][0] == families["fedinit_node_tasks"][0] == "counter"
    assert families["fedinit_round_seconds"][0] == "gauge"
    assert not any(name.startswith("fedinit_dp_") for name, _ in series)


def test_under_dp_no_per_node_task_series_exist(dp_run: Path) -> None:
    with serving(dp_run) as addr:  # a run directory itself: labelled by its name
        series, _ = scrape(addr)
    assert series == expected("run", dp_run)
    assert not {name for name, _ in series} & set(PER_NODE_TASKS)
    # nothing that counts or times a round's replies, nor who is connected: with both, how
    # many connected clients the secret sample held (server_app/public_rows.py)
    assert not {name for name, _ in series} & {
        "fedinit_round_replies", "fedinit_round_rejected", "fedinit_round_missing",
        "fedinit_tasks_total", "fedinit_rejected_replies_total", "fedinit_node_connected",
        "fedinit_round_seconds", "fedinit_round_collect_seconds"}
    status = status_of(dp_run)
    assert value(series, "fedinit_dp_epsilon", run="run") == status["run"]["dp-epsilon"] > 0
    assert value(series, "fedinit_dp_target_epsilon", run="run") == 500.0
    nodes = {dict(labels)["node"] for name, labels in series if name == "fedinit_node_state"}
    assert nodes == {str(n["node"]) for n in status["fleet"]["nodes"]} and len(nodes) == 3


def test_under_dp_a_file_holding_per_node_tasks_still_gives_none(
        dp_run: Path, tmp_path: Path) -> None:
    """Never more than the writer writes under DP, even from a doctored or older file."""
    for name in (STATUS_FILE, "rounds.jsonl", "config.json"):
        shutil.copy(dp_run / name, tmp_path / name)
    status = status_of(dp_run)
    status["fleet"]["per-node-tasks"] = "written"
    for n in status["fleet"]["nodes"]:
        n.update({"tasks": {"sent": 3, "replied": 3, "rejected": 0, "missing": 0},
                  "train-seconds": 1.0, "last-seen": 1.0, "rejected-reasons": {"x": 1}})
    (tmp_path / STATUS_FILE).write_text(json.dumps(status))
    out = Families()
    add_run(out, "run", tmp_path)
    names = {s.name for fam in out for s in fam.samples}
    assert "fedinit_node_state" in names and not names & set(PER_NODE_TASKS)


def test_a_sweep_labels_each_run(faulty_run: Any, dp_run: Path, tmp_path: Path) -> None:
    run, _ = faulty_run
    for cell, src in (("a", run), ("b", dp_run)):
        (tmp_path / "cells" / cell / "run").mkdir(parents=True)
        for name in (STATUS_FILE, "rounds.jsonl", "config.json"):
            shutil.copy(src / name, tmp_path / "cells" / cell / "run" / name)
    with serving(tmp_path) as addr:
        series, _ = scrape(addr)
    assert series == {**expected("cells/a/run", run), **expected("cells/b/run", dp_run)}


def test_a_run_without_a_status_file_gives_its_rows(tmp_path: Path) -> None:
    """rounds=async writes no status.json: the round (its model version) from the rows."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"rounds": "async", "num-server-rounds": 5, "method": "fedavg", "dp": "off"}))
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"round": 1, "test-acc": 0.5, "test-loss": 1.5, "num-replies": 2},
        {"round": 2, "test-acc": None, "num-replies": 3, "round-seconds": 0.25})))
    out = Families()
    add_run(out, "r", tmp_path)
    got = {(s.name, s.labels.get("rounds_mode")): s.value for fam in out for s in fam.samples}
    assert got == {("fedinit_run_info", "async"): 1, ("fedinit_round", None): 2,
                   ("fedinit_rounds_planned", None): 5, ("fedinit_round_seconds", None): 0.25,
                   ("fedinit_test_accuracy_ratio", None): 0.5, ("fedinit_test_loss", None): 1.5,
                   ("fedinit_test_round", None): 1, ("fedinit_round_replies", None): 3}


# ---------------------------------------------------------------- the page's rules
def test_metrics_is_404_without_the_flag(faulty_run: Any) -> None:
    run, _ = faulty_run
    with serving(run.parent, metrics=False) as addr:
        assert fetch(addr)[0] == 404
        assert fetch(addr, path="/run/")[0] == 200  # the page itself is there


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "BREW"])
def test_metrics_answers_get_and_head_only(faulty_run: Any, method: str) -> None:
    run, _ = faulty_run
    with serving(run.parent) as addr:
        assert fetch(addr, method)[0] == 405
        code, kind, body = fetch(addr, "HEAD")
        assert (code, body) == (200, "") and kind.startswith("text/plain")


@pytest.mark.parametrize("path", [
    "/metrics/../", "/metrics/../run/status.json", "/metrics/..%2f..%2fetc/passwd",
    "/metrics/%2e%2e/run/checkpoint.npz", "/metrics/", "/run/metrics", "/metrics%00",
    "/metrics\\..\\run\\checkpoint.npz", "//metrics/../../etc/passwd",
])
def test_no_path_beside_metrics_reaches_anything(faulty_run: Any, path: str) -> None:
    run, _ = faulty_run
    with serving(run.parent) as addr:
        code, _, body = fetch(addr, path=path)
    assert code in (400, 403, 404), (path, code)
    assert "fedinit_" not in body and "root:" not in body and "PK" not in body[:4]


def test_the_scrape_bench_runs_and_prints_one_line_per_fleet(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.dashboard_scrape import main
    assert main(["--nodes", "3", "5", "--rounds", "2", "--repeat", "1", "--dp", "central"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[2].split()[0] == "3" and lines[3].split()[0] == "5"
    # two more nodes, seven series each under DP (six states, identity answered): no tasks,
    # no connected (server_app/status.py)
    assert int(lines[3].split()[-1]) - int(lines[2].split()[-1]) == 2 * 7
