"""The fleet page's figures in Prometheus' text format: ``fedinit-dashboard RUN --metrics``.

A ``prometheus_client`` collector on a private registry (never the library's global one, so no
process or Python metrics of the dashboard itself leak in): each scrape finds the runs, reads
each run's latest ``status.json``, ``rounds.jsonl`` and ``config.json`` as the page does
(fedinit/cli/dashboard.py ``run_facts``), and yields metric families. No background thread, no
cache: a scrape costs what a page load costs.

What is exported is what the page shows, nothing more. Per node, only what ``status.json``
holds: under DP (``dp`` != off) the status file withholds every per-node task count, train
time and last reply (docs/faults.md, "What each DP mode shows"), so no ``fedinit_node_tasks``,
``fedinit_node_rejected_replies``, ``fedinit_node_train_seconds`` or
``fedinit_node_last_seen_timestamp_seconds`` series exist then, even were the file to hold
them. Round figures come from the run's rows, which are public files in every mode. Every
series has a ``run`` label: the run's path under the served directory (a sweep's
``cells/<cell>/<run>``), or the run directory's name when it was given itself.

Counters (``_total``) count since the ServerApp process started: a resumed run's counts start
again at the resume, which Prometheus reads as a counter reset.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fedinit.cli.run_dirs import ROWS_FILE, find_runs, read_rows
from fedinit.cli.run_files import read_json
from server_app.status import STATUS_FILE

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The text format ``generate_latest`` writes (every Prometheus reads it)."""
NODE_STATES = ("identified", "waiting-for-identity", "refused", "refused-retrying",
               "registered", "unknown")
"""The node states status.json writes (server_app/status.py ``_node``)."""
NODE = ("node", "client")
OUTCOMES = ("sent", "replied", "rejected", "missing")

SPECS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # name: (type, help, labels after ``run``)
    "fedinit_run_info": ("gauge", "The run: its state (running, done; no status file: a run "
                         "that writes none, e.g. rounds=async), method, dp mode, evaluation "
                         "source and rounds mode (sync, async); always 1",
                         ("state", "method", "dp", "eval_source", "rounds_mode")),
    "fedinit_status_written_timestamp_seconds": (
        "gauge", "When the ServerApp last wrote status.json (Unix time)", ()),
    "fedinit_round": ("gauge", "The last finished round (rounds=async: the model version)",
                      ()),
    "fedinit_rounds_planned": ("gauge", "num-server-rounds: the rounds (async: versions) the "
                               "run is to run", ()),
    "fedinit_run_elapsed_seconds": ("gauge", "The run's wall time at its last round", ()),
    "fedinit_round_seconds": ("gauge", "The last round's wall time", ()),
    "fedinit_round_collect_seconds": ("gauge", "Of the last round's wall time, the wait for "
                                      "replies", ()),
    "fedinit_test_accuracy_ratio": ("gauge", "Test accuracy (0..1) of the last evaluated round",
                                    ()),
    "fedinit_test_loss": ("gauge", "Test loss of the last evaluated round", ()),
    "fedinit_test_round": ("gauge", "The round fedinit_test_accuracy_ratio and "
                           "fedinit_test_loss are from", ()),
    "fedinit_dp_epsilon": ("gauge", "DP epsilon spent so far (replace-one)", ()),
    "fedinit_dp_target_epsilon": ("gauge", "dp-target-epsilon: the run's epsilon budget", ()),
    "fedinit_dp_delta": ("gauge", "dp-delta of the DP guarantee", ()),
    "fedinit_round_replies": ("gauge", "Usable train replies of the last round (num-replies)",
                              ()),
    "fedinit_round_rejected": ("gauge", "Rejected train replies of the last round "
                               "(num-rejected)", ()),
    "fedinit_round_missing": ("gauge", "Train tasks of the last round without a reply "
                              "(num-missing)", ()),
    "fedinit_fleet_clients": ("gauge", "num-clients: the clients of the federation", ()),
    "fedinit_fleet_identified": ("gauge", "Clients held by an identified node", ()),
    "fedinit_tasks": ("counter", "Train tasks of this ServerApp process by outcome (sent, "
                      "replied, rejected, missing)", ("outcome",)),
    "fedinit_rejected_replies": ("counter", "Rejected train replies of this ServerApp process "
                                 "by reason (under DP: the reason's kind only)", ("reason",)),
    "fedinit_node_state": ("gauge", "1 for the node's state, 0 for the others (identified, "
                           "waiting-for-identity, refused, refused-retrying, registered, "
                           "unknown); client "
                           "is empty while the node holds none", (*NODE, "state")),
    "fedinit_node_connected": ("gauge", "1 while the SuperLink lists the node as connected "
                               "(Grid.get_node_ids as the round last asked it), else 0",
                               NODE),
    "fedinit_node_last_connected_timestamp_seconds": (
        "gauge", "When the SuperLink last listed the node as connected (Unix time)", NODE),
    "fedinit_node_identity_seen_timestamp_seconds": (
        "gauge", "When the node last answered its identity query (Unix time)", NODE),
    "fedinit_node_waiting_seconds": ("gauge", "How long the node's identity query has gone "
                                     "unanswered (waiting-for-identity only)", NODE),
    "fedinit_node_last_seen_timestamp_seconds": (
        "gauge", "When the node last answered (identity or train reply; Unix time; off DP only)",
        NODE),
    "fedinit_node_tasks": ("counter", "The node's train tasks of this ServerApp process by "
                           "outcome (off DP only)", (*NODE, "outcome")),
    "fedinit_node_rejected_replies": ("counter", "The node's rejected train replies by reason "
                                      "(off DP only)", (*NODE, "reason")),
    "fedinit_node_train_seconds": ("gauge", "The node's last train task's compute time (off DP "
                                   "only)", NODE),
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _label(value: Any) -> str:
    return "" if value is None else str(value)


class Families:
    """One scrape's metric families, made on first use, each yielded once."""

    def __init__(self) -> None:
        self.made: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, name: str, run: str, value: Any, *labels: Any) -> None:
        """One sample; skipped when ``value`` is no finite number (a figure not there yet)."""
        number = _number(value)
        if number is None:
            return
        kind, doc, names = SPECS[name]
        if name not in self.made:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            self.made[name] = cls(name, doc, labels=["run", *names])
        self.made[name].add_metric([run, *map(_label, labels)], number)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self.made[name] for name in SPECS if name in self.made)


def add_run(out: Families, run: str, path: Path) -> None:
    """One run's samples: what its status.json, rows and config say now."""
    status = read_json(path / STATUS_FILE) or {}
    rows = read_rows(path / ROWS_FILE)
    config = read_json(path / "config.json") or {}
    info = dict(status.get("run") or {})
    last = rows[-1] if rows else {}
    state = info.get("state") or ("done" if (path / "summary.json").is_file()
                                  else "no status file")
    dp = str(info.get("dp") or config.get("dp") or "off")
    out.add("fedinit_run_info", run, 1, state, info.get("method") or config.get("method"), dp,
            info.get("eval-source") or config.get("evaluation"), config.get("rounds", "sync"))
    out.add("fedinit_status_written_timestamp_seconds", run, status.get("written"))
    out.add("fedinit_round", run, info["round"] if "round" in info else last.get("round", 0))
    out.add("fedinit_rounds_planned", run, info.get("rounds", config.get("num-server-rounds")))
    for name, key in (("fedinit_run_elapsed_seconds", "elapsed-seconds"),
                      ("fedinit_round_seconds", "round-seconds"),
                      ("fedinit_round_collect_seconds", "collect-seconds")):
        out.add(name, run, info.get(key) if status else last.get(key))
    evaluated = next((r for r in reversed(rows) if _number(r.get("test-acc")) is not None), None)
    if evaluated is not None:
        out.add("fedinit_test_accuracy_ratio", run, evaluated["test-acc"])
        out.add("fedinit_test_loss", run, evaluated.get("test-loss"))
        out.add("fedinit_test_round", run, evaluated.get("round"))
    if dp != "off":
        out.add("fedinit_dp_epsilon", run, info.get("dp-epsilon", last.get("dp-epsilon")))
        out.add("fedinit_dp_target_epsilon", run,
                info.get("dp-target-epsilon", config.get("dp-target-epsilon")))
        out.add("fedinit_dp_delta", run, info.get("dp-delta", config.get("dp-delta")))
    for name, key in (("fedinit_round_replies", "num-replies"),
                      ("fedinit_round_rejected", "num-rejected"),
                      ("fedinit_round_missing", "num-missing")):
        out.add(name, run, last.get(key))
    fleet = status.get("fleet") or {}
    if fleet:
        add_fleet(out, run, fleet, private=dp != "off")


def add_fleet(out: Families, run: str, fleet: Mapping[str, Any], private: bool) -> None:
    """The fleet's totals and its nodes, as status.json holds them."""
    out.add("fedinit_fleet_clients", run, fleet.get("num-clients"))
    out.add("fedinit_fleet_identified", run, fleet.get("identified"))
    totals = fleet.get("totals") or {}
    for outcome in OUTCOMES:
        out.add("fedinit_tasks", run, totals.get(outcome), outcome)
    for reason, count in (fleet.get("rejected-by-reason") or {}).items():
        out.add("fedinit_rejected_replies", run, count, reason)
    # Per-node tasks only where the writer wrote them: never under DP, whatever the file says.
    per_node = not private and fleet.get("per-node-tasks", "written") == "written"
    for n in fleet.get("nodes") or []:
        if not isinstance(n, dict):
            continue
        node = (n.get("node"), n.get("client"))
        for state in NODE_STATES:
            out.add("fedinit_node_state", run, int(n.get("state") == state), *node, state)
        if isinstance(n.get("connected"), bool):
            out.add("fedinit_node_connected", run, int(n["connected"]), *node)
        out.add("fedinit_node_last_connected_timestamp_seconds", run, n.get("last-connected"),
                *node)
        out.add("fedinit_node_identity_seen_timestamp_seconds", run, n.get("identity-seen"),
                *node)
        out.add("fedinit_node_waiting_seconds", run, n.get("waiting-seconds"), *node)
        if not per_node:
            continue
        out.add("fedinit_node_last_seen_timestamp_seconds", run, n.get("last-seen"), *node)
        tasks = n.get("tasks") or {}
        for outcome in OUTCOMES:
            out.add("fedinit_node_tasks", run, tasks.get(outcome), *node, outcome)
        for reason, count in (n.get("rejected-reasons") or {}).items():
            out.add("fedinit_node_rejected_replies", run, count, *node, reason)
        out.add("fedinit_node_train_seconds", run, n.get("train-seconds"), *node)


class FleetCollector:
    """A ``prometheus_client`` collector of every run under ``root``, read at each scrape."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def collect(self) -> Iterator[Metric]:
        out = Families()
        for key, path in find_runs(self.root).items():
            add_run(out, key or path.name, path)
        yield from out


def registry_for(root: Path) -> CollectorRegistry:
    """A private registry holding only the fleet collector of ``root``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(root))
    return registry


def scrape(registry: CollectorRegistry) -> bytes:
    """The text a scrape of ``/metrics`` answers."""
    return generate_latest(registry)
