"""Start-up, time per round and memory against the number of simulated clients (to 10,000).

    .venv/bin/python -m bench.scale_clients                   # 100, 1000, 10000 clients
    .venv/bin/python -m bench.scale_clients --clients 100 1000 --per-round 10 --rounds 2
    .venv/bin/python -m bench.scale_clients --states disk     # only the new design

Each size runs once per clients-per-round (--per-round, capped at N: 100% participation) and
once per place of the client state (--states): ``disk`` (the default design: each client's
state in files, nothing in the simulation process between rounds) and ``memory`` (the design
before: Flower's ``context.state``, which the engine keeps in the simulation process). Every
client holds 50 images (iid, train-limit = 50 N, so at most 60,000 / N with Fashion-MNIST),
FedInit (FedAvg, beta 0.1), the CNN, 1 local epoch. While a run goes, every process under its
local SuperLink is sampled from /proc twice a second and its resident memory summed by role:

- simulation process: `flwr-simulation`, which runs the ServerApp AND Flower's simulation
  engine; the engine keeps every simulated node's Context (and so, with ``memory``, every
  trained client's ``context.state``);
- client actors: the Ray workers that run ClientApps (data and model caches);
- ray system: gcs_server, raylet, dashboard and log monitors;
- superlink: flower-superlink and its superexec; cli: flwr run and fedinit/cli/simulate.py.

Start-up is from starting fedinit/cli/simulate.py (which starts `flwr run`) to the server's first
results file, written just before round 1; it includes starting a fresh local SuperLink
(link "fresh"), or not, with ``--warm-superlink`` (link "warm": one SuperLink for every run,
as a researcher's second `flwr run` finds it).
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
from typing import Any

from fedinit.cli.flower_env import flower_env
from fedinit.methods.sampling import sample_clients

REPO = Path(__file__).resolve().parents[1]

HTTP_PORT, CONTROL_PORT = "39991", "39992"  # private: no test or other bench uses these
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
    """Samples the memory of the run's process tree; keeps per-role and total peaks, and the
    simulation process's memory when each round's row appears under ``out``."""

    def __init__(self, root: int, out: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.out = root, out
        self.stop = threading.Event()
        self.peak = dict.fromkeys(ROLES, 0)
        self.peak_total = 0
        self.sim_after_round: list[int] = []

    def rounds_done(self) -> int:
        found = list(self.out.glob("*/rounds.jsonl"))
        return len(found[0].read_text().splitlines()) if found else 0

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
            while len(self.sim_after_round) < self.rounds_done():
                self.sim_after_round.append(now[ROLES[0]])
            self.stop.wait(0.5)


def stop_superlinks(port: str = CONTROL_PORT) -> None:
    """Stop the local SuperLink a bench started (found by its private port), by pid."""
    for pid in our_superlinks(proc_table(), port):
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)


LONG_LIVED = (b"flower-superlink", b"flower-superexec")
"""A warm SuperLink's own processes: they stay between runs."""


def run_processes(home: Path, keep_superlink: bool = False) -> list[int]:
    """Pids of the processes started for the run whose Flower home is ``home`` (Ray's
    daemons and workers inherit the environment, and outlive the `flwr run` they serve),
    less the SuperLink's own when it is kept running."""
    marker = f"FLWR_HOME={home}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ and not (keep_superlink and any(x in cmdline for x in LONG_LIVED)):
            pids.append(int(entry))
    return pids


def wait_gone(home: Path, timeout: float = 120.0, keep_superlink: bool = False) -> None:
    """Wait until a finished run's processes have exited, so they do not slow the next run."""
    deadline = time.monotonic() + timeout
    while run_processes(home, keep_superlink) and time.monotonic() < deadline:
        time.sleep(0.5)


def run_one(n: int, rounds: int, per_round: int, state: str, home: Path,
            repo: Path = REPO, out: Path | None = None) -> dict[str, Any]:
    """One simulation of n clients, client state on ``state`` (``before``: the checkout
    ``repo`` as it is), Flower home ``home``, results under ``out`` (default: in the home);
    its timings and memory peaks."""
    out = out or home / "out"
    overrides: dict[str, Any] = {
        "num-clients": n, "fraction-train": per_round / n, "num-server-rounds": rounds,
        "partition": "iid", "train-limit": PER_CLIENT_IMAGES * n, "local-epochs": 1,
        "method": "fedavg", "beta": 0.1, "output-dir": str(out), "node-wait-timeout": 1800.0,
        "round-timeout": 3600.0}
    if state != "before":
        overrides["simulation-client-state"] = state
    env = flower_env(home, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=HTTP_PORT,
                     FLWR_LOCAL_CONTROL_API_PORT=CONTROL_PORT)
    cmd = [sys.executable, "-m", "fedinit.cli.simulate",
           *(f"{k}={v}" for k, v in overrides.items())]
    t0, t0_wall = time.monotonic(), time.time()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1, cwd=repo) as proc:
        sampler = Sampler(proc.pid, out)
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
    after = sampler.sim_after_round
    return {"clients": n, "per-round": per_round, "state": state, "wall": wall,
            "startup": startup, "round": sum(secs[1:]) / max(1, len(secs) - 1),
            "round1": secs[0], "clients-with-state": len(trained),
            "state MiB": len(trained) * model_bytes() / 2**20,
            **{f"peak {k}": v / 2**20 for k, v in sampler.peak.items()},
            "sim after last round": after[-1] / 2**20 if after else float("nan"),
            "peak total": sampler.peak_total / 2**20}


def model_bytes() -> int:
    """Bytes of one model-shaped state entry (FedInit's w_prev) of the CNN."""
    from fedinit.task.models import build_model

    return sum(p.numel() * 4 for p in build_model("cnn", 10, 1, 0).parameters())


COLUMNS = [("clients", "clients", "d"), ("per-round", "per rnd", "d"), ("state", "state", "s"),
           ("superlink", "link", "s"), ("startup", "start s", ".1f"),
           ("round1", "rnd1 s", ".1f"), ("round", "rnd s", ".1f"),
           ("clients-with-state", "trained", "d"), ("state MiB", "st MiB", ".1f"),
           ("peak simulation process", "sim peak", ".0f"),
           ("sim after last round", "sim end", ".0f"), ("peak client actors", "actors", ".0f"),
           ("peak ray system", "ray sys", ".0f"), ("peak superlink", "link MiB", ".0f"),
           ("peak cli", "cli", ".0f"), ("peak total", "total", ".0f")]


def table(results: list[dict[str, Any]]) -> str:
    """The results as fixed-width columns (MiB for memory, seconds for time)."""
    lines = ["".join(f"{head:>9s}" for _, head, _ in COLUMNS)]
    for r in results:
        lines.append("".join(f"{r[key]:>9{fmt}}" for key, _, fmt in COLUMNS))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, nargs="+", default=[10, 100],
                    help="clients trained per round (capped at the number of clients)")
    ap.add_argument("--states", nargs="+", choices=("disk", "memory"),
                    default=["disk", "memory"], help="where the client state lives")
    ap.add_argument("--before", type=Path, metavar="CHECKOUT",
                    help="also run this checkout as it is (e.g. `git worktree add /tmp/before "
                         "6e42896`: state in memory, every node asked for its partition)")
    ap.add_argument("--before-max-clients", type=int, default=1000,
                    help="run --before only up to this many clients (its start-up asks every "
                         "node, which Flower's engine serves in O(N^2))")
    ap.add_argument("--warm-superlink", action="store_true",
                    help="keep one local SuperLink running for all runs, as a second `flwr "
                         "run` finds it (start-up then leaves out starting it; an unmeasured "
                         "10-client run starts it first)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    if args.before and args.warm_superlink:
        # Measured: Ray's actors then import the ClientApp of the checkout that started the
        # SuperLink (its working directory), so "before" would run this checkout's client.
        ap.error("--before needs a fresh SuperLink per run (the running one would serve the "
                 "other checkout's ServerApp with this checkout's ClientApp); drop "
                 "--warm-superlink")
    results: list[dict[str, Any]] = []
    link = "warm" if args.warm_superlink else "fresh"
    try:
        warm_home = None
        if args.warm_superlink:  # every run shares the Flower home of the SuperLink it uses
            stop_superlinks()
            warm_home = Path(tempfile.mkdtemp(prefix="bench-scale-warm-"))
            run_one(10, 1, 10, "disk", warm_home, out=warm_home / "warmup")
            wait_gone(warm_home, keep_superlink=True)
        for per_round in args.per_round:
            for n in args.clients:
                states = list(args.states)
                if args.before and n <= args.before_max_clients:
                    states.append("before")
                for state in states:
                    # A fresh local SuperLink per run: one run's leftovers do not count in the
                    # next (unless --warm-superlink).
                    if not args.warm_superlink:
                        stop_superlinks()
                    run_home = Path(tempfile.mkdtemp(prefix=f"bench-scale-{n}-"))
                    home = warm_home or run_home
                    repo = args.before.resolve() if state == "before" else REPO
                    results.append({**run_one(n, args.rounds, min(per_round, n), state, home,
                                              repo, run_home / "out"), "superlink": link})
                    if not args.warm_superlink:
                        stop_superlinks()
                    wait_gone(home, keep_superlink=args.warm_superlink)
                    print(f"{n} clients, {min(per_round, n)} per round, state on {state}: "
                          f"{results[-1]['wall']:.0f} s", flush=True)
                    if args.json:
                        args.json.write_text(json.dumps(results, indent=2))
    finally:
        stop_superlinks()
    print(f"\n{PER_CLIENT_IMAGES} images per client (at most 60,000 / N), {args.rounds} rounds, "
          "FedInit, CNN, 1 local epoch; memory = peak resident MiB summed over processes")
    print(f"state per client (w_prev): {model_bytes() / 1024:.0f} KiB; 'trained' = clients that "
          "trained in the run, 'st MiB' = their state; 'sim end' = the simulation process "
          "after the last round")
    print(table(results))


if __name__ == "__main__":
    main()
