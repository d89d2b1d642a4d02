"""The warm ClientApp executor: Flower's SuperExec for ClientApps, without a cold start per message.

Flower 1.39's SuperExec starts a new ``flwr-clientapp`` process for every message; each one
imports torch and the app and reloads its partition (seconds per message on a small CPU).
This executor takes the SuperExec's place for a SuperNode in ``--isolation process``:

* the supervisor (this process) imports Python, flwr and torch once, never touches CUDA, and
  asks the SuperNode's Runtime API for a task every ``--poll`` seconds, or, with
  ``--wake-fd`` (``fedinit.node.launch`` passes it), whenever the node writes to that pipe (a
  message
  waits: ``fedinit.flower_compat.supernode_waits``); it then also wakes when a busy worker reports
  or dies, or at a task's deadline, and the poll is only a safety net;
* each task goes to a worker forked from the supervisor (so it starts with everything
  imported); the worker keeps the app's module caches (data, partition, w_0, model) from task
  to task. One worker per FAB: a task of another FAB (another app, changed code) retires the
  old worker and forks a fresh one, which imports the new FAB's code from scratch;
* a task that raises gets Flower's error reply from the worker, which lives on; a worker that
  dies mid-task (SIGKILL, OOM) is answered for by the supervisor with a crash error reply
  (prepared by the worker when it pulled the message), and the next task forks a new worker;
* each task has a deadline (run config ``task-deadline``, 0 = ``round-timeout``; the node's
  ``--task-deadline`` wins; ``fedinit.node.deadline``), counted from its hand-over to the worker. A
  task past it (a hung data loader, a stuck driver) gets its worker killed with the worker's
  process group (data-loader children too) and the error reply "task exceeded
  task-deadline=Ns; killed"; the next task forks a new worker. Without this a hung task held
  the node: the SuperNode hands out its next message only once the current one is answered;
* with ``--approved-apps`` (the device's list, ``fedinit.node.app_allowlist``) a task whose FAB hash
  is not approved is answered by the supervisor with the refusal (one log line, an
  ``INVALID_FAB`` error reply) before any worker is forked or retired for it, and a worker
  checks the FAB's bytes against the list before it installs them;
* CUDA starts only in a worker that uses it (the supervisor never initialises it, so forking
  stays safe).

Every task still runs with Flower's token and returns its reply and context through the
SuperNode exactly as from ``flwr-clientapp`` (``fedinit.node.task_runner``). It mirrors Flower's
``run_clientapp``, so ``fedinit.node.launch`` starts it only while that source reads as checked
(``fedinit.flower_compat.warm_executor``, table entry ``warm-executor``); else Flower's SuperExec.

    python -m fedinit.node.warm_executor --runtime-api-address 127.0.0.1:9094 --insecure
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedinit.node.app_allowlist import Allowlist

PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "torch.optim",
           "torch._dynamo", "flwr.clientapp", "flwr.serverapp",
           "flwr.supernode.runtime.run_clientapp", "fedinit.node.task_runner")
"""Imported once by the supervisor, before any fork: what every ClientApp task needs.
``torch._dynamo``: the first ``torch.optim.SGD`` imports it lazily (2-6 s), which a first
train task would otherwise pay inside its compute-seconds (and a ``slowdown`` stretch)."""
CLIENT_APP_TASK = "flwr-clientapp"  # flwr.supercore.constant.TaskType.CLIENT_APP
ORPHAN_SECONDS = 60.0
"""A task whose worker has not pulled its message this long after hand-over, when the node
hands out a newer one, is an orphan: the node gave up on its message (a SuperLink crash:
Flower 1.39's node fails the task, but the worker would wait 15 min for it). Its worker is
killed then, not kept with its ~600 MiB."""


@dataclass
class Stats:
    """Counters a test or a person can read (``--status-file``): is the executor warm?"""

    pid: int = field(default_factory=os.getpid)
    preload_seconds: float = 0.0
    tasks: int = 0
    tasks_failed: int = 0
    worker_starts: int = 0
    worker_crashes: int = 0
    tasks_refused: int = 0
    """Tasks of an unapproved FAB, answered with the refusal (no worker, nothing installed)."""
    tasks_timed_out: int = 0
    """Tasks killed at their deadline (their workers are not counted in worker_crashes)."""
    orphans_killed: int = 0
    """Workers killed because their task's message never came (``ORPHAN_SECONDS``)."""
    cold_workers: int = 0
    """Workers that had to import torch themselves (should stay 0: the fork inherits it)."""
    start_seconds: list[float] = field(default_factory=list)
    worker_pid: int | None = None
    worker_rss_history: list[float] = field(default_factory=list)
    """The worker's RSS after each task (last 1000): flat means no leak across rounds."""
    supervisor_rss_mib: float | None = None

    def write(self, path: Path | None) -> None:
        if path is None:
            return
        self.supervisor_rss_mib = rss_mib(os.getpid())
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=1))
        os.replace(tmp, path)


def rss_mib(pid: int | None, pss: bool = False) -> float | None:
    """Resident memory of a process from /proc, or with ``pss`` its proportional share
    (pages shared with other processes counted by fraction); None where there is no /proc."""
    path, key = (f"/proc/{pid}/smaps_rollup", "Pss:") if pss else (f"/proc/{pid}/status",
                                                                    "VmRSS:")
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


# ------------------------------------------------------------------------------ worker side
def worker_main(conn: Connection, address: str, insecure: bool,
                certificates: bytes | None, deadline_override: float = 0.0,
                approved: Allowlist | None = None) -> None:
    """Run tasks sent by the supervisor, one at a time, until told to stop."""
    from fedinit.node.task_runner import Pulled, run_task

    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # a group of its own: a kill at the deadline takes its children too
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        task_id, token = item

        def notify(pulled: Pulled, task_id: int = task_id) -> None:
            conn.send(("pulled", task_id, pulled))

        outcome = run_task(address, token, insecure, certificates, notify, deadline_override,
                           approved)
        conn.send(("done", task_id, outcome.completed, outcome.start_seconds,
                   outcome.app_seconds, rss_mib(os.getpid()), outcome.phases))


# ------------------------------------------------------------------------------ supervisor side
@dataclass
class InFlight:
    """The task a worker is running, and how to answer for it if the worker dies or hangs."""

    task_id: int
    token: str
    started: float = field(default_factory=time.monotonic)
    deadline: float = 0.0
    """Seconds from ``started`` (0 = none): the node's override until the worker reports the
    run's deadline with ``pulled``."""
    pulled: Any = None
    """``fedinit.node.task_runner.Pulled``: the prepared error replies, once the message is
    pulled."""

    def overdue(self, now: float) -> bool:
        return self.deadline > 0 and now - self.started > self.deadline


class Worker:
    """A forked worker process bound to one FAB."""

    def __init__(self, fab_hash: str, address: str, insecure: bool,
                 certificates: bytes | None, deadline_override: float = 0.0,
                 approved: Allowlist | None = None) -> None:
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.fab_hash = fab_hash
        self.process = ctx.Process(target=worker_main, name=f"clientapp-worker-{fab_hash[:8]}",
                                   args=(child, address, insecure, certificates,
                                         deadline_override,
                                         *(() if approved is None else (approved,))),
                                   daemon=True)
        self.process.start()
        with contextlib.suppress(OSError):  # also here: no task before the group exists
            os.setpgid(self.process.pid, self.process.pid)
        child.close()
        self.task: InFlight | None = None
        self.tasks_done = 0

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        """SIGKILL the worker and what it started (its process group: data-loader workers)."""
        pid = self.process.pid
        assert pid is not None
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                self.process.kill()
        except ProcessLookupError:
            pass
        self.process.join()
        self.conn.close()

    def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not within ``grace`` seconds."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(grace)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class WarmExecutor:
    """Poll the Runtime API; hand each ClientApp task to a warm worker of its FAB.

    Usually one worker per node does everything. A task that cannot finish (e.g. one left by
    a stopped run, whose message never fully arrives) must not hold up the next one, so a
    task that finds every worker of its FAB busy gets a freshly forked worker, up to
    ``max_workers``; surplus idle workers are stopped, keeping the one with the warmest
    caches (the most tasks done).
    """

    def __init__(self, address: str, insecure: bool, certificates: bytes | None,
                 poll: float, status_file: Path | None, max_workers: int = 4,
                 task_deadline: float = 0.0, wake_fd: int | None = None,
                 approved: Allowlist | None = None) -> None:
        self.address, self.insecure, self.certificates = address, insecure, certificates
        self.approved = approved
        """The device's approved apps (None: every app runs)."""
        self.poll = poll
        self.wake_fd = wake_fd
        """A pipe the SuperNode writes to when a message waits; None: poll only."""
        self.task_deadline = task_deadline
        """The node's ``--task-deadline`` (0: each run's config decides)."""
        self.status_file = status_file
        self.max_workers = max_workers
        self.stats = Stats()
        self.workers: list[Worker] = []

    def preload(self) -> None:
        """Import what every task needs, once, in the process the workers fork from."""
        from flwr.supercore import log

        t0 = time.monotonic()
        for name in PRELOAD:
            importlib.import_module(name)
        self.stats.preload_seconds = time.monotonic() - t0
        log(INFO, "warm executor: torch, flwr and numpy imported in %.1f s (once)",
            self.stats.preload_seconds)
        self.stats.write(self.status_file)

    def run(self) -> None:
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient

        client = RuntimeHttpClient.from_server_address(
            server_address=self.address, insecure=self.insecure,
            root_certificates=self.certificates,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
            retry_invoker=make_simple_http_retry_invoker())
        request = AcquireTaskRequest(supported_task_types=[CLIENT_APP_TASK])
        try:
            while True:
                for w in list(self.workers):
                    self.check_worker(w)
                if len(self.workers) < self.max_workers or self.idle_worker(None):
                    res = client.AcquireTask(request)
                    if res.HasField("task") and res.token:
                        self.dispatch(res.token, res.task.task_id, res.task.fab_hash,
                                      res.task.run_id)
                        continue
                self.pause()
        finally:
            for w in self.workers:
                w.stop()
            client.close()

    def pause(self) -> None:
        """Wait ``poll`` seconds; with a wake pipe, only until the node wakes us (a message
        waits), a busy worker reports or dies, or a task's deadline passes."""
        if self.wake_fd is None:
            time.sleep(self.poll)
            return
        busy = [w for w in self.workers if w.task is not None]
        now = time.monotonic()
        timeout = min([self.poll, *(w.task.started + w.task.deadline - now + 0.01
                                    for w in busy if w.task and w.task.deadline > 0)])
        ready = wait([self.wake_fd, *(w.conn for w in busy),
                      *(w.process.sentinel for w in busy)], max(0.0, timeout))
        if self.wake_fd in ready and not os.read(self.wake_fd, 4096):
            os.close(self.wake_fd)  # the node is gone: poll from now on
            self.wake_fd = None

    def idle_worker(self, fab_hash: str | None) -> Worker | None:
        """The idle worker (of ``fab_hash``, or any) with the most tasks done."""
        idle = [w for w in self.workers if w.task is None
                and (fab_hash is None or w.fab_hash == fab_hash)]
        return max(idle, key=lambda w: w.tasks_done, default=None)

    def dispatch(self, token: str, task_id: int, fab_hash: str, run_id: int = 0) -> None:
        """Send the task to an idle warm worker of its FAB, forking one if there is none."""
        from flwr.supercore import log

        if self.approved is not None and (why := self.approved.refusal(fab_hash, run_id)):
            self.refuse(token, task_id, why)
            return
        self.reap_orphans(time.monotonic())
        for old in [w for w in self.workers if w.fab_hash != fab_hash and w.task is None]:
            log(INFO, "warm executor: FAB %s, retiring a worker of FAB %s", fab_hash[:8],
                old.fab_hash[:8])
            self.retire(old)
        worker = self.idle_worker(fab_hash)
        if worker is None:  # run() acquires only with a worker to spare
            worker = Worker(fab_hash, self.address, self.insecure, self.certificates,
                            self.task_deadline, self.approved)
            self.workers.append(worker)
            self.stats.worker_starts += 1
            self.stats.cold_workers += "torch" not in sys.modules
            self.stats.worker_pid = worker.process.pid
            if len(self.workers) > 1:
                log(INFO, "warm executor: %d workers (the others are busy)", len(self.workers))
        worker.task = InFlight(task_id, token, deadline=self.task_deadline)
        worker.conn.send((task_id, token))

    def refuse(self, token: str, task_id: int, reason: str) -> None:
        """Answer a task of an unapproved FAB with ``reason``: one log line, an error reply;
        no worker is forked or retired for it and nothing of its FAB is installed."""
        from flwr.supercore import log

        from fedinit.node.task_runner import refuse_task

        log(WARNING, "%s (task %d)", reason, task_id)
        self.stats.tasks += 1
        self.stats.tasks_failed += 1
        self.stats.tasks_refused += 1
        try:
            refuse_task(self.address, token, self.insecure, self.certificates, reason)
        except Exception as err:  # noqa: BLE001 - Flower's token expiry remains
            log(ERROR, "warm executor: could not answer refused task %d: %s", task_id, err)
        self.stats.write(self.status_file)

    def reap_orphans(self, now: float) -> None:
        """Kill workers whose task never got its message (``ORPHAN_SECONDS``): the node hands
        out a newer task, so it gave up on theirs."""
        from flwr.supercore import log

        for w in [w for w in self.workers if w.task is not None and w.task.pulled is None
                  and now - w.task.started > ORPHAN_SECONDS]:
            assert w.task is not None
            log(WARNING, "warm executor: task %d got no message in %.0f s and the node has "
                "moved on; killing its worker", w.task.task_id, now - w.task.started)
            w.kill()
            self.workers.remove(w)
            self.stats.orphans_killed += 1

    def retire(self, w: Worker) -> None:
        self.workers.remove(w)
        w.stop()

    def check_worker(self, w: Worker) -> None:
        """Collect a worker's reports; answer for a task whose worker died or that ran past
        its deadline (the worker is killed first)."""
        from flwr.supercore import log

        try:
            while w.conn.poll():
                self.on_report(w, w.conn.recv())
        except (EOFError, OSError):
            pass
        if w.alive():
            if w.task is not None and w.task.overdue(time.monotonic()):
                self.kill_overdue(w)
            return
        w.process.join()
        code = w.process.exitcode
        self.workers.remove(w)
        if w.task is None:
            log(WARNING, "warm executor: idle worker exited with %s", code)
            return
        self.stats.worker_crashes += 1
        task = w.task
        log(ERROR, "warm executor: worker died (exit %s) during task %d", code, task.task_id)
        from fedinit.node.task_runner import CRASH_REASON

        self.answer_for(task, task.pulled and task.pulled.crash_reply,
                        f"{CRASH_REASON} (exit {code})")

    def kill_overdue(self, w: Worker) -> None:
        """Kill a task past its deadline with its worker; answer it with the timeout reply."""
        from flwr.supercore import log

        from fedinit.node.deadline import timeout_reason

        assert w.task is not None
        task = w.task
        w.kill()
        self.workers.remove(w)
        self.stats.tasks_timed_out += 1
        reason = timeout_reason(task.deadline)
        log(ERROR, "warm executor: task %d: %s (worker %s and its process group)",
            task.task_id, reason, w.process.pid)
        self.answer_for(task, task.pulled and task.pulled.timeout_reply, reason)

    def answer_for(self, task: InFlight, reply: Any, details: str) -> None:
        """Send ``reply`` (prepared by the worker) for a task its worker cannot finish."""
        from flwr.supercore import log

        self.stats.tasks += 1
        self.stats.tasks_failed += 1
        if reply is None:
            log(WARNING, "warm executor: task %d ended before its message was pulled; the "
                "SuperNode answers when the task token expires", task.task_id)
        else:
            from fedinit.node.task_runner import report_crash

            try:
                report_crash(self.address, task.token, self.insecure, self.certificates,
                             reply, task.pulled.run_id, task.pulled.node_id, details)
                log(INFO, "warm executor: error reply sent for task %d", task.task_id)
            except Exception as err:  # noqa: BLE001 - Flower's token expiry remains
                log(ERROR, "warm executor: could not answer for task %d: %s",
                    task.task_id, err)
        self.stats.write(self.status_file)

    def on_report(self, w: Worker, report: tuple[Any, ...]) -> None:
        from flwr.supercore import log

        kind, task_id = report[0], report[1]
        if w.task is None or w.task.task_id != task_id:
            return
        if kind == "pulled":
            w.task.pulled = report[2]
            w.task.deadline = report[2].deadline
            return
        completed, start, app_seconds, worker_rss, phases = report[2:7]
        s = self.stats
        s.tasks += 1
        s.tasks_failed += 0 if completed else 1
        s.start_seconds = [*s.start_seconds[-99:], round(start, 4)]
        if worker_rss is not None:
            s.worker_rss_history = [*s.worker_rss_history[-999:], round(worker_rss, 1)]
        log(INFO, "warm executor: task %d %s: start %.3f s (%s), app %.2f s, worker RSS "
            "%.0f MiB", task_id, "done" if completed else "failed", start,
            ", ".join(f"{k} {v:.3f}" for k, v in phases.items()), app_seconds, worker_rss or 0)
        w.task = None
        w.tasks_done += 1
        keep = self.idle_worker(w.fab_hash)
        for extra in [x for x in self.workers if x.task is None and x is not keep]:
            self.retire(extra)  # one idle worker per node is enough
        s.write(self.status_file)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runtime-api-address", required=True,
                   help="the SuperNode's Runtime API (--host/--port of flower-supernode)")
    tls = p.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="plain HTTP (loopback only)")
    tls.add_argument("--root-certificates", help="CA of the Runtime API's TLS certificate")
    p.add_argument("--poll", type=float, default=0.1,
                   help="seconds between task polls when idle (default 0.1)")
    p.add_argument("--max-workers", type=int, default=4,
                   help="workers at most, for tasks that overlap (default 4)")
    p.add_argument("--task-deadline", type=float, default=0.0,
                   help="kill a task that runs longer than this many seconds and answer it "
                        "with an error reply; wins over the run config's task-deadline "
                        "(default 0: the run config decides, its 0 meaning round-timeout)")
    p.add_argument("--wake-fd", type=int,
                   help="an inherited pipe the SuperNode writes to when a message waits: "
                        "ask for a task at once (fedinit.node.launch passes it)")
    p.add_argument("--approved-apps", type=Path,
                   help="the device's approved-apps file (fedinit.node.app_allowlist): a task of "
                        "any other FAB is refused before anything of it is installed")
    p.add_argument("--parent-pid", type=int, help="exit when this process exits")
    p.add_argument("--status-file", type=Path, help="write counters here after each task")
    args = p.parse_args(argv)
    if not 0.01 <= args.poll <= 60:
        p.error(f"--poll {args.poll} is not allowed; allowed: 0.01 to 60 seconds")
    if not (math.isfinite(args.task_deadline) and args.task_deadline >= 0):
        p.error(f"--task-deadline {args.task_deadline} is not allowed; allowed: 0 (the run "
                "config decides) or a number of seconds > 0")
    if args.max_workers < 1:
        p.error(f"--max-workers {args.max_workers} is not allowed; allowed: 1 or more")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from flwr.supercore.app_utils import start_parent_process_monitor

    from fedinit.node.launch import plain_logs_off_terminal

    plain_logs_off_terminal()
    from fedinit.node.app_allowlist import Allowlist, AllowlistError

    try:
        approved = None if args.approved_apps is None else Allowlist.load(args.approved_apps)
    except AllowlistError as err:
        raise SystemExit(f"warm executor: {err}") from None
    certificates = (None if args.insecure
                    else Path(args.root_certificates).read_bytes())
    executor = WarmExecutor(args.runtime_api_address, args.insecure, certificates, args.poll,
                            args.status_file, args.max_workers, args.task_deadline,
                            args.wake_fd, approved)
    executor.preload()
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        executor.run()
    except SystemExit as done:
        sys.exit(0 if done.code in (128 + signal.SIGTERM, 128 + signal.SIGINT) else done.code)


if __name__ == "__main__":
    main()
