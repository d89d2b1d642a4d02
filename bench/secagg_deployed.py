"""Secure aggregation's cost in a deployment: plain and secagg+ rounds side by side, one run.

One TLS + node-authentication process deployment of 4 SuperNodes (``fedinit.cli.deploy_local``,
the warm executor) runs the same FedInit config twice, ``secure-aggregation`` off then
``secagg+`` (then again, with ``--pairs 2``, alternating, so the machine's load falls on
both alike). Bytes are what crossed the Fleet API's TCP connections (TLS records, every
pull and push of the SuperNodes included, identical polling in both): the SuperLink side's
``bytes_received`` (up, from the devices) and ``bytes_sent`` (down) of each connection, from
the kernel's ``ss -tin``, sampled the moment each round's row lands in ``rounds.jsonl``; a
round is the span between two rows (key exchange, training, unmask and the central
evaluation of the eval rounds). Seconds are the rows' ``round-seconds``. Round 1 (data
loading, the FAB's install) is left out of the means.

    PYTHONPATH=$PWD .venv/bin/python -m bench.secagg_cost --deployed [--rounds 3]
        [--train-limit 200] [--pairs 1] [--base-port 40400]
    (or -m bench.secagg_deployed with the same options)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from fedinit.cli.deploy_local import Deployment
from testbeds.deployment_runs import FlwrRun, deployed

NODES = 4
CFG: dict[str, Any] = {
    "method": "fedavg", "beta": 0.1, "num-clients": NODES, "fraction-train": 1.0,
    "local-epochs": 1, "seed": 0, "weighting": "uniform", "max-update-norm-ratio": 0.0,
    "personal-eval-every": 0, "node-wait-timeout": 120.0, "round-timeout": 180.0,
    "tracking": "off"}
"""FedInit (FedAvg with RI) on 4 clients, all of them each round: what both modes can run."""
_CONN = re.compile(r"(\S+:\d+)\s+(\S+:\d+)\s*$")
_COUNT = re.compile(r"\b(bytes_sent|bytes_received):(\d+)")


def fleet_bytes(port: int) -> dict[str, tuple[int, int]]:
    """{peer address: (bytes received, bytes sent)} of the SuperLink's established Fleet API
    connections, as the kernel counts them (TLS included)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    counts: dict[str, tuple[int, int]] = {}
    peer = None
    for line in out:
        if (m := _CONN.search(line)) and not line[:1].isspace():
            peer = m.group(2)
        elif peer is not None:
            found = dict(_COUNT.findall(line))
            counts[peer] = (int(found.get("bytes_received", 0)), int(found.get("bytes_sent", 0)))
            peer = None
    return counts


def delta(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
          ) -> tuple[int, int, int]:
    """(up, down, connections lost) between two samples; a connection that closed in
    between is counted as lost (its last bytes are not seen), a new one from zero."""
    up = down = 0
    for peer, (rx, tx) in after.items():
        rx0, tx0 = before.get(peer, (0, 0))
        up, down = up + rx - rx0, down + tx - tx0
    return up, down, len(set(before) - set(after))


def one_run(dep: Deployment, name: str, cfg: dict[str, Any], out: Path,
            rounds: int) -> list[dict[str, float]]:
    """Run ``cfg``; per round: seconds and Fleet API bytes (up and down, all nodes)."""
    fleet = dep.base_port + 1
    run = FlwrRun(dep, name, {**cfg, "output-dir": str(out)})
    samples = [fleet_bytes(fleet)]
    rows: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 300 + 120 * rounds
        while len(rows) < rounds:
            assert time.monotonic() < deadline, f"{name}: timed out\n{run.text()[-3000:]}"
            assert run.popen.poll() is None or len(rows) < rounds, run.text()[-3000:]
            files = list(out.glob("*/rounds.jsonl"))
            lines = files[0].read_text().splitlines() if files else []
            if len(lines) > len(rows):
                samples.append(fleet_bytes(fleet))
                rows = [json.loads(x) for x in lines]
            elif run.popen.poll() is not None:
                raise AssertionError(f"{name} ended early:\n{run.text()[-3000:]}")
            time.sleep(0.05)
        assert run.wait(120) == "finished:completed", run.text()[-3000:]
    finally:
        run.stop()
    per_round = []
    for r in range(1, len(samples)):
        up, down, lost = delta(samples[r - 1], samples[r])
        per_round.append({"seconds": float(rows[r - 1]["round-seconds"]), "up": up,
                          "down": down, "lost": lost,
                          "replies": rows[r - 1]["num-replies"]})
    return per_round


def main(rounds: int, train_limit: int, pairs: int, base_port: int) -> None:
    cfg = {**CFG, "num-server-rounds": rounds, "eval-every": rounds, "train-limit": train_limit}
    with tempfile.TemporaryDirectory(prefix="secagg-deployed-") as tmp:
        work = Path(tmp)
        with deployed(Deployment(work / "deploy", NODES, base_port=base_port), work) as dep:
            cfg["node-registry"] = str(dep.registry)
            results: dict[str, list[dict[str, float]]] = {"plain": [], "secagg+": []}
            for pair in range(pairs):
                for mode in results:
                    over = {"secure-aggregation": "off" if mode == "plain" else "secagg+"}
                    got = one_run(dep, f"{mode}-{pair}", {**cfg, **over},
                                  work / f"{mode}-{pair}", rounds)
                    results[mode] += got[1:]  # round 1 loads data and the app
                    for i, r in enumerate(got, 1):
                        print(f"  {mode:<8} pass {pair + 1} round {i}: {r['seconds']:6.2f} s, "
                              f"up {r['up']:>9,} B, down {r['down']:>9,} B, replies "
                              f"{r['replies']}, connections lost {r['lost']}", flush=True)
    print(f"\n{NODES} SuperNodes over TLS + node auth (warm executor), FedInit, default CNN, "
          f"train-limit={train_limit}, {rounds} rounds x {pairs} pass(es) each; means over "
          f"rounds 2..{rounds}, all nodes together:")
    print(f"{'mode':<8} {'s/round':>8} {'up B/round':>12} {'down B/round':>13}")
    mean = {m: {k: statistics.fmean(r[k] for r in rs) for k in ("seconds", "up", "down")}
            for m, rs in results.items()}
    for mode, m in mean.items():
        print(f"{mode:<8} {m['seconds']:>8.2f} {m['up']:>12,.0f} {m['down']:>13,.0f}")
    s, p = mean["secagg+"], mean["plain"]
    print(f"{'ratio':<8} {s['seconds'] / p['seconds']:>8.2f} {s['up'] / p['up']:>12.3f} "
          f"{s['down'] / p['down']:>13.3f}   (secagg+ / plain)")


def cli(argv: list[str] | None = None) -> None:
    """The options above; a bad value is refused in one line before anything starts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (>= 2)")
    parser.add_argument("--train-limit", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=1, help="plain/secagg+ runs, alternating")
    parser.add_argument("--base-port", type=int, default=40400,
                        help="ports base, base+1, base+10..base+13")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.pairs < 1 or args.train_limit < 1:
        parser.error(f"--rounds {args.rounds} / --pairs {args.pairs} / --train-limit "
                     f"{args.train_limit}: need rounds >= 2 (round 1 is left out), pairs >= 1, "
                     f"train-limit >= 1")
    main(args.rounds, args.train_limit, args.pairs, args.base_port)


if __name__ == "__main__":
    cli()
