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

from scripts.dashboard import make_server
from scripts.dashboard_metrics import registry_for, scrape
from server_app.status import STATUS_FILE, NodeTally, StatusWriter
from task.config import RunConfig


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
    fleet.online = lambda: fleet.connected
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--rounds", type=int, default=200, help="rows written and rounds tallied")
    p.add_argument("--dp", default="off", choices=["off", "central", "local"])
    p.add_argument("--repeat", type=int, default=30)
    a = p.parse_args(argv)
    print(f"rounds={a.rounds} dp={a.dp}, median of {a.repeat}, ms", flush=True)
    print(f"{'nodes':>6} {'status KB':>9} {'read':>7} {'collect':>8} {'scrape':>7} "
          f"{'page':>7} {'metrics KB':>10} {'series':>7}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.nodes:
            print(measure(Path(tmp) / f"n{n}", n, a.rounds, a.dp, a.repeat), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
