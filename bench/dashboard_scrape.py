"""What one Prometheus scrape of ``fedinit-dashboard --metrics`` costs, beside reading
status.json alone and beside a load of the run's page.

    .venv/bin/python -m bench.dashboard_scrape                   # 10, 100, 1000 nodes; < 1 min
    .venv/bin/python -m bench.dashboard_scrape --nodes 5000 --rounds 2000 --dp central

For each fleet size a run directory is written by the ServerApp's own status writer
(server_app/status.py ``StatusWriter``, with every node identified and a tally of ``--rounds``
rounds each) beside a ``rounds.jsonl`` of ``--rounds`` rows, then timed (median of
``--repeat``, milliseconds):

  read      open status.json and ``json.loads`` it: the floor any reader pays
  collect   the collector and ``generate_latest`` in this process (no HTTP)
  scrape    GET /metrics over HTTP on 127.0.0.1 (the dashboard's server, a fresh connection)
  page      GET /run/ over HTTP: the fleet page the same figures come from

and the size of the answer. The collector reads status.json, the rows and config.json at
each scrape (no cache), so its cost grows with the fleet and the rows, as the page's does.

Then what one status.json write costs the ServerApp (``StatusWriter.write`` over a real
``Fleet``, every node identified and tallied as above), side by side, alternating, median of
``--repeat``: ``before``, the write as it was (``Fleet.online``, i.e. ``Grid.get_node_ids``,
then the file), and ``after``, the write as it is (the file only: connected is the round's
last answer). ``get_node_ids`` runs in this process against Flower's own LinkState, in memory
and in SQLite (a deployment's SuperLink, as ``fedinit-deploy`` and compose start it, keeps
its state in SQLite), with the nodes registered as the simulation engine registers them; a
deployment adds a gRPC round trip on top, so ``before`` is a lower bound.

    .venv/bin/python -m bench.dashboard_scrape --table write   # 10, 100, 1000 nodes; ~1 min
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from fedinit.cli.dashboard import make_server
from fedinit.cli.dashboard_metrics import registry_for, scrape
from fedinit.config import RunConfig
from server_app.clients import Fleet
from server_app.status import STATUS_FILE, NodeTally, StatusWriter


def write_run(run: Path, nodes: int, rounds: int, dp: str) -> int:
    """A run directory as the ServerApp leaves it mid-run; status.json's size in bytes."""
    run.mkdir(parents=True)
    raw: dict[str, Any] = {"num-clients": nodes, "num-server-rounds": 2 * rounds, "dp": dp}
    if dp != "off":
        raw.update({"weighting": "uniform", "dp-target-epsilon": 8.0})
    cfg = RunConfig.parse(raw)
    fleet = SimpleNamespace(node_of={c: 1000 + c for c in range(nodes)}, pending={},
                            reasons={}, refused=set(), asked_at={},
                            seen_at={1000 + c: time.time() for c in range(nodes)},
                            registry=None, connected={1000 + c for c in range(nodes)},
                            connected_at={1000 + c: time.time() for c in range(nodes)},
                            on_change=None)
    writer = StatusWriter(run, cfg, fleet, 1)  # type: ignore[arg-type] - the fields it reads
    for c in range(nodes):
        writer.tally[1000 + c] = NodeTally(
            sent=rounds, replied=rounds - 2, rejected=Counter({"norm above limit": 1}),
            missing=1, train_seconds=1.25, last_reply=time.time(),
            rounds=list(range(1, rounds + 1)))
    rows = [{"round": r, "test-acc": 0.5, "test-loss": 1.2, "num-replies": nodes,
             "num-rejected": 0, "num-missing": 0, "round-seconds": 3.0,
             "collect-seconds": 2.5, "elapsed-seconds": 3.0 * r,
             **({"dp-epsilon": 0.01 * r} if dp != "off" else {})} for r in range(1, rounds + 1)]
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    writer.round, writer.last_row = rounds, rows[-1]
    writer.write()
    return (run / STATUS_FILE).stat().st_size


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm: imports, the first connection
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def get(addr: tuple[str, int], path: str) -> bytes:
    conn = http.client.HTTPConnection(*addr, timeout=30)
    conn.request("GET", path)
    body = conn.getresponse().read()
    conn.close()
    return body


def measure(root: Path, nodes: int, rounds: int, dp: str, repeat: int) -> str:
    """One fleet size's line of the table."""
    size = write_run(root / "run", nodes, rounds, dp)
    status = root / "run" / STATUS_FILE
    registry = registry_for(root)
    server = make_server(root, port=0, metrics=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    addr = (str(server.server_address[0]), int(server.server_address[1]))
    try:
        read = median_ms(lambda: json.loads(status.read_bytes()), repeat)
        collect = median_ms(lambda: scrape(registry), repeat)
        http_ms = median_ms(lambda: get(addr, "/metrics"), repeat)
        page = median_ms(lambda: get(addr, "/run/"), repeat)
        text = get(addr, "/metrics")
    finally:
        server.shutdown()
        server.server_close()
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return (f"{nodes:>6} {size / 1024:>9.1f} {read:>7.2f} {collect:>8.2f} {http_ms:>7.2f} "
            f"{page:>7.2f} {len(text) / 1024:>10.1f} {series:>7}")


def linked_grid(root: Path, nodes: int, database: str) -> InMemoryGrid:
    """Flower's Grid over its own LinkState (``memory`` or ``sqlite``, a file under
    ``root``) with ``nodes`` nodes registered and online, as the simulation engine does."""
    db = FLWR_IN_MEMORY_DB_NAME if database == "memory" else str(root / "state.db")
    factory = LinkStateFactory(db, NoOpFederationManager(), ObjectStoreFactory())
    run_id = factory.state().create_run(None, None, None, {}, NOOP_FEDERATION_ID, None, None,
                                        "serverapp")
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(Run.create_empty(run_id))
    vce_api._register_nodes(nodes, factory)
    return grid


def measure_write(root: Path, nodes: int, rounds: int, database: str, repeat: int) -> str:
    """One line of the write table: the write before (get_node_ids + file) and after."""
    root.mkdir(parents=True)
    grid = linked_grid(root, nodes, database)
    cfg = RunConfig.parse({"num-clients": nodes, "num-server-rounds": 2 * rounds})
    fleet = Fleet(grid, cfg)
    fleet.node_of = dict(enumerate(sorted(fleet.online())))
    writer = StatusWriter(root / "run", cfg, fleet, 1)
    (root / "run").mkdir()
    for node in fleet.node_of.values():
        writer.tally[node] = NodeTally(
            sent=rounds, replied=rounds - 1, missing=1, train_seconds=1.25,
            last_reply=time.time(), rounds=list(range(1, rounds + 1)))
    writer.round = rounds

    def before() -> None:
        fleet.online()
        writer.write()

    timed: dict[str, list[float]] = {"ask": [], "before": [], "after": []}
    for fn in (fleet.online, before, writer.write):  # warm
        fn()
    for _ in range(repeat):
        for name, fn in (("ask", fleet.online), ("before", before), ("after", writer.write)):
            t0 = time.perf_counter()
            fn()
            timed[name].append(time.perf_counter() - t0)
    ms = {k: 1000 * statistics.median(v) for k, v in timed.items()}
    return (f"{nodes:>6} {database:>8} {ms['ask']:>13.2f} {ms['before']:>10.2f} "
            f"{ms['after']:>9.2f} {ms['before'] / ms['after']:>7.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--rounds", type=int, default=200, help="rows written and rounds tallied")
    p.add_argument("--dp", default="off", choices=["off", "central", "local"])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--table", choices=["scrape", "write", "both"], default="scrape",
                   help="the scrape table, the status write table (before/after), or both")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if a.table != "write":
            print(f"rounds={a.rounds} dp={a.dp}, median of {a.repeat}, ms", flush=True)
            print(f"{'nodes':>6} {'status KB':>9} {'read':>7} {'collect':>8} {'scrape':>7} "
                  f"{'page':>7} {'metrics KB':>10} {'series':>7}", flush=True)
            for n in a.nodes:
                print(measure(Path(tmp) / f"n{n}", n, a.rounds, a.dp, a.repeat), flush=True)
        if a.table != "scrape":
            print(f"status.json write, rounds={a.rounds}, median of {a.repeat} alternating, "
                  "ms: before = get_node_ids + write (as it was), after = write (as it is)",
                  flush=True)
            print(f"{'nodes':>6} {'state':>8} {'get_node_ids':>13} {'before':>10} "
                  f"{'after':>9} {'ratio':>8}", flush=True)
            for n in a.nodes:
                for database in ("memory", "sqlite"):
                    print(measure_write(Path(tmp) / f"w{n}-{database}", n, a.rounds,
                                        database, a.repeat), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
