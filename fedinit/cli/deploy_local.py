"""Run one experiment as a real Flower deployment on this machine (gRPC Fleet API, TLS, auth).

    .venv/bin/fedinit-deploy --num-nodes 3 num-server-rounds=3 train-limit=3000
    .venv/bin/fedinit-deploy --insecure --keep-running beta=0
    .venv/bin/fedinit-deploy --stop          # stop what --keep-running left
    (or python -m fedinit.cli.deploy_local ... from the checkout)

One command does what an operator would: TLS material (deploy/make_certs.sh), a SuperLink
(TLS, --enable-supernode-auth, Fleet API on 127.0.0.1, no runtime dependency installation),
`flwr supernode register` for each node key, N SuperNodes (each its own FLWR_HOME, port,
partition, key and client-state dir), a CLI connection in config.toml, `flwr run --stream`,
and the run's status from `flwr ls` (0 only for finished:completed: `flwr run --stream` exits
0 on failure). The results directory is the one under output-dir whose summary.json the run
wrote (fedinit/cli/run_files.py), not a path read from the log.
Every process it started is stopped at the end, also on Ctrl-C or an error, unless
--keep-running. Arguments key=value are run-config overrides; num-clients is --num-nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from fedinit.cli.flower_env import REPO, flower_env
from fedinit.cli.run_files import read_json, run_of
from fedinit.cli.simulate import RUN_ID, parse_overrides, run_status, toml_line
from fedinit.config import ConfigError, RunConfig
from fedinit.flower_compat.app_source import staged_app
from fedinit.node.launch import repo_first_pythonpath

MAKE_CERTS = REPO / "deploy" / "make_certs.sh"
CONNECTION = "fedinit-local"
DEFAULT_BASE_PORT = 29200  # away from Flower's defaults (8000, 9092-9094) and 39091/39093
NODE_PORT_OFFSET = 10  # SuperNode i serves its Runtime API on base + 10 + i


class DeployError(RuntimeError):
    """The deployment could not be brought up or the run did not complete."""


@dataclass
class Proc:
    """A process this script started, in its own session so its children can be found."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log, for error messages."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"    {self.name}| {line}" for line in text[-lines:])


@dataclass
class Deployment:
    """SuperLink + SuperNodes on 127.0.0.1 under ``work_dir``; ``stop()`` ends all of it."""

    work_dir: Path
    num_nodes: int
    base_port: int = DEFAULT_BASE_PORT
    insecure: bool = False
    threads_per_node: int = 1
    executor: str = "warm"
    """ClientApp executor of every node: ``warm`` (fedinit.node.warm_executor) or ``flower``."""
    node_poll: float | None = None
    """Seconds between a SuperNode's pulls while a run is active (0: Flower's own 3 s;
    None: fedinit.node.launch's default)."""
    idle_poll: float | None = None
    """Seconds between its pulls when idle (None: fedinit.node.launch's default)."""
    wake: bool = True
    """The node wakes its warm executor (False: the executor polls every 0.1 s)."""
    num_partitions: int = 0
    """``num-partitions`` in the nodes' node config (0: num_nodes); a test may register more
    node keys than the run has clients."""
    link_state: str = "sqlite"
    """The SuperLink's state: ``sqlite`` (a database file: registered nodes and runs survive
    a SuperLink restart) or ``memory`` (Flower's in-memory state: faster rounds, everything
    lost with the process; ``restart_link`` then has nothing to resume)."""
    slowdown: dict[int, float] = field(default_factory=dict)
    """{node index: FACTOR}: ``fedinit.node.launch --slowdown`` for those nodes (slow devices)."""
    procs: list[Proc] = field(default_factory=list)

    # --------------------------------------------------------------- layout
    @property
    def certs(self) -> Path:
        return self.work_dir / "certs"

    @property
    def logs(self) -> Path:
        return self.work_dir / "logs"

    @property
    def cli_home(self) -> Path:
        return self.work_dir / "cli"

    @property
    def control_address(self) -> str:
        """Control + Runtime API (HTTP(S)): where the CLI and the ServerApp executor connect."""
        return f"127.0.0.1:{self.base_port}"

    @property
    def fleet_address(self) -> str:
        return f"127.0.0.1:{self.base_port + 1}"

    def node_port(self, i: int) -> int:
        return self.base_port + NODE_PORT_OFFSET + i

    def node_key(self, i: int) -> Path:
        return self.certs / f"node_key_{i}"

    @property
    def registry(self) -> Path:
        """{node id: partition id} of the registered keys: the run's ``node-registry``."""
        return self.work_dir / "registry.json"

    def executor_status(self, i: int) -> Path:
        """The warm executor's counters of node ``i`` (tasks, worker starts, start times)."""
        return self.work_dir / f"node-{i}" / "executor.json"

    def cli_env(self) -> dict[str, str]:
        return flower_env(self.cli_home)

    # --------------------------------------------------------------- bring-up
    def prepare(self) -> None:
        """Work dirs, TLS material, a fresh link database and the CLI's connection."""
        for sub in (self.logs, self.cli_home, self.work_dir / "link"):
            sub.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "link" / "state.db").unlink(missing_ok=True)  # no stale nodes/runs
        ports = [self.base_port, self.base_port + 1,
                 *(self.node_port(i) for i in range(self.num_nodes))]
        busy = [p for p in ports if not port_free(p)]
        if busy:
            raise DeployError(f"ports {busy} on 127.0.0.1 are in use; pick another --base-port")
        if not self.insecure:
            subprocess.run(["bash", str(MAKE_CERTS), "--nodes", str(self.num_nodes),
                            str(self.certs)], check=True, stdout=subprocess.DEVNULL)
        self.write_connection()

    @property
    def peer_keys(self) -> Path:
        """The operator's list of client ids and node public keys every node is handed (node
        config ``secagg-peer-keys``): under secure aggregation each node signs its keys with
        its node key and verifies its neighbours' (client_app/secagg_trust.py). Written by
        deploy/make_certs.sh: client i = partition i = ``node_key_i.pub``."""
        return self.certs / "secagg-peer-keys.txt"

    def write_connection(self) -> None:
        """The CLI's config.toml: one connection to this SuperLink, made the default."""
        lines = ["[superlink]", f'default = "{CONNECTION}"', "",
                 f"[superlink.{CONNECTION}]", f'address = "{self.control_address}"']
        if self.insecure:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{(self.certs / "ca.crt").resolve()}"')
        (self.cli_home / "config.toml").write_text("\n".join(lines) + "\n")

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        """Start ``cmd`` in its own session, output to logs/<name>.log."""
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def link_command(self) -> list[str]:
        cmd = ["flower-superlink", "--fleet-api-type", "grpc-rere",
               "--fleet-api-address", self.fleet_address,
               "--host", "127.0.0.1", "--port", str(self.base_port),
               *(["--database", str(self.work_dir / "link" / "state.db")]
                 if self.link_state == "sqlite" else []),
               "--disable-runtime-dependency-installation"]
        if self.insecure:
            return [*cmd, "--insecure"]
        c = self.certs
        return [*cmd, "--ssl-ca-certfile", str(c / "ca.crt"), "--ssl-certfile",
                str(c / "server.pem"), "--ssl-keyfile", str(c / "server.key"),
                "--enable-supernode-auth"]

    def start_link(self, timeout: float = 90.0) -> Proc:
        """Start the SuperLink and wait until its HTTP(S) API answers /health."""
        proc = self.start("superlink", self.link_command(),
                          flower_env(self.work_dir / "link"))
        scheme = "http" if self.insecure else "https"
        ctx = None if self.insecure else ssl.create_default_context(
            cafile=str(self.certs / "ca.crt"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise DeployError(f"SuperLink exited with {proc.popen.returncode}:\n"
                                  + proc.tail())
            try:
                with urllib.request.urlopen(f"{scheme}://{self.control_address}/health",
                                            timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return proc
            except OSError:
                pass
            time.sleep(0.5)
        raise DeployError(f"SuperLink not ready within {timeout:g}s:\n" + proc.tail())

    def restart_link(self, timeout: float = 90.0) -> tuple[Proc, list[str]]:
        """Start the SuperLink again after it died, on its database and ports, and stop the
        runs it left running: (the SuperLink, the stopped run ids).

        The database keeps the registered nodes (they reconnect with their keys on their own)
        and the runs. A run whose ServerApp died with the SuperLink stays ``running`` until its
        task heartbeat lapses (about 60 s), and a node that was pulling one of its messages
        retries that pull until then before it takes a new run's message; stopping the run
        makes the SuperLink refuse those pulls at once (Flower's node logs "Run ID ... is not
        in `RUNNING` status. Ignoring message"). Resume with ``resume-dir`` afterwards."""
        if self.link_state != "sqlite":
            raise RuntimeError(f"link_state={self.link_state!r} keeps nothing across a "
                               "restart; restart_link needs link_state='sqlite'")
        proc = self.start_link(timeout)
        stopped = []
        for run in self.runs():
            if run.get("status") in ("running", "starting"):
                subprocess.run(["flwr", "stop", str(run["run-id"]), CONNECTION],
                               env=self.cli_env(), capture_output=True, check=False,
                               timeout=60)
                stopped.append(str(run["run-id"]))
        return proc, stopped

    def runs(self) -> list[dict[str, Any]]:
        """The SuperLink's runs (`flwr ls --format json`); [] when it cannot say."""
        out = subprocess.run(["flwr", "ls", CONNECTION, "--format", "json"],
                             env=self.cli_env(), capture_output=True, text=True,
                             check=False, timeout=60).stdout
        try:
            return list(json.loads(out[out.index("{"):])["runs"])
        except (ValueError, KeyError, TypeError):
            return []

    def register(self, public_key: Path) -> int:
        """`flwr supernode register KEY.pub`: the node id the SuperLink assigned."""
        out = subprocess.run(
            ["flwr", "supernode", "register", str(public_key), CONNECTION, "--format", "json"],
            env=self.cli_env(), capture_output=True, text=True, check=False)
        try:
            reply = json.loads(out.stdout[out.stdout.index("{"):])
            return int(reply["node-id"])
        except (ValueError, KeyError) as err:
            raise DeployError(f"registering {public_key.name} failed: "
                              f"{(out.stdout + out.stderr).strip()[-800:]}") from err

    def node_command(self, i: int, key: Path | None = None, root_ca: Path | None = None,
                     no_ca: bool = False, extra: list[str] | None = None) -> list[str]:
        """SuperNode ``i`` with its executor (``fedinit.node.launch``); key/root_ca/no_ca override
        the defaults, ``extra`` goes to flower-supernode."""
        cmd = [sys.executable, "-m", "fedinit.node.launch", "--executor", self.executor,
               *([] if self.node_poll is None else ["--node-poll", str(self.node_poll)]),
               *([] if self.idle_poll is None else ["--idle-poll", str(self.idle_poll)]),
               *([] if self.wake else ["--no-wake"]),
               *(["--slowdown", str(self.slowdown[i])] if i in self.slowdown else []),
               "--status-file", str(self.executor_status(i)), "--",
               "--superlink", self.fleet_address,
               "--host", "127.0.0.1", "--port", str(self.node_port(i)),
               "--node-config", f"partition-id={i} "
               f"num-partitions={self.num_partitions or self.num_nodes} "
               f'state-dir="{self.work_dir / f"node-{i}" / "client-state"}"'
               + ("" if self.insecure else  # signed secure-aggregation keys, with its node key
                  f' secagg-signing-key="{key or self.node_key(i)}"'
                  f' secagg-peer-keys="{self.peer_keys}"')]
        if self.insecure:
            cmd.append("--insecure")
        else:
            if not no_ca:
                cmd += ["--root-certificates", str(root_ca or self.certs / "ca.crt")]
            cmd += ["--auth-supernode-private-key", str(key or self.node_key(i))]
        return cmd + (extra or [])

    def start_node(self, i: int, cmd: list[str] | None = None, name: str = "") -> Proc:
        """SuperNode ``i`` with its own FLWR_HOME and a fixed torch thread count."""
        threads = str(self.threads_per_node)
        env = flower_env(self.work_dir / f"node-{i}", OMP_NUM_THREADS=threads,
                         MKL_NUM_THREADS=threads,
                         PYTHONPATH=repo_first_pythonpath(os.environ))
        return self.start(name or f"supernode-{i}", cmd or self.node_command(i), env)

    def up(self, start: list[int] | None = None) -> None:
        """Everything up to connected SuperNodes: certs, link, registrations, nodes (all, or
        those in ``start``: the others are registered and may start later, ``start_node``)."""
        self.prepare()
        print(f"deploy: SuperLink on {self.control_address} (Fleet API {self.fleet_address}"
              f", {'insecure' if self.insecure else 'TLS + SuperNode auth'})", flush=True)
        self.start_link()
        if not self.insecure:
            registry = {}
            for i in range(self.num_nodes):
                node_id = self.register(self.node_key(i).with_suffix(".pub"))
                registry[str(node_id)] = i
                print(f"deploy: registered node_key_{i}.pub as node {node_id}", flush=True)
            self.registry.write_text(json.dumps(registry, indent=1) + "\n")
        started = list(range(self.num_nodes)) if start is None else start
        for i in started:
            self.start_node(i)
        print(f"deploy: {len(started)} SuperNodes started; logs in {self.logs}", flush=True)

    # --------------------------------------------------------------- run
    def run(self, app: Path, run_config: Path, timeout: float) -> tuple[str, str, Path | None]:
        """`flwr run --stream`, watched: (run id, status, results dir or None).

        The results directory is the one the run's config.json names (``run_of``); it is
        None when the run did not start one or another run wrote the same config meanwhile.
        """
        with run_config.open("rb") as f:
            config = RunConfig.parse(tomllib.load(f)).to_dict()
        started = time.time()
        watcher = Watcher(self.procs, timeout)
        run_id: str | None = None
        with staged_app(app) as source:  # the app's files only: Flower lists all it is given
            cmd = ["flwr", "run", str(source), CONNECTION, "--run-config", str(run_config),
                   "--stream"]
            print("deploy:", " ".join(cmd), flush=True)
            proc = subprocess.Popen(cmd, env=self.cli_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    start_new_session=True)
            try:
                watcher.watch(proc)
                assert proc.stdout is not None
                for line in proc.stdout:
                    sys.stdout.write(line)
                    if run_id is None and (m := RUN_ID.search(line)):
                        run_id = m.group(1)
                proc.wait()
            finally:  # also on Ctrl-C: the CLI is in its own session and would stream on
                watcher.stop()
                stop_pids([proc.pid], grace=5.0)
                if proc.stdout is not None:
                    proc.stdout.close()
        if run_id is None:
            why = f": {watcher.reason}" if watcher.reason else " (see its output above)"
            raise DeployError(f"`flwr run` did not start a run{why}")
        if watcher.reason:
            subprocess.run(["flwr", "stop", run_id, CONNECTION], env=self.cli_env(),
                           capture_output=True, check=False)
            raise DeployError(watcher.reason)
        status = run_status(self.cli_env(), run_id, CONNECTION)
        return run_id, status, run_of(config, started)[0]

    # --------------------------------------------------------------- teardown
    def save_pids(self) -> Path:
        """pids.json for a later --stop (--keep-running)."""
        path = self.work_dir / "pids.json"
        path.write_text(json.dumps({p.name: p.popen.pid for p in self.procs}, indent=1))
        return path

    def stop(self) -> None:
        """SIGTERM every started process and its descendants; SIGKILL what is left after 10 s."""
        stop_pids([p.popen.pid for p in self.procs])
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=1)
        self.procs.clear()


class Watcher:
    """Ends `flwr run` early when a started process dies or the run exceeds its time."""

    def __init__(self, procs: list[Proc], timeout: float) -> None:
        self.procs, self.timeout = list(procs), timeout
        self.reason = ""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, run: subprocess.Popen[str]) -> None:
        self._thread = threading.Thread(target=self._loop, args=(run,), daemon=True)
        self._thread.start()

    def _loop(self, run: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._done.wait(1.0):
            dead = [p for p in self.procs if p.popen.poll() is not None]
            if dead:
                self.reason = "\n".join(f"{p.name} exited with {p.popen.returncode}:\n{p.tail()}"
                                        for p in dead)
            elif time.monotonic() > deadline:
                self.reason = f"the run did not finish within --run-timeout {self.timeout:g}s"
            if self.reason:
                run.terminate()
                return

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


# ------------------------------------------------------------------- process utilities
def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def children_map() -> dict[int, list[int]]:
    """{parent: [pid, ...]} from /proc, by ppid and by Flower's ``--parent-pid P`` argument.

    Flower starts executors in their own sessions, and an executor whose SuperNode already
    exited (a refused node) is reparented to init: only ``--parent-pid`` still names it."""
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(entry.name)
        kids.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(pid)
        if b"--parent-pid" in argv[:-1]:
            parent = argv[argv.index(b"--parent-pid") + 1]
            if parent.isdigit():
                kids.setdefault(int(parent), []).append(pid)
    return kids


def descendants(pids: list[int]) -> list[int]:
    """``pids`` and all their descendants, parents first."""
    kids, out, todo = children_map(), [], list(pids)
    while todo:
        pid = todo.pop(0)
        if pid not in out:
            out.append(pid)
            todo.extend(kids.get(pid, []))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (a unique temp path), zombies excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(int(entry.name))
    return found


def stop_pids(pids: list[int], grace: float = 10.0) -> None:
    """Terminate ``pids`` and their descendants (found before signalling), then kill."""
    tree = descendants(pids)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in tree):
        time.sleep(0.2)
    for pid in tree:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def stop_saved(work_dir: Path) -> int:
    """--stop: end the processes recorded by a --keep-running deployment."""
    path = work_dir / "pids.json"
    if not path.exists():
        print(f"deploy: nothing to stop ({path} does not exist)", file=sys.stderr)
        return 1
    pids = json.loads(path.read_text())
    stop_pids([int(p) for p in pids.values()])
    path.unlink()
    print(f"deploy: stopped {', '.join(pids)}")
    return 0


def raise_on_signal(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so the finally block stops every process."""
    raise KeyboardInterrupt(f"signal {signum}")


# ------------------------------------------------------------------- command line
def results_line(run: Path | None, output_dir: str) -> str:
    """'results in DIR (final acc ..., best ..., N rounds)' from the run's summary.json."""
    if run is None:
        return (f"the run completed but its results directory under {output_dir} could not "
                "be told apart (no config.json of this run, or two runs with its config)")
    summary = read_json(run / "summary.json")
    if summary is None:
        return f"results in {run} (no summary.json: the run wrote no final results)"
    final, best = summary.get("final-test-acc"), summary.get("best-test-acc")
    accs = (f"final acc {100 * final:.2f}%, best {100 * best:.2f}%, "
            if final is not None and best is not None else "")
    return f"results in {run} ({accs}{summary.get('rounds')} rounds)"


def build_run_config(overrides: list[str], num_nodes: int, out: TextIO) -> dict[str, Any]:
    """key=value overrides, validated, with num-clients = num_nodes and absolute paths."""
    try:
        cfg_map = parse_overrides(overrides)
    except ValueError as err:
        raise ConfigError(f"argument {err}") from None
    if "num-clients" in cfg_map and cfg_map["num-clients"] != num_nodes:
        raise ConfigError(f"num-clients={cfg_map['num-clients']} but --num-nodes {num_nodes}; "
                          "one SuperNode is one client, so leave num-clients out")
    cfg_map["num-clients"] = num_nodes
    cfg = RunConfig.parse(cfg_map)
    cfg_map["output-dir"] = str(Path(cfg.fleet.output_dir).resolve())
    if cfg.data.data_dir:
        cfg_map["data-dir"] = str(Path(cfg.data.data_dir).resolve())
    print(f"deploy: run config {cfg_map}", file=out, flush=True)
    return cfg_map


def slowdowns(given: list[str], num_nodes: int) -> dict[int, float] | str:
    """``--slowdown I=FACTOR`` flags as {I: FACTOR}, or the one-line error."""
    from fedinit.node.slowdown import SlowdownError, check_factor

    out: dict[int, float] = {}
    for item in given:
        node, sep, factor = item.partition("=")
        if not sep or not node.strip().isdigit() or int(node) >= num_nodes:
            return (f"--slowdown {item} is not allowed; allowed: I=FACTOR with I a node "
                    f"index 0..{num_nodes - 1}")
        try:
            out[int(node)] = check_factor(factor)
        except SlowdownError as err:
            return f"--slowdown {item}: {err}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--num-nodes", type=int, default=3, help="SuperNodes = clients (default 3)")
    ap.add_argument("--insecure", action="store_true", help="no TLS, no SuperNode auth")
    ap.add_argument("--keep-running", action="store_true",
                    help="leave SuperLink and SuperNodes up after the run (stop with --stop)")
    ap.add_argument("--stop", action="store_true", help="stop a --keep-running deployment")
    ap.add_argument("--work-dir", type=Path, default=REPO / "deploy" / ".build" / "local",
                    help="certs, logs, state and FLWR_HOMEs (default deploy/.build/local)")
    ap.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                    help=f"link API on BASE, Fleet API on BASE+1, node i on BASE+"
                         f"{NODE_PORT_OFFSET}+i (default {DEFAULT_BASE_PORT})")
    ap.add_argument("--threads-per-node", type=int, default=1,
                    help="torch threads per SuperNode (default 1: one core per client, as in "
                         "the simulation, so both give the same numbers)")
    ap.add_argument("--executor", choices=("warm", "flower"), default="warm",
                    help="ClientApp executor per node: warm (one torch import per node, "
                         "default) or flower (Flower's, a new process per message)")
    ap.add_argument("--node-poll", type=float,
                    help="seconds between a SuperNode's pulls while a run is active "
                         "(default: fedinit.node.launch's, 0.2; 0 keeps Flower's 3 s)")
    ap.add_argument("--idle-poll", type=float,
                    help="seconds between its pulls when idle (default: fedinit.node.launch's, 3)")
    ap.add_argument("--no-wake", action="store_true",
                    help="warm executors poll every 0.1 s instead of being woken by their "
                         "node (the fixed polls of before, for comparison)")
    ap.add_argument("--link-state", choices=("sqlite", "memory"), default="sqlite",
                    help="SuperLink state: sqlite (a database under the work dir: registered "
                         "nodes and runs survive a SuperLink restart; default) or memory "
                         "(faster rounds, lost with the process)")
    ap.add_argument("--slowdown", action="append", default=[], metavar="I=FACTOR",
                    help="node I trains FACTOR x its real compute time (fedinit.node.launch "
                         "--slowdown; repeat for more nodes)")
    ap.add_argument("--app", type=Path, default=REPO, help="the Flower App (default: this repo)")
    ap.add_argument("--run-timeout", type=float, default=3600.0,
                    help="give up on the run after this many seconds (default 3600)")
    args = ap.parse_args(argv)
    work_dir = args.work_dir.resolve()
    if args.stop:
        return stop_saved(work_dir)
    if args.num_nodes < 1:
        ap.error("--num-nodes must be >= 1")
    slow = slowdowns(args.slowdown, args.num_nodes)
    if isinstance(slow, str):
        ap.error(slow)
    try:
        run_cfg = build_run_config(args.overrides, args.num_nodes, sys.stdout)
    except ConfigError as err:
        print(f"deploy: {err}", file=sys.stderr)
        return 2

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, raise_on_signal)
    dep = Deployment(work_dir, args.num_nodes, args.base_port, args.insecure,
                     args.threads_per_node, args.executor, args.node_poll, args.idle_poll,
                     not args.no_wake, link_state=args.link_state, slowdown=slow)
    code = 1
    try:
        dep.up()
        if not args.insecure:  # each partition only from the node registered for it
            run_cfg["node-registry"] = str(dep.registry)
        cfg_file = work_dir / "run-config.toml"
        cfg_file.write_text("\n".join(toml_line(k, v) for k, v in run_cfg.items()) + "\n")
        run_id, status, results = dep.run(args.app.resolve(), cfg_file, args.run_timeout)
        print(f"deploy: run {run_id} status {status}", flush=True)
        if status == "finished:completed":
            print(f"deploy: {results_line(results, run_cfg['output-dir'])}", flush=True)
            code = 0
    except DeployError as err:
        print(f"deploy: {err}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("deploy: interrupted", file=sys.stderr, flush=True)
        code = 130
    finally:
        if args.keep_running and dep.procs:
            pids = dep.save_pids()
            print(f"deploy: left running ({pids}); CLI: FLWR_HOME={dep.cli_home} flwr ls "
                  f"{CONNECTION}; stop: {sys.argv[0]} --stop --work-dir {work_dir}", flush=True)
        else:
            dep.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
