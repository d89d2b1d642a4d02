"""Per-round wall time of one short experiment in simulation, process deployment and compose.

    .venv/bin/python bench/deploy_rounds.py                  # 3 clients, 3 rounds, all paths
    .venv/bin/python bench/deploy_rounds.py --rounds 5 --skip compose

Each path runs the same config and seed (fraction-train=1.0, train-limit=3000): simulation
via scripts/simulate.py, process deployment (TLS + node auth on 127.0.0.1) via
scripts/deploy_local.py, docker-compose (TLS + auth, process isolation) via
deploy/compose_run.sh when a Docker engine answers. Round seconds are the ServerApp's own
(rounds.jsonl: send, wait for replies, aggregate, evaluate), so the paths compare directly.

Bytes on the wire per round are computed, not sniffed: the model's ArrayRecord payload
(ArrayRecord.count_bytes() of the initial CNN weights) times the messages the run logged
(clients sampled down, num-replies up). gRPC/HTTP2 framing, TLS, the config/metric records
and the one-off identity query are not included.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import ArrayRecord  # noqa: E402

from scripts.deploy_local import stop_pids  # noqa: E402
from scripts.flower_env import REPO, flower_env  # noqa: E402
from task.config import RunConfig  # noqa: E402
from task.models import build_model, get_weights  # noqa: E402

PATHS = ("simulation", "process", "compose")


def experiment(rounds: int, nodes: int) -> list[str]:
    return [f"num-server-rounds={rounds}", "fraction-train=1.0", "train-limit=3000", "seed=0",
            f"num-clients={nodes}"]


def results_rows(out: Path) -> list[dict[str, Any]]:
    (run,) = [d for d in out.rglob("summary.json")]
    return [json.loads(x) for x in (run.parent / "rounds.jsonl").read_text().splitlines()]


def run_simulation(tmp: Path, args: list[str]) -> tuple[float, Path]:
    home = tmp / "sim-home"
    env = flower_env(home, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="39391",
                     FLWR_LOCAL_CONTROL_API_PORT="39393")
    out = tmp / "sim-out"
    t0 = time.monotonic()
    try:
        subprocess.run([sys.executable, str(REPO / "scripts" / "simulate.py"), *args,
                        f"output-dir={out}"], env=env, check=True, capture_output=True)
    finally:  # the local SuperLink outlives `flwr run`
        stop_pids(pids_with(str(home / "local-superlink")))
    return time.monotonic() - t0, out


def run_process(tmp: Path, args: list[str], nodes: int) -> tuple[float, Path]:
    out = tmp / "proc-out"
    cfg = [a for a in args if not a.startswith("num-clients=")]
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(REPO / "scripts" / "deploy_local.py"), "--num-nodes",
                    str(nodes), "--work-dir", str(tmp / "proc"), "--base-port", "29600", *cfg,
                    f"output-dir={out}"], check=True, capture_output=True)
    return time.monotonic() - t0, out


def run_compose(tmp: Path, args: list[str]) -> tuple[float, Path]:
    work = tmp / "compose"
    cfg = [a for a in args if not a.startswith("num-clients=")]
    t0 = time.monotonic()
    subprocess.run(["bash", str(REPO / "deploy" / "compose_run.sh"), "--project",
                    "fedinit-bench", "--work-dir", str(work), *cfg], check=True,
                   capture_output=True)
    return time.monotonic() - t0, work / "results"


def pids_with(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def docker_ready() -> bool:
    return bool(shutil.which("docker") and shutil.which("docker-compose")) and subprocess.run(
        ["docker", "info"], capture_output=True, check=False).returncode == 0


def payload_bytes() -> int:
    """The model's ArrayRecord payload: what one train message carries each way."""
    cfg = RunConfig.parse({})
    return ArrayRecord(get_weights(build_model(cfg.model, 10, 1, cfg.seed))).count_bytes()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=3, help="clients; compose has 3")
    ap.add_argument("--skip", nargs="*", default=[], choices=PATHS)
    args = ap.parse_args()
    todo = [p for p in PATHS if p not in args.skip]
    if "compose" in todo and (args.nodes != 3 or not docker_ready()):
        print("compose: skipped (needs a running Docker engine, docker-compose and --nodes 3)")
        todo.remove("compose")
    cfg = experiment(args.rounds, args.nodes)
    payload = payload_bytes()
    print(f"experiment: {' '.join(cfg)}; CNN ArrayRecord payload {payload:,} bytes")
    print(f"{'path':<11} {'wall s':>7} {'round s (each)':<28} {'mean':>6} {'mean 2+':>7} "
          f"{'bytes/round':>12}")
    with tempfile.TemporaryDirectory(prefix="fedinit-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if os.geteuid() == 0:  # compose containers (uid 49999) write into the work dir
            tmp.chmod(0o755)
        for path in todo:
            if path == "simulation":
                wall, out = run_simulation(tmp, cfg)
            elif path == "process":
                wall, out = run_process(tmp, cfg, args.nodes)
            else:
                wall, out = run_compose(tmp, cfg)
            rows = results_rows(out)
            secs = [float(r["round-seconds"]) for r in rows]
            later = statistics.mean(secs[1:]) if len(secs) > 1 else secs[0]
            sent = RunConfig.parse({"num-clients": args.nodes,
                                    "fraction-train": 1.0}).clients_per_round
            wire = statistics.mean((sent + int(r["num-replies"])) * payload for r in rows)
            print(f"{path:<11} {wall:7.1f} {' '.join(f'{s:.1f}' for s in secs):<28} "
                  f"{statistics.mean(secs):6.1f} {later:7.1f} {wire:12,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
