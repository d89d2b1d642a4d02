"""Simulation overhead: `flwr run` wall time against the plain PyTorch loop (the floor).

    .venv/bin/python -m bench.sim_overhead                 # the default experiment
    .venv/bin/python -m bench.sim_overhead num-server-rounds=20

Prints per-round wall time of the simulation, the plain loop's, and their ratios: for the
whole command (SuperLink + Ray start included) and for the rounds alone (steady state).
Goal: rounds ratio <= 1.3.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.plain_loop import plain_fedinit
from fedinit.cli.flower_env import flower_env
from fedinit.cli.simulate import parse_value
from fedinit.config import RunConfig


def main() -> None:
    overrides = {k: parse_value(v) for k, _, v in (a.partition("=") for a in sys.argv[1:])}
    cfg = RunConfig.parse(overrides)
    out = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    args = [f"{k}={v}" for k, v in overrides.items()] + [f"output-dir={out}"]
    env = flower_env(Path(tempfile.mkdtemp(prefix="bench-flwr-")),
                     FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="39291",
                     FLWR_LOCAL_CONTROL_API_PORT="39293")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fedinit.cli.simulate", *args],
                          env=env, capture_output=True, text=True, check=False)
    sim_wall = time.monotonic() - t0
    subprocess.run(["pkill", "-f", "flower-superlink.*--port 39291"], check=False)
    if proc.returncode != 0:
        sys.exit(f"simulation failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (run_dir,) = list(out.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    sim_rounds = sum(r["round-seconds"] for r in rows)

    plain = plain_fedinit(cfg)
    n = cfg.train.num_server_rounds
    print(f"experiment: {cfg.method} beta={cfg.train.beta} {cfg.data.dataset} "
          f"{cfg.num_clients} clients, "
          f"{cfg.clients_per_round}/round, {n} rounds, {cfg.train.local_epochs} local epochs")
    print(f"{'':28s}{'simulation':>12s}{'plain loop':>12s}{'ratio':>8s}")
    print(f"{'whole command (s)':28s}{sim_wall:12.1f}{plain['wall-seconds']:12.1f}"
          f"{sim_wall / plain['wall-seconds']:8.2f}")
    print(f"{'all rounds (s)':28s}{sim_rounds:12.1f}{plain['rounds-seconds']:12.1f}"
          f"{sim_rounds / plain['rounds-seconds']:8.2f}")
    print(f"{'per round (s)':28s}{sim_rounds / n:12.2f}{plain['rounds-seconds'] / n:12.2f}")
    print(f"{'final test accuracy':28s}{summary['final-test-acc']:12.4f}"
          f"{plain['final-test-acc']:12.4f}")
    print(f"startup outside the rounds: simulation {sim_wall - sim_rounds:.1f} s "
          f"(local SuperLink, Ray, app install, data, identity query); plain loop "
          f"{plain['setup-seconds']:.1f} s (data)")


if __name__ == "__main__":
    main()
