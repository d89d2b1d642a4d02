"""CPU of an idle fleet after a run: what a device pays all day for being ready, side by side.

    .venv/bin/python -m bench.idle_cpu                       # 3 nodes, every setting, 60 s idle
    .venv/bin/python -m bench.idle_cpu --nodes 3 --idle 60 --settings defaults flower

For each setting, a process deployment (TLS + node auth, ``fedinit/cli/deploy_local.py
--keep-running``) runs one short round; then the CPU time (user + system, /proc) of each
process is read over two spans: the ``--active-window`` right after the run (the node still
polls fast: a next round may come) and the ``--idle`` seconds after it (the idle device).
Printed per span, as % of one core: each node's SuperNode (``fedinit.node.launch``: the node, its
Runtime API), its executor (supervisor or flower-superexec) and warm worker, and the
SuperLink (with its ServerApp executor), also per connected node.

  defaults  node 0.2 s while active, 3 s idle, executor woken by its node
            (fedinit.flower_compat.supernode_waits)
  fixed     the fixed fast polls of before: node 0.5 s, executor 0.1 s, always
  flower    Flower's own: node 3 s, flower-superexec (1 s task poll, a process per message)
  idle10    the defaults with a 10 s idle poll (``--idle-poll 10``): the price of 3 s
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedinit.cli.deploy_local import descendants
from fedinit.cli.flower_env import REPO
from fedinit.node.launch import DEFAULT_ACTIVE_WINDOW

SETTINGS = {"defaults": [],
            "fixed": ["--node-poll", "0.5", "--idle-poll", "0.5", "--no-wake"],
            "flower": ["--executor", "flower", "--node-poll", "0"],
            "idle10": ["--idle-poll", "10"]}
TICKS = os.sysconf("SC_CLK_TCK")
ROLES = ("supernode", "executor", "worker")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def roles(pids: dict[str, int], nodes: int) -> dict[str, list[int]]:
    """{"superlink": [its tree], "node-i/supernode": [pid], "node-i/executor": [pid],
    "node-i/worker": [pids]}: the launcher is the SuperNode, its child the executor, the
    executor's children its workers."""
    out = {"superlink": descendants([pids["superlink"]])}
    for i in range(nodes):
        tree = descendants([pids[f"supernode-{i}"]])
        out[f"node-{i}/supernode"] = tree[:1]
        out[f"node-{i}/executor"] = tree[1:2]
        out[f"node-{i}/worker"] = tree[2:]
    return out


def sample(groups: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(cpu_seconds(p) for p in ps) for name, ps in groups.items()}


def measure(setting: str, nodes: int, window: float, idle: float, base_port: int,
            tmp: Path) -> dict[str, tuple[float, float]]:
    """{process group: (% of a core in the window after the run, % in the idle span)}."""
    work = tmp / setting
    cmd = [sys.executable, "-m", "fedinit.cli.deploy_local", "--num-nodes", str(nodes),
           "--work-dir", str(work), "--base-port", str(base_port), "--keep-running",
           *SETTINGS[setting], "num-server-rounds=1", "train-limit=300", "eval-every=1",
           f"output-dir={tmp / (setting + '-out')}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{setting}: deployment failed:\n{done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}")
        groups = roles(json.loads((work / "pids.json").read_text()), nodes)
        t0, c0 = time.monotonic(), sample(groups)
        time.sleep(window)
        t1, c1 = time.monotonic(), sample(groups)
        time.sleep(idle)
        t2, c2 = time.monotonic(), sample(groups)
    finally:
        subprocess.run([*cmd[:3], "--stop", "--work-dir", str(work)], capture_output=True,
                       cwd=REPO, check=False)
    return {g: (100 * (c1[g] - c0[g]) / (t1 - t0), 100 * (c2[g] - c1[g]) / (t2 - t1))
            for g in groups}


def per_role(res: dict[str, tuple[float, float]], nodes: int, span: int) -> dict[str, float]:
    """Mean over nodes of each role's %, and the SuperLink's (total and per node)."""
    out = {r: sum(res[f"node-{i}/{r}"][span] for i in range(nodes)) / nodes for r in ROLES}
    out["device"] = sum(out[r] for r in ROLES)
    out["superlink"] = res["superlink"][span]
    out["link/node"] = out["superlink"] / nodes
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--idle", type=float, default=60.0, help="idle span, seconds (default 60)")
    ap.add_argument("--active-window", type=float, default=DEFAULT_ACTIVE_WINDOW,
                    help="span right after the run, seconds "
                         "(default: fedinit.node.launch's window)")
    ap.add_argument("--settings", nargs="*", default=["defaults", "fixed", "flower"],
                    choices=list(SETTINGS))
    ap.add_argument("--base-port", type=int, default=29700)
    args = ap.parse_args()
    cols = ("supernode", "executor", "worker", "device", "superlink", "link/node")
    print(f"idle CPU, % of one core, {args.nodes} nodes (TLS + auth); per node = mean over "
          f"nodes; first {args.active_window:g} s after a run, then {args.idle:g} s idle")
    print(f"{'setting':<9} {'span':<7} " + " ".join(f"{c:>9}" for c in cols))
    with tempfile.TemporaryDirectory(prefix="fedinit-idle-") as tmp_name:
        for setting in args.settings:
            res = measure(setting, args.nodes, args.active_window, args.idle, args.base_port,
                          Path(tmp_name))
            for span, name in ((0, "after"), (1, "idle")):
                row = per_role(res, args.nodes, span)
                print(f"{setting:<9} {name:<7} " + " ".join(f"{row[c]:9.2f}" for c in cols),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
