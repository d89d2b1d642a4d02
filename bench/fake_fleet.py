"""One SuperLink under many light fake SuperNodes: its CPU, memory and round time at scale.

    .venv/bin/python -m bench.fake_fleet --nodes 10 100 1000
    .venv/bin/python -m bench.fake_fleet --nodes 100 --rounds 3 --procs 4 --poll 0.2 --idle-poll 3

A real SuperLink (TLS, ``--enable-supernode-auth``, gRPC Fleet API, as
``fedinit/cli/deploy_local.py`` starts it) gets N registered keys (the Control API's
RegisterNode, what ``flwr supernode register`` calls). N fake SuperNodes, threads in
``--procs`` processes, each connect with Flower's own gRPC connection
(``grpc_request_response``: ActivateNode, heartbeats, node auth signing every request) and
behave like this project's nodes: pull every ``--poll`` s for ``--active-window`` s after a
message, else every ``--idle-poll`` s; fetch the run and FAB once per run; pull a message's
objects, answer train with the arrays + 0.01 and ``num-examples`` (a ``--dim``-float model),
push the reply's objects. A tiny ServerApp (written to a temp dir) waits for all N nodes,
then runs ``--rounds`` rounds of FedAvg over all of them, pulling replies every 0.1 s.

Printed per N: registration time, the SuperLink's CPU (% of one core; the link process
alone, and with its ServerApp) and memory (RSS, peak) while the N nodes idle
(``--idle-seconds``) and during the rounds, the mean round time and the replies per round.
The fake nodes run on the same cores as the SuperLink: their CPU is printed too. Per round,
the ServerApp reads the SuperLink's own CPU seconds (/proc/<pid>/stat, utime + stime, all
its threads), its own and the fake nodes' at the round's start and end: the link's CPU per
node-round, apart from the load generator's. ``--profile DIR`` samples the SuperLink with
py-spy (``--nonblocking``: the link is never paused) during the run and prints the functions
holding most of its samples.

    nice -n 10 .venv/bin/python -m bench.fake_fleet --nodes 1000 --rounds 2 --poll 1 \
        --idle-poll 10 --idle-seconds 20 --link-state memory --profile outputs/prof
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.idle_cpu import cpu_seconds
from fedinit.cli.deploy_local import CONNECTION, Deployment, descendants, stop_pids
from fedinit.node.warm_executor import rss_mib

ROUND_LINE = re.compile(r"FAKEFLEET round (\d+) replies (\d+)/(\d+) seconds ([0-9.]+)")
ERROR_LINE = re.compile(r"FAKEFLEET round (\d+) error replies (\d+): ([^\n]*)")
CPU_LINE = re.compile(r"FAKEFLEET round (\d+) cpu link ([0-9.]+) app ([0-9.]+) fleet ([0-9.]+)")
APP_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fakefleet"
version = "1.0.0"
license = "Apache-2.0"
dependencies = ["flwr==1.39.0", "numpy"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedinit"

[tool.flwr.app.components]
serverapp = "fakeapp:server"
clientapp = "fakeapp:client"

[tool.flwr.app.config]
nodes = 10
rounds = 3
dim = 1000
node-wait = 600
round-timeout = 600
link-pid = 0
fleet-pids = ""
"""
APP_CODE = '''"""The fake fleet's tiny app: FedAvg over all nodes, replies pulled every 0.1 s."""
import os
import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from logging import INFO

server = ServerApp()
client = ClientApp()  # never runs: the fake nodes answer themselves


def cpu(pids):
    """User + system CPU seconds of ``pids`` from /proc (0 for one that is gone)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    n, dim = int(cfg["nodes"]), int(cfg["dim"])
    end = time.monotonic() + float(cfg["node-wait"])
    while len(nodes := list(grid.get_node_ids())) < n and time.monotonic() < end:
        time.sleep(1)
    log(INFO, "FAKEFLEET nodes %d", len(nodes))
    w = np.zeros(dim, dtype=np.float32)
    link = [int(cfg["link-pid"])] if int(cfg["link-pid"]) else []
    fleet = [int(p) for p in str(cfg["fleet-pids"]).split(",") if p]
    for r in range(1, int(cfg["rounds"]) + 1):
        cpu0 = (cpu(link), time.process_time(), cpu(fleet))
        t0 = time.monotonic()
        msgs = [Message(RecordDict({"arrays": ArrayRecord([w]),
                                    "config": ConfigRecord({"server-round": r})}),
                        dst_node_id=node, message_type="train") for node in nodes]
        waiting = set(grid.push_messages(msgs))
        got = []
        errors: dict[str, int] = {}
        deadline = t0 + float(cfg["round-timeout"])
        while waiting and time.monotonic() < deadline:
            replies = list(grid.pull_messages(waiting))
            got += [m for m in replies if not m.has_error()]
            for m in replies:
                if m.has_error():
                    why = f"{m.error.code}: {m.error.reason}"[:120]
                    errors[why] = errors.get(why, 0) + 1
            waiting.difference_update(m.metadata.reply_to_message_id for m in replies)
            if waiting:
                time.sleep(0.1)
        if got:
            w = np.mean([m.content.array_records["arrays"].to_numpy_ndarrays()[0]
                         for m in got], axis=0)
        log(INFO, "FAKEFLEET round %d replies %d/%d seconds %.3f", r, len(got), len(nodes),
            time.monotonic() - t0)
        log(INFO, "FAKEFLEET round %d cpu link %.2f app %.2f fleet %.2f", r,
            cpu(link) - cpu0[0], time.process_time() - cpu0[1], cpu(fleet) - cpu0[2])
        for why, count in sorted(errors.items()):
            log(INFO, "FAKEFLEET round %d error replies %d: %s", r, count, why)
'''


# ------------------------------------------------------------------------------ fake nodes
def fake_node(key_pem: bytes, address: str, ca: bytes, poll: float, idle_poll: float,
              window: float, stop: Any, counts: dict[str, int]) -> None:
    """One SuperNode: Flower's gRPC connection, the project's adaptive pulls, train replies."""
    from cryptography.hazmat.primitives import serialization
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.client.grpc_rere_client.connection import grpc_request_response
    from flwr.supercore.grpc import GRPC_MAX_MESSAGE_LENGTH
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        no_object_id_recompute,
    )
    from flwr.supercore.inflatable.inflatable_utils import (
        pull_and_inflate_object_from_tree,
        push_object_contents_from_iterable,
    )
    from flwr.supercore.retry import make_simple_grpc_retry_invoker

    private = serialization.load_pem_private_key(key_pem, None)
    keys = (private, private.public_key())  # type: ignore[union-attr]
    runs: set[int] = set()
    last_message = -1e9
    with grpc_request_response(address, False, make_simple_grpc_retry_invoker(),
                               GRPC_MAX_MESSAGE_LENGTH, ca, keys) as conn:  # type: ignore[arg-type]
        _node_id, receive, send, get_run, get_fab, pull_object, push_object, confirm = conn
        counts["connected"] += 1
        while not stop.is_set():
            got = receive()
            if got is None:
                active = time.monotonic() - last_message < window
                stop.wait(poll if active else idle_poll)
                continue
            t0 = last_message = time.monotonic()
            message, tree = got
            run_id = message.metadata.run_id
            if run_id not in runs:  # a real node fetches the run and its FAB once
                get_fab(get_run(run_id).fab_hash, run_id)
                runs.add(run_id)
            msg = pull_and_inflate_object_from_tree(
                tree, partial(pull_object, run_id), partial(confirm, run_id),
                return_type=Message, initial_backoff=0.05)
            msg.metadata.__dict__["_message_id"] = tree.object_id
            arrays = msg.content.array_records["arrays"].to_numpy_ndarrays()
            reply = Message(RecordDict({
                "arrays": ArrayRecord([a + 0.01 for a in arrays]),
                "metrics": MetricRecord({"num-examples": 10})}), reply_to=msg)
            with no_object_id_recompute():
                reply.metadata.__dict__["_message_id"] = reply.object_id
                objects = get_all_nested_objects(reply)
                reply_tree = get_object_tree(reply)
            to_push, session = send(reply, reply_tree, time.monotonic() - t0)
            push_object_contents_from_iterable(
                ((oid, obj.deflate()) for oid, obj in objects.items() if oid in to_push),
                partial(push_object, run_id, session))
            counts["replies"] += 1


def fleet_process(keys: list[bytes], address: str, ca: bytes, poll: float, idle_poll: float,
                  window: float, stop: Any, ready: Any) -> None:
    """Many fake nodes in one process, a thread each."""
    threading.excepthook = lambda _args: None  # heartbeats cancelled at teardown: not news
    counts = {"connected": 0, "replies": 0, "failed": 0}
    threads = [threading.Thread(target=_guarded, daemon=True,
                                args=(k, address, ca, poll, idle_poll, window, stop, counts))
               for k in keys]
    for t in threads:
        t.start()
        time.sleep(0.005)  # spread the activations a little
    while counts["connected"] + counts["failed"] < len(keys) and not stop.is_set():
        time.sleep(0.2)
    ready.put(counts["connected"])
    stop.wait()
    end = time.monotonic() + 10
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))


def _guarded(*args: Any) -> None:
    """A node whose connection fails (the link too busy to answer ActivateNode in time)
    counts as failed, not as a hang."""
    try:
        fake_node(*args)
    except Exception:  # noqa: BLE001 - counted, the others go on
        args[-1]["failed"] += 1


# ------------------------------------------------------------------------------ the link
def make_keys(n: int) -> list[tuple[bytes, bytes]]:
    """(private PEM, public bytes as RegisterNode wants them) for ``n`` P-384 keys."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    out = []
    for _ in range(n):
        k = ec.generate_private_key(ec.SECP384R1())
        pem = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
        out.append((pem, public_key_to_bytes(k.public_key())))
    return out


def register_all(dep: Deployment, publics: list[bytes]) -> None:
    """RegisterNode for each key through one Control API client (the CLI's ~2 s per call is
    its own start-up)."""
    os.environ["FLWR_HOME"] = str(dep.cli_home)
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.proto.control_pb2 import RegisterNodeRequest

    client = init_http_client_from_connection(read_superlink_connection(CONNECTION))
    try:
        for pub in publics:
            if not client.RegisterNode(RegisterNodeRequest(public_key=pub)).node_id:
                raise RuntimeError("RegisterNode returned no node id")
    finally:
        client.close()


class LinkSampler:
    """CPU seconds and RSS of the SuperLink process (and of its whole tree: the ServerApp)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.peak_rss = max(self.peak_rss, rss_mib(self.pid) or 0.0)

    def cpu(self) -> tuple[float, float]:
        """(link process, link + children) CPU seconds so far."""
        return cpu_seconds(self.pid), sum(cpu_seconds(p) for p in descendants([self.pid]))

    def close(self) -> None:
        self._stop.set()


def run_scale(n: int, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    work = tmp / f"n{n}"
    dep = Deployment(work, num_nodes=1, base_port=args.base_port, link_state=args.link_state)
    app = tmp / "fakeapp"
    app.mkdir(exist_ok=True)
    (app / "pyproject.toml").write_text(APP_PYPROJECT)
    (app / "fakeapp.py").write_text(APP_CODE)
    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Queue()
    procs: list[Any] = []
    out: dict[str, float] = {"nodes": n}
    try:
        dep.prepare()
        link = dep.start_link()
        keys = make_keys(n)
        t0 = time.monotonic()
        register_all(dep, [pub for _, pub in keys])
        out["register-s"] = time.monotonic() - t0
        ca = (dep.certs / "ca.crt").read_bytes()
        per = -(-n // args.procs)
        t0 = time.monotonic()
        for i in range(0, n, per):
            p = ctx.Process(target=fleet_process, daemon=True, args=(
                [k for k, _ in keys[i:i + per]], dep.fleet_address, ca, args.poll,
                args.idle_poll, args.active_window, stop, ready))
            p.start()
            procs.append(p)
        connected = sum(ready.get(timeout=600) for _ in procs)
        out["connect-s"] = time.monotonic() - t0
        out["connected"] = connected
        sampler = LinkSampler(link.popen.pid)
        fleet_pids = [p.pid for p in procs]
        c0, f0, w0 = sampler.cpu(), sum(cpu_seconds(p) for p in fleet_pids), time.monotonic()
        time.sleep(args.idle_seconds)
        c1, f1, w1 = sampler.cpu(), sum(cpu_seconds(p) for p in fleet_pids), time.monotonic()
        out["idle-link-%"] = 100 * (c1[0] - c0[0]) / (w1 - w0)
        out["idle-fleet-%"] = 100 * (f1 - f0) / (w1 - w0)
        out["idle-rss"] = rss_mib(link.popen.pid) or 0.0
        print(f"  {n} nodes: {connected} up; registered in {out['register-s']:.1f} s, "
              f"connected in {out['connect-s']:.1f} s; idle: link {out['idle-link-%']:.1f}% "
              f"({out['idle-link-%'] / n:.3f}% per node), fake nodes {out['idle-fleet-%']:.0f}%,"
              f" link RSS {out['idle-rss']:.0f} MiB; now the run", flush=True)
        cmd = ["flwr", "run", str(app), CONNECTION, "--stream", "--run-config",
               f"nodes={connected} rounds={args.rounds} dim={args.dim} "
               f"link-pid={link.popen.pid} fleet-pids=\"{','.join(map(str, fleet_pids))}\""]
        raw = Path(args.profile or tmp) / f"superlink-{n}-{args.link_state}.txt"
        spy = profiler(args, link.popen.pid, raw)
        try:
            run = subprocess.run(cmd, env=dep.cli_env(), capture_output=True, text=True,
                                 timeout=args.run_timeout, check=False)
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
                spy.wait(60)
        c2, f2, w2 = sampler.cpu(), sum(cpu_seconds(p) for p in fleet_pids), time.monotonic()
        sampler.close()
        done = {int(r[0]): (int(r[1]), int(r[2]), float(r[3]))  # round: got, sent, seconds
                for r in ROUND_LINE.findall(run.stdout)}
        for m in CPU_LINE.finditer(run.stdout):  # the link's own CPU per node-round
            rnd, link_s, app_s, fleet_s = int(m.group(1)), *map(float, m.groups()[1:])
            got, sent, secs = done[rnd]
            out[f"round{rnd}-link-ms"] = 1000 * link_s / max(sent, 1)
            print(f"  {n} nodes, round {rnd}: SuperLink CPU {link_s:.1f} s = "
                  f"{1000 * link_s / max(sent, 1):.1f} ms per node messaged "
                  f"({1000 * link_s / max(got, 1):.1f} ms per reply, {got}/{sent}); its "
                  f"ServerApp {app_s:.1f} s; fake nodes {fleet_s:.1f} s", flush=True)
            if args.poll == args.idle_poll:  # the same pull rate in and out of the round
                net = link_s - out["idle-link-%"] / 100 * secs
                print(f"    less the idle pulls' {out['idle-link-%']:.1f}% over its {secs:.1f} s: "
                      f"{net:.1f} s = {1000 * net / max(got, 1):.1f} ms per reply", flush=True)
        if spy is not None:
            print(profile_summary(raw, args.top), flush=True)
        rounds = [m.groups() for m in ROUND_LINE.finditer(run.stdout)]
        for m in ERROR_LINE.finditer(run.stdout):
            print(f"  {n} nodes, round {m.group(1)}: {m.group(2)} error replies ({m.group(3)})",
                  flush=True)
        if not rounds:
            raise RuntimeError(f"n={n}: no rounds in the run's output:\n{run.stdout[-3000:]}"
                               f"{run.stderr[-2000:]}")
        out["round-s"] = statistics.mean(float(r[3]) for r in rounds[1:] or rounds)
        out["round1-s"] = float(rounds[0][3])
        out["replies"] = min(int(r[1]) / int(r[2]) for r in rounds)
        out["run-link-%"] = 100 * (c2[0] - c1[0]) / (w2 - w1)
        out["run-tree-%"] = 100 * (c2[1] - c1[1]) / (w2 - w1)
        out["run-fleet-%"] = 100 * (f2 - f1) / (w2 - w1)
        out["peak-rss"] = sampler.peak_rss
    finally:
        stop.set()
        for p in procs:
            p.join(15)
            if p.is_alive():
                p.kill()
        stop_pids([p.popen.pid for p in dep.procs])
    return out


def profiler(args: argparse.Namespace, pid: int, raw: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the SuperLink (``--profile``), its samples to ``raw`` (collapsed
    stacks); without blocking the link, so its CPU figures stay its own."""
    if not args.profile:
        return None
    raw.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [args.py_spy, "record", "--pid", str(pid), "--rate", "50", "--nonblocking",
         "--format", "raw", "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


IDLE_LEAVES = ("Condition.wait (", "_worker (concurrent/futures/thread", "Runner.run (",
               "Queue.get (", "Event.wait (", "_serve (grpc/_server",
               "_stream_logs (flwr/superlink/servicer/control/control_handlers")
"""Leaf frames of a thread that waits (a lock, a work queue, the event loop's or gRPC's
poll, the log stream's sleep: in C below the frame): py-spy's ``--nonblocking`` samples
keep some of them."""
PARTS = (("node auth: signature checks", ("asymmetric.py", "node_auth_server_interceptor")),
         ("link state", ("linkstate",)),
         ("object store", ("object_store",)),
         ("log streaming to `flwr run --stream`", ("_stream_logs",)),  # its state reads
         ("Runtime API (HTTP: the ServerApp's calls)",
          ("uvicorn/", "starlette/", "fastapi/", "anyio/", "httptools", "h11/")),
         ("Fleet API: gRPC server and TLS", ("grpc/", "ssl.py")))
"""Where an active sample's time goes: the first part whose pattern a frame holds, from
the leaf up (the most specific), else "other"."""


def profile_summary(raw: Path, top: int) -> str:
    """Where the link's active samples go: by part (PARTS), by own samples (the leaf frame)
    and by inclusive samples (anywhere on the stack), in % of the active samples; samples
    whose leaf waits (IDLE_LEAVES) are counted apart."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    parts: dict[str, int] = {}
    total = idle = 0
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        total += int(count)
        if frames[-1].startswith(IDLE_LEAVES):
            idle += int(count)
            continue
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + int(count)
        part = next((name for f in reversed(frames) for name, pats in PARTS
                     if any(p in f for p in pats)), "other")
        parts[part] = parts.get(part, 0) + int(count)
    active = total - idle
    if not active:
        return f"  no active samples in {raw}"
    lines = [f"  profile of the SuperLink ({total} samples at 50/s, {active} active, {idle} "
             f"waiting; {raw.name}), in % of the active:"]
    for title, table in (("part", parts), ("own", own), ("inclusive", inclusive)):
        lines.append(f"    by {title}:")
        for f, c in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"    {100 * c / active:5.1f}%  {f}")
    return "\n".join(lines)


if __name__ == "__main__" and sys.argv[1:2] == ["--summarize"]:  # a kept profile, again
    print(profile_summary(Path(sys.argv[2]), int(sys.argv[3]) if sys.argv[3:] else 25))
    sys.exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--procs", type=int, default=4, help="fake-node processes (default 4)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dim", type=int, default=1000, help="model floats (default 1000)")
    ap.add_argument("--poll", type=float, default=0.2,
                    help="pull interval while active, s (fedinit.node.launch's default 0.2)")
    ap.add_argument("--idle-poll", type=float, default=3.0,
                    help="pull interval when idle, s (fedinit.node.launch's default 3)")
    ap.add_argument("--active-window", type=float, default=30.0)
    ap.add_argument("--idle-seconds", type=float, default=20.0,
                    help="span over which the idle nodes' load is measured (default 20)")
    ap.add_argument("--run-timeout", type=float, default=1800.0)
    ap.add_argument("--base-port", type=int, default=29600)
    ap.add_argument("--link-state", choices=("sqlite", "memory"), default="sqlite",
                    help="the SuperLink's state (fedinit-deploy --link-state; default sqlite)")
    ap.add_argument("--profile", default="", metavar="DIR",
                    help="sample the SuperLink with py-spy during the run, keep its collapsed "
                         "stacks in DIR, print where its time goes")
    ap.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    ap.add_argument("--top", type=int, default=25, help="functions per profile table")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the link and nodes too
    print(f"fake fleet: TLS + node auth, {args.procs} fake-node processes, model {args.dim} "
          f"floats, pulls {args.poll:g} s active / {args.idle_poll:g} s idle, {args.rounds} "
          f"rounds; CPU in % of one core (2-core machine: fake nodes and link share it)")
    print(f"{'nodes':>6} {'up':>5} {'register':>9} {'connect':>8} | {'idle link':>9} "
          f"{'per node':>8} {'fleet':>6} {'RSS':>6} | {'round 1':>7} {'round':>7} {'replies':>7} "
          f"{'link':>6} {'+app':>6} {'fleet':>6} {'peak RSS':>8}")
    with tempfile.TemporaryDirectory(prefix="fedinit-fakefleet-") as tmp_name:
        for n in args.nodes:
            r = run_scale(n, args, Path(tmp_name))
            print(f"{n:6d} {r['connected']:5.0f} {r['register-s']:8.1f}s {r['connect-s']:7.1f}s | "
                  f"{r['idle-link-%']:8.1f}% {r['idle-link-%'] / n:7.3f}% "
                  f"{r['idle-fleet-%']:5.0f}% {r['idle-rss']:5.0f}M | {r['round1-s']:6.2f}s "
                  f"{r['round-s']:6.2f}s {100 * r['replies']:6.0f}% {r['run-link-%']:5.0f}% "
                  f"{r['run-tree-%']:5.0f}% {r['run-fleet-%']:5.0f}% {r['peak-rss']:7.0f}M",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
