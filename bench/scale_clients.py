"""Time per round and memory against the number of simulated clients (10, 100, 1000).

    .venv/bin/python bench/scale_clients.py                   # 10, 100, 1000 clients
    .venv/bin/python bench/scale_clients.py --clients 10 100 --rounds 2

About 10 clients train per round whatever the federation size (fraction-train = 10/N), each
holding 50 images (iid, train-limit = 50 N), so the work per round is the same and what grows
with N is the framework's and the state's share. While each run goes, every process under its
local SuperLink is sampled from /proc twice a second and its resident memory is summed by role:

- simulation process: `flwr-simulation`, which runs the ServerApp AND Flower's simulation
  engine; the engine keeps every simulated node's Context, so `context.state` (w_prev for
  FedInit) of every client that has trained lives in this process in a simulation;
- client actors: the Ray workers that run ClientApps (data and model caches);
- ray system: gcs_server, raylet, dashboard and log monitors;
- superlink: flower-superlink and its superexec.

The ServerApp itself keeps per client only its partition id -> node id entry: model-sized
per-client state never lives on the server side. In a deployment each SuperNode keeps its own
context.state, so the simulation process's growth is where those N SuperNodes' memory went.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.flower_env import flower_env  # noqa: E402
from strategies.sampling import sample_clients  # noqa: E402

HTTP_PORT, CONTROL_PORT = "39691", "39693"  # private: not conftest's, not the sweep tests'
PAGE = os.sysconf("SC_PAGE_SIZE")
ROLES = ("simulation process", "client actors", "ray system", "superlink", "cli")
PER_CLIENT_IMAGES = 50


def proc_table() -> dict[int, tuple[int, str, int]]:
    """{pid: (ppid, command line, resident bytes)} of every readable process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/statm") as f:
                rss = int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry)] = (ppid, cmd, rss)
    return table


def descendants(roots: Iterable[int], table: dict[int, tuple[int, str, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = set(), [r for r in roots if r in table]
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack += children.get(pid, [])
    return out


def role(cmd: str) -> str:
    if "flwr-simulation" in cmd:
        return "simulation process"
    if "ClientAppActor" in cmd or "default_worker.py" in cmd:
        return "client actors"
    if "flower-superlink" in cmd or "flower-superexec" in cmd:
        return "superlink"
    if "ray" in cmd:
        return "ray system"
    return "cli"


def our_superlinks(table: dict[int, tuple[int, str, int]],
                   port: str = CONTROL_PORT) -> list[int]:
    """The local SuperLink(s) `flwr run` started on a bench's private control port."""
    return [pid for pid, (_, cmd, _) in table.items()
            if "flower-superlink" in cmd and f":{port}" in cmd]


class Sampler(threading.Thread):
    """Samples the memory of the run's process tree; keeps per-role and total peaks."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.peak = dict.fromkeys(ROLES, 0)
        self.peak_total = 0

    def run(self) -> None:
        while not self.stop.is_set():
            table = proc_table()
            pids = descendants([self.root, *our_superlinks(table)], table)
            now = dict.fromkeys(ROLES, 0)
            for pid in pids:
                _, cmd, rss = table[pid]
                now[role(cmd)] += rss
            for k, v in now.items():
                self.peak[k] = max(self.peak[k], v)
            self.peak_total = max(self.peak_total, sum(now.values()))
            self.stop.wait(0.5)


def stop_superlinks(port: str = CONTROL_PORT) -> None:
    """Stop the local SuperLink a bench started (found by its private port), by pid."""
    for pid in our_superlinks(proc_table(), port):
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)


def run_one(n: int, rounds: int, per_round: int, home: Path, out: Path) -> dict[str, float]:
    """One simulation of n clients; its timings and memory peaks."""
    overrides = {"num-clients": n, "fraction-train": per_round / n, "num-server-rounds": rounds,
                 "partition": "iid", "train-limit": PER_CLIENT_IMAGES * n, "local-epochs": 1,
                 "method": "fedavg", "beta": 0.1, "output-dir": str(out),
                 "node-wait-timeout": 1800.0}
    env = flower_env(home, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=HTTP_PORT,
                     FLWR_LOCAL_CONTROL_API_PORT=CONTROL_PORT)
    cmd = [sys.executable, "-m", "scripts.simulate",
           *(f"{k}={v}" for k, v in overrides.items())]
    t0, t0_wall = time.monotonic(), time.time()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        sampler = Sampler(proc.pid)
        sampler.start()
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"{n} clients: simulation failed:\n{''.join(tail)}")
    (run_dir,) = list(out.iterdir())
    rows = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    secs = [r["round-seconds"] for r in rows]
    # Start-up ends when the server starts its results (config.json), just before round 1.
    startup = (run_dir / "config.json").stat().st_mtime - t0_wall
    trained = {c for r in range(1, rounds + 1) for c in sample_clients(0, r, n, per_round)}
    return {"clients": n, "wall": wall, "startup": startup,
            "round": sum(secs[1:]) / max(1, len(secs) - 1), "round1": secs[0],
            "clients-with-state": len(trained),
            "state": len(trained) * model_bytes() / 2**20,
            **{f"peak {k}": v / 2**20 for k, v in sampler.peak.items()},
            "peak total": sampler.peak_total / 2**20}


def model_bytes() -> int:
    """Bytes of one model-shaped state entry (FedInit's w_prev) of the CNN."""
    from task.models import build_model

    return sum(p.numel() * 4 for p in build_model("cnn", 10, 1, 0).parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=10, help="clients trained per round")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    results = []
    try:
        for n in args.clients:
            # A fresh local SuperLink per size, so one run's leftovers do not count in the next.
            stop_superlinks()
            home = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
            results.append(run_one(n, args.rounds, args.per_round, home, home / "out"))
            print(f"{n} clients done: {results[-1]['wall']:.0f} s", flush=True)
    finally:
        stop_superlinks()
    print(f"\n{args.per_round} clients x {PER_CLIENT_IMAGES} images per round, "
          f"{args.rounds} rounds, FedInit, CNN; memory = peak resident MiB summed over processes")
    print(f"state per client (w_prev): {model_bytes() / 1024:.0f} KiB; 'state MiB' = clients "
          "that trained so far x that, held in the simulation process")
    cols = ["clients", "startup", "round1", "round", "wall", "clients-with-state", "state",
            *(f"peak {k}" for k in ROLES), "peak total"]
    heads = ["clients", "startup s", "round1 s", "round s", "wall s", "w/ state", "state MiB",
             "sim proc", "actors", "ray sys", "superlink", "cli", "total"]
    print("".join(f"{h:>10s}" for h in heads))
    for r in results:
        print("".join(f"{r[c]:10.0f}" if c in ("clients", "clients-with-state") or
                      c.startswith("peak") else f"{r[c]:10.1f}" for c in cols))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
