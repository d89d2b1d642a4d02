"""Per-round overhead of the deployment paths beside the simulation, side by side in one run.

    .venv/bin/python -m bench.deploy_rounds                     # every path, 6 rounds
    .venv/bin/python -m bench.deploy_rounds --skip compose --memory-rounds 0

Each path runs the same config and seed (3 clients, fraction-train=1.0, train-limit=3000):

  simulation      fedinit/cli/simulate.py (Flower's simulation engine)
  process-flower  deploy_local.py --executor flower --node-poll 0: Flower's own SuperExec
                  (a new flwr-clientapp process per message) and Flower's 3 s node poll
  process-3s      the warm executor, Flower's 3 s node poll (the poll's share of overhead)
  process-fixed   the fixed fast polls of before: node 0.5 s, executor 0.1 s, always
  process         the defaults: node 0.2 s while a run is active (3 s idle), the executor
                  woken by its node (fedinit.flower_compat.supernode_waits)
  process-memory  the defaults with the SuperLink's state in memory (--link-state memory):
                  no SQL per request, nothing kept across a SuperLink restart
  compose         deploy/compose_run.sh (TLS + auth, warm executors), when Docker answers

Per round the ServerApp records ``collect-seconds`` (messages pushed until the last reply
arrived) and the clients' own compute (``compute-seconds``, measured in the client): the
overhead is collect minus the slowest client's compute; ``vs sim`` is the round time minus
the simulation's (the issue's definition of deployment overhead). Means are over rounds 2+ (round 1
also loads data). The per-message start cost is the warm executor's own figure (token in
hand to ClientApp called) against a cold process's imports (``python -c 'import torch,
flwr..., client_app.app'``). With --memory-rounds N, one more warm process deployment runs N
rounds while each node's processes (launcher + SuperNode, executor, worker) are sampled:
their peak RSS sum, and the worker's RSS after its first and last task.
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
import threading
import time
from pathlib import Path
from typing import Any

from fedinit.cli.deploy_local import descendants, stop_pids
from fedinit.cli.flower_env import REPO, flower_env
from fedinit.node.warm_executor import rss_mib

PATHS = ("simulation", "process-flower", "process-3s", "process-fixed", "process",
         "process-memory", "compose")
PROCESS_FLAGS = {"process-flower": ["--executor", "flower", "--node-poll", "0"],
                 "process-3s": ["--executor", "warm", "--node-poll", "0"],
                 "process-fixed": ["--executor", "warm", "--node-poll", "0.5",
                                   "--idle-poll", "0.5", "--no-wake"],
                 "process": ["--executor", "warm"],
                 "process-memory": ["--executor", "warm", "--link-state", "memory"]}
COLD_IMPORTS = "import torch, flwr.clientapp, flwr.supernode.runtime.run_clientapp, client_app.app"


def experiment(rounds: int) -> list[str]:
    return [f"num-server-rounds={rounds}", "fraction-train=1.0", "train-limit=3000", "seed=0"]


def results_rows(out: Path) -> list[dict[str, Any]]:
    (run,) = list(out.rglob("summary.json"))
    return [json.loads(x) for x in (run.parent / "rounds.jsonl").read_text().splitlines()]


def run_simulation(tmp: Path, args: list[str], nodes: int, base_port: int) -> Path:
    home = tmp / "sim-home"
    env = flower_env(home, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(base_port + 91),
                     FLWR_LOCAL_CONTROL_API_PORT=str(base_port + 93))
    out = tmp / "sim-out"
    try:
        subprocess.run([sys.executable, "-m", "fedinit.cli.simulate", f"num-clients={nodes}", *args,
                        f"output-dir={out}"], env=env, check=True, capture_output=True,
                       cwd=REPO)
    finally:  # the local SuperLink outlives `flwr run`
        stop_pids(pids_with(str(home / "local-superlink")))
    return out


def run_process(tmp: Path, name: str, args: list[str], flags: list[str], nodes: int = 3,
                base_port: int = 29900, sampler: MemorySampler | None = None) -> Path:
    out, work = tmp / f"{name}-out", tmp / name
    cmd = [sys.executable, "-m", "fedinit.cli.deploy_local", "--num-nodes", str(nodes),
           "--work-dir", str(work), "--base-port", str(base_port), *flags, *args,
           f"output-dir={out}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    if sampler is not None:
        sampler.start(work)
    text, _ = proc.communicate()
    if sampler is not None:
        sampler.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{text[-3000:]}")
    return out


def run_compose(tmp: Path, args: list[str]) -> Path:
    work = tmp / "compose"
    subprocess.run(["bash", str(REPO / "deploy" / "compose_run.sh"), "--project",
                    "fedinit-bench", "--work-dir", str(work), *args], check=True,
                   capture_output=True)
    return work / "results"


class MemorySampler:
    """Peak memory (MiB) of each node's process tree, sampled every 0.5 s: the sum of PSS
    (shared pages split between the processes that map them, so torch's libraries shared by
    the executor and its forked worker count once) and, for comparison, of RSS."""

    def __init__(self) -> None:
        self.peaks: dict[int, float] = {}
        self.rss_peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, work: Path) -> None:
        self._thread = threading.Thread(target=self._loop, args=(work,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self, work: Path) -> None:
        while not self._stop.wait(0.5):
            for i in range(3):
                roots = pids_with(f"partition-id={i} ")
                tree = descendants(roots) if roots else []
                pss = sum(rss_mib(p, pss=True) or 0.0 for p in tree)
                rss = sum(rss_mib(p) or 0.0 for p in tree)
                self.peaks[i] = max(self.peaks.get(i, 0.0), pss)
                self.rss_peaks[i] = max(self.rss_peaks.get(i, 0.0), rss)


def pids_with(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                        errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def docker_ready() -> bool:
    return bool(shutil.which("docker") and shutil.which("docker-compose")) and subprocess.run(
        ["docker", "info"], capture_output=True, check=False).returncode == 0


def cold_start_seconds(repeats: int = 3) -> float:
    """What a cold flwr-clientapp process pays before the app runs: interpreter + imports."""
    times = []
    for _ in range(repeats):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", COLD_IMPORTS], check=True, cwd=REPO,
                       capture_output=True)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def warm_start_seconds(work: Path) -> float | None:
    starts = []
    for i in range(3):
        path = work / f"node-{i}" / "executor.json"
        if path.exists():
            starts += json.loads(path.read_text())["start_seconds"][2:]  # after query + round 1
    return statistics.median(starts) if starts else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    later = rows[1:] or rows
    overhead = [float(r["collect-seconds"]) - float(r["client-seconds-max"] or 0.0)
                for r in later]
    return {"round": statistics.mean(float(r["round-seconds"]) for r in later),
            "collect": statistics.mean(float(r["collect-seconds"]) for r in later),
            "compute": statistics.mean(float(r["client-seconds-max"] or 0.0) for r in later),
            "overhead": statistics.mean(overhead), "overhead-max": max(overhead),
            "first": float(rows[0]["round-seconds"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--nodes", type=int, default=3, help="clients = SuperNodes (default 3)")
    ap.add_argument("--base-port", type=int, default=29900,
                    help="the deployments' ports from here; the simulation's local SuperLink "
                         "on base + 91 and base + 93 (default 29900)")
    ap.add_argument("--skip", nargs="*", default=[], choices=PATHS)
    ap.add_argument("--memory-rounds", type=int, default=100,
                    help="rounds of the memory run of the warm process deployment (0: none)")
    args = ap.parse_args()
    todo = [p for p in PATHS if p not in args.skip]
    if "compose" in todo and not docker_ready():
        print("compose: skipped (needs a running Docker engine and docker-compose)")
        todo.remove("compose")
    cfg = experiment(args.rounds)
    print(f"experiment: {args.nodes} clients, {' '.join(cfg)}; means over rounds 2-{args.rounds}")
    print(f"{'path':<15} {'round 1':>8} {'round':>7} {'collect':>8} {'compute':>8} "
          f"{'overhead':>9} {'max':>6} {'vs sim':>7}  (seconds)")
    sim_round: float | None = None
    with tempfile.TemporaryDirectory(prefix="fedinit-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if os.geteuid() == 0:  # compose containers (uid 49999) write into the work dir
            tmp.chmod(0o755)
        warm_start = None
        for path in todo:
            if path == "simulation":
                out = run_simulation(tmp, cfg, args.nodes, args.base_port)
            elif path == "compose":
                out = run_compose(tmp, cfg)
            else:
                out = run_process(tmp, path, cfg, PROCESS_FLAGS[path], args.nodes,
                                  args.base_port)
                if path == "process":
                    warm_start = warm_start_seconds(tmp / path)
            s = summarize(results_rows(out))
            if path == "simulation":
                sim_round = s["round"]
            vs = "" if sim_round is None else f"{s['round'] - sim_round:7.2f}"
            print(f"{path:<15} {s['first']:8.2f} {s['round']:7.2f} {s['collect']:8.2f} "
                  f"{s['compute']:8.2f} {s['overhead']:9.2f} {s['overhead-max']:6.2f} {vs}",
                  flush=True)
        cold = cold_start_seconds()
        warm = f"{warm_start:.3f} s" if warm_start is not None else "not measured"
        print(f"per-message ClientApp start: cold process {cold:.2f} s (interpreter + torch + "
              f"flwr + app imports), warm executor {warm} (median, rounds 2+)")
        if args.memory_rounds:
            sampler = MemorySampler()
            out = run_process(tmp, "memory", experiment(args.memory_rounds),
                              PROCESS_FLAGS["process"], 3, args.base_port, sampler)
            hist = [json.loads((tmp / "memory" / f"node-{i}" / "executor.json").read_text())
                    ["worker_rss_history"] for i in range(3)]
            s = summarize(results_rows(out))
            print(f"memory over {args.memory_rounds} rounds (warm, process): peak per node "
                  f"(launcher + SuperNode + executor + worker) PSS "
                  f"{ {i: round(v) for i, v in sorted(sampler.peaks.items())} } MiB, RSS "
                  f"{ {i: round(v) for i, v in sorted(sampler.rss_peaks.items())} } MiB; worker "
                  f"RSS first/last task {[(round(h[1]), round(h[-1])) for h in hist]} MiB; "
                  f"overhead mean {s['overhead']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
