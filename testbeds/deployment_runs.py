"""Runs against a local TLS deployment (``fedinit/cli/deploy_local.Deployment``), as the slow
deployment tests and ``bench/secagg_deployed.py`` both drive them: the deployment up for the
duration, `flwr run` of an app as a watched process, waiting for rounds, killing a process
tree."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fedinit.cli.deploy_local import CONNECTION, Deployment, descendants, pids_mentioning, stop_pids
from fedinit.cli.flower_env import REPO
from fedinit.cli.simulate import RUN_ID, run_status, toml_line

D = TypeVar("D", bound=Deployment)


@contextmanager
def deployed(dep: D, tmp_path: Path) -> Iterator[D]:
    """``dep`` up for the test; afterwards stopped, with every process that still names
    ``tmp_path`` (a ClientApp executor the SuperNode left behind)."""
    try:
        dep.up()
        yield dep
    finally:
        dep.stop()
        stop_pids(pids_mentioning(str(tmp_path)))


def final_model(run: Path) -> list[np.ndarray]:
    with np.load(run / "final_model.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def start_flwr_run(dep: Deployment, app: Path, name: str, cfg: dict[str, Any],
                   log: Path) -> subprocess.Popen[bytes]:
    """`flwr run --stream` of ``app`` against ``dep`` with ``cfg`` (written to the deployment's
    work dir as ``<name>.toml``), its output to ``log``, in a session of its own (so a stop
    reaches its whole tree)."""
    cfg_file = dep.work_dir / f"{name}.toml"
    cfg_file.write_text("\n".join(toml_line(k, v) for k, v in cfg.items()) + "\n")
    with log.open("wb") as out:
        return subprocess.Popen(
            ["flwr", "run", str(app), CONNECTION, "--run-config", str(cfg_file), "--stream"],
            env=dep.cli_env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)


class FlwrRun:
    """`flwr run --stream` of ``app`` (this checkout's, or a copy such as ``fault_app``'s)
    against ``dep``, output to a log file; not watched."""

    def __init__(self, dep: Deployment, name: str, cfg: dict[str, Any],
                 app: Path = REPO) -> None:
        self.dep = dep
        self.log = dep.logs / f"{name}.log"
        self.popen = start_flwr_run(dep, app, name, cfg, self.log)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def run_id(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if m := RUN_ID.search(self.text()):
                return m.group(1)
            assert self.popen.poll() is None, self.text()[-3000:]
            time.sleep(0.2)
        raise AssertionError("`flwr run` did not start a run:\n" + self.text()[-3000:])

    def wait(self, timeout: float) -> str:
        """Wait for the CLI to exit; the run's status from `flwr ls`."""
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"run not done within {timeout:g}s:\n"
                                 + self.text()[-3000:]) from None
        return run_status(self.dep.cli_env(), self.run_id(), CONNECTION)

    def stop(self) -> None:
        stop_pids([self.popen.pid], grace=5.0)


def completed_run(dep: Deployment, name: str, cfg: dict[str, Any], out: Path) -> Path:
    """Run ``cfg`` to completion (the reference of a fault test) and return its run dir."""
    run = FlwrRun(dep, name, {**cfg, "output-dir": str(out)})
    try:
        assert run.wait(300) == "finished:completed", run.text()[-3000:]
    finally:
        run.stop()
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


def wait_rounds(out: Path, n: int, timeout: float, run: FlwrRun) -> Path:
    """The run dir under ``out`` once its rounds.jsonl has ``n`` rows (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in out.glob("*/rounds.jsonl"):
            if len(f.read_text().splitlines()) >= n:
                return f.parent
        assert run.popen.poll() is None, "run ended early:\n" + run.text()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"round {n} not reached within {timeout:g}s:\n" + run.text()[-3000:])


@contextmanager
def run_until(dep: Deployment, name: str, cfg: dict[str, Any], out: Path,
              rows: int) -> Iterator[tuple[FlwrRun, str, Path]]:
    """`flwr run` of ``cfg`` writing under ``out`` (a run a fault test then breaks), handed over
    once its rounds.jsonl has ``rows`` rows: the run, its run id and its run dir; stopped on
    leaving."""
    run = FlwrRun(dep, name, {**cfg, "output-dir": str(out)})
    try:
        yield run, run.run_id(), wait_rounds(out, rows, 240, run)
    finally:
        run.stop()


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and its descendants (executor and app processes included)."""
    tree = descendants([pid])
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return tree


def kill_process(dep: Deployment, name: str) -> list[int]:
    """SIGKILL the deployment's process ``name`` (``supernode-1``, ``superlink``) with its
    descendants, as a machine losing power; reaped and dropped from ``dep.procs`` (``stop()``
    leaves it alone). The pids killed."""
    proc = next(p for p in dep.procs if p.name == name)
    killed = kill_tree(proc.popen.pid)
    proc.popen.wait(timeout=10)
    dep.procs.remove(proc)
    return killed
