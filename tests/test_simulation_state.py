"""In a simulation, client state lives in files, not in the engine's Contexts, and the engine's
own partition assignment replaces the per-node identity round trip (Flower's engine in-process,
tests/sim_engine.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, MessageType

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.store.simulated_state import RUN_SUBDIR
from server_app.clients import FederationError, discover_clients
from server_app.engine_facts import client_state_entry
from server_app.experiment import run_experiment
from tests.sim_engine import InProcessSimulation

pytestmark = pytest.mark.usefixtures("quick_runs")

TWICE = {"num-clients": 4, "fraction-train": 1.0, "num-server-rounds": 2, "train-limit": 400,
         "local-epochs": 1, "method": "scaffold", "beta": 0.1, "eval-every": 2}
"""SCAFFOLD + RI: each client keeps w_prev and c_i; all 4 train in both rounds."""


def final_model(run_dir: Path) -> list[np.ndarray]:
    with np.load(run_dir / "final_model.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def arrays_held(sim: InProcessSimulation) -> int:
    """Array entries the engine keeps in its nodes' Contexts (context.state)."""
    return sum(len(c.state.array_records) for c in sim.contexts())


def simulate(tmp: Path, mode: str) -> tuple[Path, list[int]]:
    """One run in the in-process engine; its run directory and the arrays the engine held in
    its Contexts at the start of each round (after every earlier round's replies)."""
    overrides: dict[str, Any] = {**TWICE, "simulation-client-state": mode,
                                 "output-dir": str(tmp / "out")}
    cfg = RunConfig.parse(overrides)
    held: list[int] = []
    with InProcessSimulation(cfg.num_clients, overrides) as sim:
        send = sim.grid.send_and_receive

        def counting(messages: Iterable[Message], *, timeout: float | None = None
                     ) -> Iterable[Message]:
            msgs = list(messages)
            if msgs and msgs[0].metadata.message_type == MessageType.TRAIN:
                held.append(arrays_held(sim))
            return send(msgs, timeout=timeout)

        sim.grid.send_and_receive = counting  # type: ignore[method-assign]
        run_experiment(sim.grid, cfg, out_dir=tmp / mode)
        held.append(arrays_held(sim))
    return tmp / mode, held


def test_simulated_clients_keep_state_on_disk_only_and_end_bit_identical(tmp_path: Path) -> None:
    disk_dir, disk_held = simulate(tmp_path, "disk")
    mem_dir, mem_held = simulate(tmp_path, "memory")
    # memory: after round 1 each of the 4 contexts holds w_prev and c_i (the test sees state);
    # after round 2 also the c_i of round 1, the version the server has accounted for until a
    # later message says it aggregated round 2's reply (fedinit/store/client_store.py)
    assert mem_held == [0, 8, 12]
    # disk: the engine's Contexts hold no client arrays between rounds, nor at the end
    assert disk_held == [0, 0, 0]
    exp = disk_dir / RUN_SUBDIR / disk_dir.name
    files = sorted(str(p.relative_to(exp)) for p in exp.rglob("*.npz"))
    assert files == [f"client-{i}/r{r:06d}.npz" for i in range(4) for r in (1, 2)]
    assert not (mem_dir / RUN_SUBDIR).exists()
    want, got = final_model(mem_dir), final_model(disk_dir)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want, strict=True))


class CountingSim(InProcessSimulation):
    """Counts the messages the server sends, by type."""

    def __enter__(self) -> CountingSim:
        super().__enter__()
        self.sent: list[Message] = []
        send = self.grid.send_and_receive

        def counting(messages: Iterable[Message], *, timeout: float | None = None
                     ) -> Iterable[Message]:
            msgs = list(messages)
            self.sent += msgs
            return send(msgs, timeout=timeout)

        self.grid.send_and_receive = counting  # type: ignore[method-assign]
        return self


def test_simulation_partitions_come_from_the_engine_with_three_queries() -> None:
    overrides = {"num-clients": 12, "train-limit": 120}
    with CountingSim(12, overrides) as sim:
        node_of = discover_clients(sim.grid, RunConfig.parse(overrides))
    assert node_of == {cid: node for node, cid in sim.mapping.items()}
    assert [m.metadata.message_type for m in sim.sent] == [MessageType.QUERY] * 3


def test_a_one_client_simulation_is_identified() -> None:
    overrides = {"num-clients": 1, "train-limit": 10}
    with InProcessSimulation(1, overrides) as sim:
        node_of = discover_clients(sim.grid, RunConfig.parse(overrides))
    assert node_of == {0: next(iter(sim.mapping))}


@pytest.mark.parametrize("num_clients", [3, 5])
def test_simulation_of_the_wrong_size_is_refused(num_clients: int) -> None:
    overrides = {"num-clients": num_clients, "train-limit": 100, "node-wait-timeout": 30.0}
    with InProcessSimulation(4, overrides) as sim, \
            pytest.raises(FederationError, match=f"num-clients={num_clients}"):
        discover_clients(sim.grid, RunConfig.parse(overrides))


def test_deployments_are_not_told_where_to_keep_state(tmp_path: Path) -> None:
    cfg = RunConfig.parse({"num-clients": 2, "train-limit": 20})
    assert client_state_entry(InProcessGrid(2, cfg.to_dict()), cfg, tmp_path) == {}


def test_personalized_evaluation_reads_the_simulated_clients_state_files(
        tmp_path: Path) -> None:
    """A simulated client's own model (w_prev) lives only in its state files: the evaluate
    message must lead the client there, or (c) is missing for every client."""
    import json

    rows = {}
    for mode in ("disk", "memory"):
        overrides: dict[str, Any] = {**TWICE, "simulation-client-state": mode,
                                     "personal-eval-every": 2, "personal-eval-clients": 0,
                                     "output-dir": str(tmp_path / "out")}
        cfg = RunConfig.parse(overrides)
        with InProcessSimulation(cfg.num_clients, overrides) as sim:
            run_experiment(sim.grid, cfg, out_dir=tmp_path / mode)
        last = (tmp_path / mode / "rounds.jsonl").read_text().splitlines()[-1]
        rows[mode] = json.loads(last)
    assert rows["disk"]["local-own-clients"] == 4
    for key in ("local-own-mean", "local-finetuned-mean", "local-global-mean"):
        assert rows["disk"][key] == rows["memory"][key], key
