"""Start a SuperNode with its warm ClientApp executor: the one way this project runs a node.

    python -m fedinit.node.launch [--executor warm|flower] [--poll S] [--node-poll S] \
        [--idle-poll S] [--active-window S] [--task-deadline S] [--slowdown FACTOR] \
        -- <flower-supernode arguments>

The SuperNode runs in this process, in ``--isolation process`` with its Runtime API on
loopback (only the executor beside it may reach it: it hands out this client's messages).
The executor is a child process: the warm one (``fedinit.node.warm_executor``), or with
``--executor flower`` Flower's own ``flower-superexec`` (a new process per message; kept for
comparison and as a fallback). The same command serves the process deployment, the
docker-compose stack and the edge kit, so all three behave alike.

Flower's SuperNode is bent only through ``flower_compat.install("supernode")`` (its reply
order, its waits, its object pulls; ``docs/flower_compat.md``), and the warm executor runs
only while its guard passes (else Flower's ``flower-superexec``, with one warning). Waits
(``fedinit.flower_compat.supernode_waits``): for ``--active-window`` seconds after a message the
SuperNode pulls every ``--node-poll`` seconds, afterwards every ``--idle-poll``; the warm executor
does not poll at all while it can be woken: the node wakes it through a pipe when a message
waits for it (``--poll`` is its interval only where the node cannot: ``--node-poll 0``).

Only approved apps (``fedinit.node.app_allowlist``): where the node config names an
``approved-apps``
file (or ``<state-dir>/approved-apps.txt`` exists), a bad file stops the node here with its
one line; the SuperNode refuses every other run before it stores its FAB
(``fedinit.flower_compat.app_allowlist``) and the warm executor checks again before it forks or
installs anything. Where that SuperNode check declines, ``--executor flower`` is refused
(Flower's executor would install any FAB it is handed).
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedinit.node.app_allowlist import Allowlist

DEFAULT_RUNTIME_PORT = 9094
DEFAULT_NODE_POLL = 0.2
"""Seconds between the SuperNode's pulls while a run is active."""
DEFAULT_IDLE_POLL = 3.0
"""Seconds between its pulls when idle: Flower's own interval."""
DEFAULT_ACTIVE_WINDOW = 30.0
"""Seconds after a message that the node counts as active."""
LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options before ``--``; flower-supernode's after it."""
    ours, node_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m fedinit.node.launch", description=__doc__)
    p.add_argument("--executor", choices=("warm", "flower"), default="warm",
                   help="warm: fedinit.node.warm_executor (default); flower: flower-superexec, "
                        "a new process per message")
    p.add_argument("--poll", type=float, default=0.1,
                   help="the warm executor's task poll where the node cannot wake it "
                        "(--node-poll 0), seconds (default 0.1)")
    p.add_argument("--node-poll", type=float, default=DEFAULT_NODE_POLL,
                   help="the SuperNode's pull interval while a run is active, seconds "
                        f"(Flower: 3; default {DEFAULT_NODE_POLL:g}); 0 keeps Flower's own "
                        "waits and the executor polls every --poll")
    p.add_argument("--idle-poll", type=float, default=DEFAULT_IDLE_POLL,
                   help="the SuperNode's pull interval when idle (no message for "
                        f"--active-window seconds), seconds (default {DEFAULT_IDLE_POLL:g})")
    p.add_argument("--active-window", type=float, default=DEFAULT_ACTIVE_WINDOW,
                   help="seconds after a message during which the node pulls every "
                        f"--node-poll (default {DEFAULT_ACTIVE_WINDOW:g})")
    p.add_argument("--no-wake", action="store_true",
                   help="the warm executor polls every --poll instead of being woken by the "
                        "node (the fixed polls of before, for comparison)")
    p.add_argument("--status-file", type=Path,
                   help="the warm executor writes its counters here after each task")
    p.add_argument("--task-deadline", type=float, default=0.0,
                   help="warm executor: kill a task running longer than this many seconds "
                        "and answer it with an error reply; wins over the run config's "
                        "task-deadline (default 0: the run config decides)")
    p.add_argument("--slowdown", type=str, default=None, metavar="FACTOR",
                   help="this node trains FACTOR x its real compute time (it sleeps (FACTOR - "
                        "1) x its training time after building each train reply; the reply's "
                        "compute-seconds stay the real ones): a slow device for tests and "
                        "demos; written to the node config as slowdown=FACTOR (default 1)")
    args = p.parse_args(ours)
    if args.slowdown is not None:
        from fedinit.node.slowdown import SlowdownError, check_factor

        try:
            args.slowdown = check_factor(args.slowdown)
        except SlowdownError as err:
            p.error(f"--{err}")
    if not (math.isfinite(args.task_deadline) and args.task_deadline >= 0):
        p.error(f"--task-deadline {args.task_deadline} is not allowed; allowed: 0 (the run "
                "config decides) or a number of seconds > 0")
    if args.task_deadline and args.executor != "warm":
        p.error("--task-deadline is not allowed with --executor flower; allowed: with the "
                "warm executor (Flower's own has no task deadline)")
    if args.node_poll and not 0.05 <= args.node_poll <= 3:
        p.error(f"--node-poll {args.node_poll} is not allowed; allowed: 0 or 0.05 to 3")
    if not 0.05 <= args.idle_poll <= 60:
        p.error(f"--idle-poll {args.idle_poll} is not allowed; allowed: 0.05 to 60 seconds")
    if not (math.isfinite(args.active_window) and args.active_window >= 0):
        p.error(f"--active-window {args.active_window} is not allowed; allowed: 0 or more "
                "seconds")
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
        raise SystemExit(f"fedinit.node.launch: --isolation {isolation} is not allowed; the "
                         "executor runs beside the node (process isolation)")
    host = value("--host") or LOOPBACK
    if not ipaddress.ip_address(host).is_loopback:
        raise SystemExit(f"fedinit.node.launch: --host {host} is not allowed; allowed: a loopback "
                         "address (the Runtime API hands out this client's messages)")
    port = value("--port") or str(DEFAULT_RUNTIME_PORT)
    args = [a for a in node_args if a != "--isolation" and not a.startswith("--isolation=")]
    if isolation is not None:
        args.remove("process")
    return [*args, "--isolation", "process"], f"{host}:{port}"


def with_slowdown(node_args: list[str], factor: float | None) -> list[str]:
    """flower-supernode's arguments with ``slowdown=FACTOR`` added to its (last)
    ``--node-config`` (or one of its own); a node config that names it too is refused
    (Flower's parser refuses a key given twice)."""
    if factor is None:
        return node_args
    entry = f"slowdown={factor!r}"
    args = list(node_args)
    for i in range(len(args) - 1, -1, -1):
        flag, _, inline = args[i].partition("=")
        if flag != "--node-config" or (not inline and i + 1 == len(args)):
            continue
        at = i if inline else i + 1
        if re.search(r"(^|\s)slowdown\s*=", args[at].partition("=")[2] if inline else args[at]):
            raise SystemExit("fedinit.node.launch: --slowdown and a node config slowdown=... are "
                             "both given; allowed: one of them")
        args[at] = f"{args[at]} {entry}"
        return args
    return [*args, "--node-config", entry]


def executor_command(args: argparse.Namespace, address: str,
                     wake_fd: int | None = None, approved: Path | None = None) -> list[str]:
    """The executor's command; with ``wake_fd`` the warm one waits on it (the node wakes it)
    and polls only every ``--idle-poll`` seconds, in case; with ``approved`` it runs only the
    apps in that file."""
    parent = ["--parent-pid", str(os.getpid())]
    if args.executor == "flower":
        return ["flower-superexec", "--insecure", "--runtime-api-address", address, *parent]
    poll = args.poll if wake_fd is None else args.idle_poll
    cmd = [sys.executable, "-m", "fedinit.node.warm_executor", "--runtime-api-address", address,
           "--insecure", "--poll", str(poll), *parent]
    if wake_fd is not None:
        cmd += ["--wake-fd", str(wake_fd)]
    if args.task_deadline:
        cmd += ["--task-deadline", str(args.task_deadline)]
    if approved is not None:
        cmd += ["--approved-apps", str(approved)]
    return cmd + (["--status-file", str(args.status_file)] if args.status_file else [])


def chosen_executor(requested: str) -> str:
    """``requested``; but the warm executor mirrors Flower's ``flwr-clientapp``, so it runs
    only while that source reads as checked (else Flower's own, with one warning)."""
    from fedinit.flower_compat import warm_executor

    return "flower" if requested == "warm" and not warm_executor.usable() else requested


def device_allowlist(node_args: list[str]) -> Allowlist | None:
    """The device's approved-apps list named by flower-supernode's ``--node-config`` (or in
    its ``state-dir``), read once now: a bad one stops the node with its one line."""
    from fedinit.node.app_allowlist import Allowlist, AllowlistError, path_from_node_config

    try:
        path = path_from_node_config(node_config_of(node_args))
        return None if path is None else Allowlist.load(path)
    except (AllowlistError, ValueError) as err:
        raise SystemExit(f"fedinit.node.launch: {err}") from None


def node_config_of(node_args: list[str]) -> dict[str, object]:
    """The node config flower-supernode's (last) ``--node-config`` gives."""
    from flwr.common.config import parse_config_args

    given = [node_args[i + 1] for i, a in enumerate(node_args[:-1]) if a == "--node-config"]
    given += [a.split("=", 1)[1] for a in node_args if a.startswith("--node-config=")]
    return dict(parse_config_args(given[-1:])) if given else {}


def check_slowdown(node_args: list[str]) -> None:
    """A node config ``slowdown`` that is not a number >= 1 stops the node with one line."""
    from fedinit.node.slowdown import SlowdownError, factor_of

    try:
        factor_of(node_config_of(node_args))
    except SlowdownError as err:
        raise SystemExit(f"fedinit.node.launch: node config {err}") from None


def allowlist_executor(allowlist: Allowlist | None, executor: str) -> None:
    """Refuse Flower's executor where the SuperNode cannot check the device's list."""
    from fedinit.flower_compat import app_allowlist, guard

    if allowlist is not None and executor == "flower" and not guard.allowed(app_allowlist.NAME):
        raise SystemExit(f"fedinit.node.launch: approved-apps ({allowlist.path}) is set but the "
                         "SuperNode's check (flower_compat app-allowlist) declined here and "
                         "Flower's executor would install any FAB; allowed: --executor warm "
                         "(it checks on its own)")


def plain_logs_off_terminal() -> None:
    """Flower colours every log line; a log file (not a terminal) gets them plain, each with
    its time to the millisecond (what an operator reads a node's timeline from)."""
    if not sys.stderr.isatty():
        from flwr.supercore.logger import update_console_handler

        update_console_handler(colored=False, timestamps=True)


def repo_first_pythonpath(env: Mapping[str, str]) -> str:
    """A child's PYTHONPATH: this checkout first (its packages, not an installed copy), then
    ``env``'s own (where flwr may live outside the venv)."""
    return os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])


def main(argv: list[str] | None = None) -> None:
    args, node_args = parse_args(sys.argv[1:] if argv is None else argv)
    plain_logs_off_terminal()
    node_args, address = runtime_address(with_slowdown(node_args, args.slowdown))
    allowlist = device_allowlist(node_args)
    check_slowdown(node_args)
    env = dict(os.environ)
    env["PYTHONPATH"] = repo_first_pythonpath(env)
    from fedinit.flower_compat import guard, install, supernode_waits

    args.executor = chosen_executor(args.executor)
    allowlist_executor(allowlist, args.executor)
    patch = bool(args.node_poll) and guard.allowed(supernode_waits.NAME)
    wakeable = patch and args.executor == "warm" and not args.no_wake
    wake = supernode_waits.PipeWaker() if wakeable else None
    wake_fd = None if wake is None else wake.read_fd
    executor = subprocess.Popen(executor_command(args, address, wake_fd,
                                                 allowlist and allowlist.path), env=env,
                                pass_fds=() if wake_fd is None else (wake_fd,))
    if wake_fd is not None:
        os.close(wake_fd)

    def stop_executor() -> None:
        if executor.poll() is None:
            executor.terminate()
            try:
                executor.wait(10)
            except subprocess.TimeoutExpired:
                executor.kill()

    atexit.register(stop_executor)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    install("supernode", allowlist=allowlist, poll=supernode_waits.AdaptivePoll(
        fast=args.node_poll, idle=args.idle_poll, window=args.active_window,
        reply=min(0.05, args.node_poll), wake=wake) if args.node_poll else None)
    sys.argv = ["flower-supernode", *node_args]
    try:
        flower_supernode()
    finally:
        stop_executor()


if __name__ == "__main__":
    main()
