"""What a ClientApp task that hangs costs a process deployment: its round and the rounds after.

    .venv/bin/python -m bench.hung_task                       # round-timeout=20, 5 rounds
    .venv/bin/python -m bench.hung_task --round-timeout 30 --hang-round 3

One warm-executor process deployment (3 SuperNodes, insecure, fraction-train=1.0,
train-limit=1500) runs a copy of the app whose client 0 hangs forever in round
``--hang-round`` (testbeds/fault_app.py). ``task-deadline`` is left at 0, so the task may run for
``round-timeout`` seconds: the round waits that long for it, then the node's executor kills
the task's worker, answers with its error reply, and serves the next round with a fresh
worker. Printed: each round's seconds (and of them the wait for replies, which
``round-timeout`` bounds), the hung round's extra seconds over the median of the others
(round 1 left out: it loads the data), the first round after it against that median (the
fresh worker reloads its caches), and the node's executor counters.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fedinit.cli.flower_env import REPO
from testbeds.fault_app import fault_app, hang_at


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--round-timeout", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hang-round", type=int, default=2)
    ap.add_argument("--base-port", type=int, default=39520)
    args = ap.parse_args(argv)
    if args.rounds < 4 or not 2 <= args.hang_round < args.rounds:
        ap.error(f"--rounds {args.rounds} --hang-round {args.hang_round} is not allowed; "
                 "allowed: rounds >= 4 and 2 <= hang-round < rounds (round 1 loads the data; "
                 "the round after the hang and another one are measured)")
    with tempfile.TemporaryDirectory(prefix="bench-hung-") as tmp_name:
        tmp = Path(tmp_name)
        app = fault_app(tmp / "app", hang_at(args.hang_round, 0, tmp / "child.pid"))
        out, work = tmp / "out", tmp / "work"
        cmd = [sys.executable, "-m", "fedinit.cli.deploy_local", "--num-nodes", "3", "--insecure",
               "--work-dir", str(work), "--base-port", str(args.base_port), "--app", str(app),
               f"num-server-rounds={args.rounds}", "fraction-train=1.0", "train-limit=1500",
               "local-epochs=1", "seed=0", f"round-timeout={args.round_timeout}",
               f"output-dir={out}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
            return 1
        (summary,) = list(out.rglob("summary.json"))
        rows = [json.loads(x) for x in
                (summary.parent / "rounds.jsonl").read_text().splitlines()]
        status = json.loads((work / "node-0" / "executor.json").read_text())
    secs = {r["round"]: r["round-seconds"] for r in rows}
    hung, after = args.hang_round, args.hang_round + 1
    normal = statistics.median(s for t, s in secs.items() if t not in (1, hung, after))
    table = [(r["round"], round(r["round-seconds"], 1), round(r["collect-seconds"], 1),
              r["num-replies"], r["num-missing"], r["num-rejected"]) for r in rows]
    print(f"rounds (round, seconds, of them waiting for replies, replies, missing, rejected): "
          f"{table}")
    print(f"round-timeout={args.round_timeout:g}s, task-deadline=0 (= round-timeout)")
    print(f"hung round {hung}: {secs[hung]:.1f} s ({rows[hung - 1]['collect-seconds']:.1f} s "
          f"waiting for replies), {secs[hung] - normal:+.1f} s over the median other round "
          f"({normal:.1f} s)")
    print(f"round {after} (fresh worker on the node): {secs[after]:.1f} s "
          f"({secs[after] - normal:+.1f} s); replies {rows[after - 1]['num-replies']}/3")
    print(f"node 0 executor: tasks_timed_out={status['tasks_timed_out']}, "
          f"worker_starts={status['worker_starts']}, tasks={status['tasks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
