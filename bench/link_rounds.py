"""Seconds and bytes per round of a TLS + node-auth deployment on device links (issue 44).

Every scenario (testbeds/link_scenarios.py) runs the same config (FedInit, or ``--method
scaffold``) on its own fresh
deployment: ``loopback`` (the nodes in the root namespace on 127.0.0.1, no proxy) is the
baseline; the others put every node in its own namespace behind a tbf-limited veth pair and
the fault proxy. Seconds are the rows' median ``round-seconds`` after round 1 (data loading,
the FAB download); bytes are what the proxies forwarded between two rows (TLS records and
every pull, push and heartbeat included; none for loopback, which has no proxy). Needs root.

    PYTHONPATH=$PWD .venv/bin/python -m bench.link_rounds [--scenarios loopback,cellular]
        [--nodes 2] [--method fedinit|scaffold] [--rounds 4] [--train-limit 300]
        [--base-port 44300] [--compression off,q8]

``--compression`` takes a comma-separated list of the run config's ``compression`` values:
each scenario runs once per value, side by side on fresh deployments (issue 44's goal: a
cellular round at least 3x shorter with q8 than uncompressed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from testbeds.deployment_runs import deployed
from testbeds.link_deployment import LinkDeployment
from testbeds.link_runs import Watched, watch
from testbeds.link_scenarios import SCENARIOS, Scenario
from testbeds.links import unavailable

COMMON = {"fraction-train": 1.0, "local-epochs": 1, "seed": 0, "personal-eval-every": 0,
          "node-wait-timeout": 120.0, "round-timeout": 60.0, "tracking": "off"}
METHODS: dict[str, dict[str, Any]] = {"fedinit": {"method": "fedavg", "beta": 0.1},
                                      "scaffold": {"method": "scaffold"}}


def measure(sc: Scenario, nodes: int, rounds: int, train_limit: int, base_port: int,
            subnet: int, method: str = "fedinit", compression: str = "off") -> Watched:
    with tempfile.TemporaryDirectory(prefix="link-rounds-") as tmp:
        dep = LinkDeployment(Path(tmp) / "deploy", nodes, base_port=base_port,
                             scenarios=[sc] * nodes, subnet=subnet)
        with deployed(dep, Path(tmp)):
            cfg: dict[str, Any] = {**COMMON, **METHODS[method], "num-clients": nodes,
                                   "num-server-rounds": rounds, "eval-every": rounds,
                                   "train-limit": train_limit, "compression": compression,
                                   "node-registry": str(dep.registry)}
            got = watch(dep, sc.name, cfg, Path(tmp) / "out", timeout=900)
    if got.status != "finished:completed":
        raise SystemExit(f"{sc.name}: run {got.status}\n{got.log[-3000:]}")
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="loopback,veth,cellular,flaky-wifi")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--method", choices=sorted(METHODS), default="fedinit")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--train-limit", type=int, default=300)
    ap.add_argument("--reset-every", type=float, default=10.0,
                    help="flaky-wifi's reset period for the run (60 s in the scenario)")
    ap.add_argument("--base-port", type=int, default=44300)
    ap.add_argument("--compression", default="off",
                    help="comma-separated compression values, each run per scenario")
    args = ap.parse_args(argv)
    codecs = args.compression.split(",")
    if why := unavailable():
        print(f"link_rounds: {why}", file=sys.stderr)
        return 2
    print("| scenario | compression | s/round | each round, s | kB up/round | kB down/round | "
          "round 1 kB up/down | rejected, missing | connections, resets, held chunks |")
    print("|---|---|---|---|---|---|---|---|---|")
    runs = [(name, codec) for name in args.scenarios.split(",") for codec in codecs]
    for k, (name, codec) in enumerate(runs):
        sc = SCENARIOS[name]
        if sc.reset_every:
            sc = sc.scaled(reset_every=args.reset_every)
        got = measure(sc, args.nodes, args.rounds, args.train_limit,
                      args.base_port + 20 * k, 210 + k, args.method, codec)
        up, down, p = *got.bytes_per_round(), got.proxy
        first = got.round_bytes[0] if got.round_bytes else (0, 0)
        secs = ", ".join(f"{float(r['round-seconds']):.1f}" for r in got.rows)
        print(f"| {sc.describe()} | {codec} | {got.seconds_per_round():.2f} | {secs} | "
              f"{up / 1e3:.0f} | {down / 1e3:.0f} | {first[0] / 1e3:.0f}/{first[1] / 1e3:.0f} | "
              f"{sum(r['num-rejected'] for r in got.rows)}, "
              f"{sum(r['num-missing'] for r in got.rows)} | {p.get('connections', 0)}, "
              f"{p.get('resets', 0)}, {p.get('held', 0)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
