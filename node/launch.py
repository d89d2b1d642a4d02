"""Start a SuperNode with its warm ClientApp executor: the one way this project runs a node.

    python -m node.launch [--executor warm|flower] [--poll S] [--node-poll S] \
        [--task-deadline S] -- <flower-supernode arguments>

The SuperNode runs in this process, in ``--isolation process`` with its Runtime API on
loopback (only the executor beside it may reach it: it hands out this client's messages).
The executor is a child process: the warm one (``node.warm_executor``), or with
``--executor flower`` Flower's own ``flower-superexec`` (a new process per message; kept for
comparison and as a fallback). The same command serves the process deployment, the
docker-compose stack and the edge kit, so all three behave alike.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import math
import os
import subprocess
import sys
from pathlib import Path

DEFAULT_RUNTIME_PORT = 9094
LOOPBACK = "127.0.0.1"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options before ``--``; flower-supernode's after it."""
    ours, node_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m node.launch", description=__doc__)
    p.add_argument("--executor", choices=("warm", "flower"), default="warm",
                   help="warm: node.warm_executor (default); flower: flower-superexec, "
                        "a new process per message")
    p.add_argument("--poll", type=float, default=0.1,
                   help="the warm executor's task poll when idle, seconds (default 0.1)")
    p.add_argument("--node-poll", type=float, default=0.5,
                   help="the SuperNode's pull interval when idle, seconds (Flower: 3; "
                        "default 0.5); 0 keeps Flower's own waits")
    p.add_argument("--status-file", type=Path,
                   help="the warm executor writes its counters here after each task")
    p.add_argument("--task-deadline", type=float, default=0.0,
                   help="warm executor: kill a task running longer than this many seconds "
                        "and answer it with an error reply; wins over the run config's "
                        "task-deadline (default 0: the run config decides)")
    args = p.parse_args(ours)
    if not (math.isfinite(args.task_deadline) and args.task_deadline >= 0):
        p.error(f"--task-deadline {args.task_deadline} is not allowed; allowed: 0 (the run "
                "config decides) or a number of seconds > 0")
    if args.task_deadline and args.executor != "warm":
        p.error("--task-deadline is not allowed with --executor flower; allowed: with the "
                "warm executor (Flower's own has no task deadline)")
    if args.node_poll and not 0.05 <= args.node_poll <= 3:
        p.error(f"--node-poll {args.node_poll} is not allowed; allowed: 0 or 0.05 to 3")
    return args, node_args


def runtime_address(node_args: list[str]) -> tuple[list[str], str]:
    """flower-supernode's arguments in process isolation, and its Runtime API address.

    The Runtime API must stay on loopback: whoever reaches it can take this client's tasks.
    """
    def value(flag: str) -> str | None:
        for i, a in enumerate(node_args):
            if a == flag and i + 1 < len(node_args):
                return node_args[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None

    isolation = value("--isolation")
    if isolation not in (None, "process"):
        raise SystemExit(f"node.launch: --isolation {isolation} is not allowed; the "
                         "executor runs beside the node (process isolation)")
    host = value("--host") or LOOPBACK
    if not ipaddress.ip_address(host).is_loopback:
        raise SystemExit(f"node.launch: --host {host} is not allowed; allowed: a loopback "
                         "address (the Runtime API hands out this client's messages)")
    port = value("--port") or str(DEFAULT_RUNTIME_PORT)
    args = [a for a in node_args if a != "--isolation" and not a.startswith("--isolation=")]
    if isolation is not None:
        args.remove("process")
    return [*args, "--isolation", "process"], f"{host}:{port}"


def executor_command(args: argparse.Namespace, address: str) -> list[str]:
    parent = ["--parent-pid", str(os.getpid())]
    if args.executor == "flower":
        return ["flower-superexec", "--insecure", "--runtime-api-address", address, *parent]
    cmd = [sys.executable, "-m", "node.warm_executor", "--runtime-api-address", address,
           "--insecure", "--poll", str(args.poll), *parent]
    if args.task_deadline:
        cmd += ["--task-deadline", str(args.task_deadline)]
    return cmd + (["--status-file", str(args.status_file)] if args.status_file else [])


def plain_logs_off_terminal() -> None:
    """Flower colours every log line; a log file (not a terminal) gets them plain."""
    if not sys.stderr.isatty():
        from flwr.supercore.logger import update_console_handler

        update_console_handler(colored=False)


def main(argv: list[str] | None = None) -> None:
    args, node_args = parse_args(sys.argv[1:] if argv is None else argv)
    plain_logs_off_terminal()
    node_args, address = runtime_address(node_args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), *filter(None, [env.get("PYTHONPATH")])])
    executor = subprocess.Popen(executor_command(args, address), env=env)

    def stop_executor() -> None:
        if executor.poll() is None:
            executor.terminate()
            try:
                executor.wait(10)
            except subprocess.TimeoutExpired:
                executor.kill()

    atexit.register(stop_executor)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    if args.node_poll:
        from node.fast_poll import install

        install(idle=args.node_poll, reply=min(0.05, args.node_poll))
    sys.argv = ["flower-supernode", *node_args]
    try:
        flower_supernode()
    finally:
        stop_executor()


if __name__ == "__main__":
    main()
