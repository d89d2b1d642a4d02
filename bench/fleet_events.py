"""What the ordinary events of a real fleet cost a process deployment, round by round, and what
device data trains beside the partitioned benchmark.

    .venv/bin/python -m bench.fleet_events                    # about 6-8 minutes
    .venv/bin/python -m bench.fleet_events --round-timeout 30 --train-limit 4000

Two TLS + node-auth process deployments on 127.0.0.1 (warm executors, 4 clients,
fraction-train=1.0, min-clients=3, a copy of the app that can hang on order,
testbeds/fault_app.py), the same run config in both:

  events    nodes 0-2 start; after round 1 node 3 starts (a late joiner); one round after it
            trained, a registered node with a wrong identity (num-partitions=7) starts; one
            round after it was refused, client 0's train task hangs in a round chosen then
            (the node's executor kills it at task-deadline = round-timeout); one round after
            that, node 1 is killed (SIGKILL of its process tree). The run is stopped once the
            dead node no longer costs a round (two rounds without a missing reply).
  baseline  all four nodes from the start, no event, stopped after as many rounds.

Per event: the round it hit (late joiner: its first trained round; wrong identity: the round
that refused it; hung task: the round it hung in; dead node: the round after the kill), that
round's seconds minus the baseline's same round, and the extra seconds of the rounds after
(each round's excess summed while it is above max(1 s, 25 % of the baseline round) and
before the next event's round). Rounds are the ServerApp's ``round-seconds`` and
``collect-seconds`` (rounds.jsonl).

Then the baseline's deployment runs the same config with ``dataset=device``: each node's
``data-dir`` is an .npz file holding its benchmark partition (written here). The same
partitioned config runs in this process (the real round loop and ClientApp handlers,
fedinit/cli/inprocess_run.py's path, one torch thread); both final models are scored on the
central Fashion-MNIST test set the same way (server_app/central_eval.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedinit.cli.deploy_local import CONNECTION, Deployment, stop_pids
from fedinit.cli.simulate import RUN_ID, run_status
from testbeds.deployment_runs import kill_process, start_flwr_run
from testbeds.fault_app import fault_app, hang_when_told

CLIENTS = 4
WRONG = 4
"""Node key 4: registered with the SuperLink, no client of the run, num-partitions=7."""
DEAD = 1
HUNG = 0
LATE = 3
POLL = 0.1


class BenchError(RuntimeError):
    """A run did not get where the bench needs it."""


@dataclass
class DataDeployment(Deployment):
    """deploy_local's Deployment whose node i also gets ``data-dir=<data_dirs[i]>``."""

    data_dirs: dict[int, Path] = field(default_factory=dict)

    def node_command(self, i: int, key: Path | None = None, root_ca: Path | None = None,
                     no_ca: bool = False, extra: list[str] | None = None) -> list[str]:
        cmd = super().node_command(i, key, root_ca, no_ca, extra)
        if i in self.data_dirs:
            at = cmd.index("--node-config") + 1
            cmd[at] += f' data-dir="{self.data_dirs[i]}"'
        return cmd


class Run:
    """`flwr run --stream` of ``app`` on ``dep``, output to a log; rows read as they come."""

    def __init__(self, dep: Deployment, app: Path, name: str, cfg: dict[str, Any]) -> None:
        self.dep, self.out = dep, Path(cfg["output-dir"])
        self.log = dep.logs / f"run-{name}.log"
        self.popen = start_flwr_run(dep, app, name, cfg, self.log)
        self.run_id = ""

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def rows(self) -> list[dict[str, Any]]:
        """The complete rows of rounds.jsonl so far."""
        found = []
        for f in self.out.glob("*/rounds.jsonl"):
            lines = f.read_text().split("\n")[:-1]  # the last piece may be half written
            found = [json.loads(x) for x in lines if x]
        return found

    def wait_rows(self, n: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.rows()
            if len(rows) >= n:
                return rows
            if self.popen.poll() is not None:
                raise BenchError(f"the run ended before round {n}:\n{self.text()[-3000:]}")
            time.sleep(POLL)
        raise BenchError(f"round {n} not reached within {timeout:g}s:\n{self.text()[-3000:]}")

    def finish(self, timeout: float) -> str:
        """Wait for the run to end; its status."""
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise BenchError(f"run not done within {timeout:g}s:\n{self.text()[-3000:]}") \
                from None
        return run_status(self.dep.cli_env(), self.id(), CONNECTION)

    def stop(self) -> None:
        """`flwr stop` the run (the bench has the rows it needs) and wait for the CLI."""
        subprocess.run(["flwr", "stop", self.id(), CONNECTION], env=self.dep.cli_env(),
                       capture_output=True, check=False, timeout=60)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=30)
        self.close()

    def id(self) -> str:
        if not self.run_id and (m := RUN_ID.search(self.text())):
            self.run_id = m.group(1)
        return self.run_id

    def close(self) -> None:
        stop_pids([self.popen.pid], grace=5.0)


def run_config(args: argparse.Namespace, out: Path, registry: Path) -> dict[str, Any]:
    """The config both the baseline and the events run use (output-dir aside)."""
    return {"num-clients": CLIENTS, "min-clients": CLIENTS - 1, "fraction-train": 1.0,
            "num-server-rounds": args.max_rounds, "eval-every": args.max_rounds,
            "personal-eval-every": 0, "train-limit": args.train_limit, "local-epochs": 1,
            "seed": 0, "round-timeout": args.round_timeout, "node-wait-timeout": 120.0,
            "node-registry": str(registry), "output-dir": str(out)}


# ------------------------------------------------------------------- the events run
@dataclass
class Events:
    """Hit rounds found while the events run goes on."""

    hits: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def events_run(args: argparse.Namespace, tmp: Path, app: Path, order: Path) -> tuple[
        list[dict[str, Any]], Events]:
    dep = Deployment(tmp / "events", CLIENTS + 1, base_port=args.base_port + 50,
                     num_partitions=CLIENTS)
    ev = Events()
    try:
        dep.up(start=[0, 1, 2])
        registry = json.loads(dep.registry.read_text())
        (wrong,) = [n for n, i in registry.items() if i == WRONG]
        del registry[wrong]  # registered with the SuperLink, no client of the run
        dep.registry.write_text(json.dumps(registry))
        run = Run(dep, app, "events", run_config(args, tmp / "events-out", dep.registry))
        try:
            rows = run.wait_rows(1, 300)
            dep.start_node(LATE)
            ev.notes["late joiner"] = f"node {LATE} started after round 1"
            while not any(LATE in r["clients-trained"] for r in rows):
                rows = run.wait_rows(len(rows) + 1, 120)
            ev.hits["late joiner"] = next(r["round"] for r in rows
                                          if LATE in r["clients-trained"])
            rows = run.wait_rows(ev.hits["late joiner"] + 1, 120)
            cmd = dep.node_command(WRONG)
            at = cmd.index("--node-config") + 1
            cmd[at] = cmd[at].replace(f"partition-id={WRONG} num-partitions={CLIENTS}",
                                      "partition-id=1 num-partitions=7")
            dep.start_node(WRONG, cmd=cmd, name="supernode-wrong")
            ev.notes["wrong identity"] = (f"node key {WRONG} (registered, not in the run's "
                                          f"registry, num-partitions=7) started after round "
                                          f"{len(rows)}")
            refusal = f"refused node {wrong}:"
            deadline = time.monotonic() + 180
            while refusal not in run.text():
                if time.monotonic() > deadline or run.popen.poll() is not None:
                    raise BenchError("the wrong node was not refused:\n" + run.text()[-3000:])
                time.sleep(POLL)
            ev.hits["wrong identity"] = len(run.rows()) + 1  # refused when this round began
            rows = run.wait_rows(ev.hits["wrong identity"] + 1, 120)
            ev.hits["hung task"] = len(rows) + 2  # round len+1 may have reached the node
            order.write_text(str(ev.hits["hung task"]))
            ev.notes["hung task"] = (f"client {HUNG}'s train task sleeps forever "
                                     f"(task-deadline 0 = round-timeout)")
            rows = run.wait_rows(ev.hits["hung task"] + 1, 180)
            order.unlink()  # the same app serves the baseline: it must not hang there
            kill_process(dep, f"supernode-{DEAD}")
            ev.hits["dead node"] = len(rows) + 1
            ev.notes["dead node"] = f"node {DEAD} SIGKILLed after round {len(rows)}"
            quiet = 0  # rounds in a row without a missing reply or the dead node's error
            while quiet < 2:
                rows = run.wait_rows(len(rows) + 1, 180)
                last = rows[-1]
                quiet = quiet + 1 if last["num-missing"] + last["num-rejected"] == 0 else 0
            if len(rows) >= args.max_rounds:
                raise BenchError(f"--max-rounds {args.max_rounds} too few for the events")
        finally:
            run.stop()
        return rows, ev
    finally:
        dep.stop()
        stop_pids(_pids_mentioning(str(dep.work_dir)))


# ------------------------------------------------------------------- baseline and device data
def device_files(cfg: dict[str, Any], root: Path) -> dict[int, Path]:
    """Each client's benchmark partition as its own .npz (``x`` uint8 NHWC, ``y``)."""
    from fedinit.config import RunConfig
    from fedinit.task.federated_data import dataset_of, partition_indices

    bench = RunConfig.parse(cfg)
    data = dataset_of(bench)
    root.mkdir(parents=True)
    files = {}
    for cid in range(bench.num_clients):
        idx = partition_indices(bench, cid)
        files[cid] = root / f"client-{cid}.npz"
        np.savez(files[cid], x=data.train_x[idx], y=data.train_y[idx])
    return files


def device_config(partitioned: dict[str, Any]) -> dict[str, Any]:
    """``partitioned`` on device data: the Fashion-MNIST schema, claimed counts capped high
    enough that no partition is cut (so the weights are the partition sizes)."""
    from fedinit.data_sets.fashion_mnist import SCHEMA

    return {**partitioned, "dataset": "device",
            "device-classes": "tshirt,trouser,pullover,dress,coat,sandal,shirt,sneaker,bag,boot",
            "device-image-size": SCHEMA.image_size, "device-channels": SCHEMA.in_channels,
            "device-mean": ",".join(f"{m:g}" for m in SCHEMA.mean),
            "device-std": ",".join(f"{s:g}" for s in SCHEMA.std),
            "max-examples-per-client": 60000}


def baseline_and_device(args: argparse.Namespace, tmp: Path, app: Path, rounds: int,
                        ) -> tuple[list[dict[str, Any]], Path, dict[str, Any]]:
    """Baseline rows (``rounds`` of them), then the device-data run's results dir and config."""
    dep = DataDeployment(tmp / "baseline", CLIENTS, base_port=args.base_port)
    try:
        dep.up(start=[])  # registry first: the device config needs the node keys
        partitioned = {**run_config(args, tmp / "device-out", dep.registry),
                       "min-clients": 0, "num-server-rounds": args.device_rounds,
                       "eval-every": args.device_rounds}
        dep.data_dirs = device_files(partitioned, tmp / "device-data")
        for i in range(CLIENTS):
            dep.start_node(i)
        run = Run(dep, app, "baseline", run_config(args, tmp / "baseline-out", dep.registry))
        try:
            rows = run.wait_rows(rounds, 120 + 60 * rounds)[:rounds]
        finally:
            run.stop()
        device = device_config(partitioned)
        run = Run(dep, app, "device", device)
        try:
            status = run.finish(120 + 90 * args.device_rounds)
        finally:
            run.close()
        if status != "finished:completed":
            raise BenchError(f"device-data run: {status}\n{run.text()[-3000:]}")
        (summary,) = list((tmp / "device-out").glob("*/summary.json"))
        return rows, summary.parent, partitioned
    finally:
        dep.stop()
        stop_pids(_pids_mentioning(str(dep.work_dir)))


def partitioned_in_process(cfg: dict[str, Any], out: Path) -> Path:
    """The partitioned benchmark's run of ``cfg`` in this process (fedinit/cli/inprocess_run.py)."""
    import torch

    from fedinit.cli.inprocess_grid import InProcessGrid
    from fedinit.config import RunConfig
    from server_app.experiment import run_experiment

    raw = {k: v for k, v in cfg.items() if k not in ("node-registry", "min-clients")}
    parsed = RunConfig.parse(raw)
    torch.set_num_threads(1)
    run_experiment(InProcessGrid(parsed.num_clients, parsed.to_dict()), parsed, out_dir=out)
    return out


def central_score(cfg: dict[str, Any], run: Path) -> tuple[float, float, list[np.ndarray]]:
    """(test accuracy, test loss, weights) of ``run``'s final model on the central test set."""
    from fedinit.config import RunConfig
    from server_app.central_eval import CentralEvaluator

    with np.load(run / "final_model.npz") as z:
        weights = [z[f"arr_{i}"] for i in range(len(z.files))]
    raw = {k: v for k, v in cfg.items() if k not in ("node-registry", "min-clients")}
    loss, acc = CentralEvaluator(RunConfig.parse(raw))(weights)
    return acc, loss, weights


# ------------------------------------------------------------------- numbers
def event_costs(events: list[dict[str, Any]], base: list[dict[str, Any]], ev: Events,
                ) -> list[dict[str, Any]]:
    """Per event: hit round, its extra seconds, the rounds after that still cost extra."""
    secs = {r["round"]: r["round-seconds"] for r in events}
    collect = {r["round"]: r["collect-seconds"] for r in events}
    bsecs = {r["round"]: r["round-seconds"] for r in base}
    bcollect = {r["round"]: r["collect-seconds"] for r in base}
    order = sorted(ev.hits.items(), key=lambda kv: kv[1])
    last = min(max(secs), max(bsecs))
    out = []
    for k, (name, hit) in enumerate(order):
        end = order[k + 1][1] if k + 1 < len(order) else last + 1
        after: list[int] = []
        for rnd in range(hit + 1, end):
            if secs[rnd] - bsecs[rnd] <= max(1.0, 0.25 * bsecs[rnd]):
                break
            after.append(rnd)
        out.append({"event": name, "what": ev.notes.get(name, ""), "round": hit,
                    "round-seconds": secs[hit], "baseline-round-seconds": bsecs[hit],
                    "extra-seconds": secs[hit] - bsecs[hit],
                    "extra-collect-seconds": collect[hit] - bcollect[hit],
                    "after-rounds": after,
                    "after-extra-seconds": sum(secs[r] - bsecs[r] for r in after),
                    "total-extra-seconds": sum(secs[r] - bsecs[r] for r in [hit, *after])})
    return out


def print_rounds(events: list[dict[str, Any]], base: list[dict[str, Any]],
                 hits: dict[str, int]) -> None:
    at = {r: name for name, r in hits.items()}
    bmap = {r["round"]: r for r in base}
    print("\n| round | events s | collect s | clients trained | missing | rejected "
          "| baseline s | collect s | extra s | event |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for r in events:
        b = bmap.get(r["round"])
        if b is None:
            continue
        print(f"| {r['round']} | {r['round-seconds']:.1f} | {r['collect-seconds']:.1f} "
              f"| {r['clients-trained']} | {r['num-missing']} | {r['num-rejected']} "
              f"| {b['round-seconds']:.1f} | {b['collect-seconds']:.1f} "
              f"| {r['round-seconds'] - b['round-seconds']:+.1f} | {at.get(r['round'], '')} |")


def print_costs(costs: list[dict[str, Any]]) -> None:
    print("\n| event | round | round s | baseline s | extra s | rounds after | "
          "extra s after | total extra s |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for c in costs:
        after = (f"{c['after-rounds'][0]}-{c['after-rounds'][-1]}" if c["after-rounds"]
                 else "none")
        print(f"| {c['event']} | {c['round']} | {c['round-seconds']:.1f} "
              f"| {c['baseline-round-seconds']:.1f} | {c['extra-seconds']:+.1f} | {after} "
              f"| {c['after-extra-seconds']:+.1f} | {c['total-extra-seconds']:+.1f} |")


def _pids_mentioning(text: str) -> list[int]:
    from fedinit.cli.deploy_local import pids_mentioning

    return pids_mentioning(text)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--round-timeout", type=float, default=20.0)
    ap.add_argument("--train-limit", type=int, default=2000)
    ap.add_argument("--max-rounds", type=int, default=60,
                    help="num-server-rounds of both runs (the bench stops them earlier)")
    ap.add_argument("--device-rounds", type=int, default=4)
    ap.add_argument("--base-port", type=int, default=40500,
                    help="baseline deployment on BASE (BASE..BASE+13), events on BASE+50")
    args = ap.parse_args(argv)
    if args.round_timeout < 5 or args.train_limit < 4 * CLIENTS or args.device_rounds < 1:
        ap.error(f"--round-timeout {args.round_timeout:g} --train-limit {args.train_limit} "
                 f"--device-rounds {args.device_rounds}: allowed round-timeout >= 5, "
                 f"train-limit >= {4 * CLIENTS}, device-rounds >= 1")
    t0 = time.monotonic()
    print(f"fleet_events: start, {load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp_name:
        tmp = Path(tmp_name)
        order = tmp / "hang-round"
        app = fault_app(tmp / "app", hang_when_told(order, HUNG, tmp / "hung-child.pid"))
        try:
            events, ev = events_run(args, tmp, app, order)
            print(f"fleet_events: events run done, {len(events)} rounds, "
                  f"{time.monotonic() - t0:.0f}s, {load()}", flush=True)
            base, device_run, partitioned = baseline_and_device(args, tmp, app, len(events))
            print(f"fleet_events: baseline and device runs done, {time.monotonic() - t0:.0f}s, "
                  f"{load()}", flush=True)
            sim_run = partitioned_in_process(partitioned, tmp / "sim-out" / "run")
        except BenchError as err:
            print(f"fleet_events: {err}", file=sys.stderr)
            return 1
        finally:
            child = tmp / "hung-child.pid"
            if child.exists():  # the executor kills it; never leave it behind
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(child.read_text()), signal.SIGKILL)
        dev_acc, dev_loss, dev_w = central_score(partitioned, device_run)
        sim_acc, sim_loss, sim_w = central_score(partitioned, sim_run)
        fed = json.loads((device_run / "summary.json").read_text())
    same = all(a.tobytes() == b.tobytes() for a, b in zip(dev_w, sim_w, strict=True))
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(dev_w, sim_w, strict=True))
    costs = event_costs(events, base, ev)
    print(f"\nconfig: {CLIENTS} clients, min-clients={CLIENTS - 1}, fraction-train=1.0, "
          f"train-limit={args.train_limit}, round-timeout={args.round_timeout:g}s, "
          f"TLS + node auth, warm executors")
    for name in ev.hits:
        print(f"  {name}: {ev.notes[name]}")
    print_rounds(events, base, ev.hits)
    print_costs(costs)
    print(f"\ndevice data ({args.device_rounds} rounds, each node an .npz of its partition, "
          f"process deployment) vs the partitioned in-process run, on the central test set:")
    print(f"  device deployment: acc {100 * dev_acc:.2f}%, loss {dev_loss:.4f} (its federated "
          f"final acc {100 * (fed.get('final-test-acc') or float('nan')):.2f}%)")
    print(f"  partitioned run:   acc {100 * sim_acc:.2f}%, loss {sim_loss:.4f}")
    print(f"  final models bit-identical: {same} (max |diff| {worst:.3g})")
    wall = time.monotonic() - t0
    print(f"\nwall {wall:.0f}s, {load()}\n")
    for c in costs:
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                          for k, v in c.items()}))
    print(json.dumps({"device-data": {"device-test-acc": dev_acc, "device-test-loss": dev_loss,
                                      "partitioned-test-acc": sim_acc,
                                      "partitioned-test-loss": sim_loss,
                                      "bit-identical": same, "max-abs-diff": worst,
                                      "device-federated-final-acc": fed.get("final-test-acc")},
                      "wall-seconds": round(wall, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
