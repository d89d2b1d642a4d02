"""``rounds=async`` in process: with concurrency = buffer-size = all clients and constant
staleness the first flush is a sync FedAvg round; with a held-back client, each flush equals
FedBuff's step recomputed here from the tasks and replies in the order they were taken."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from client_app.trainer import local_sgd
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.task.datasets import to_tensor
from fedinit.task.federated_data import client_examples, dataset_of
from fedinit.task.models import get_weights, initial_model, set_weights
from server_app.app import RunAborted, main
from server_app.async_rounds import run_async_experiment
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from strategies import async_loop
from strategies.download_bytes import content_bytes
from tests.sim_engine import InProcessSimulation
from tests.test_fedavg_reference import max_diff, reference_fedavg
from tests.test_resume_and_faults import corrupt

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")  # no plot read, no real wait

SMALL = {"num-clients": 3, "train-limit": 150, "local-epochs": 1, "batch-size": 50,
         "personal-eval-every": 0, "tracking": "off", "rounds": "async"}


class HeldGrid(InProcessGrid):
    """Replies of ``slow`` (a partition id) come back only from pull ``release`` on; every
    reply the loop pulled is kept in order (``pulled``)."""

    def __init__(self, raw: dict[str, Any], slow: int, release: int) -> None:
        super().__init__(raw["num-clients"], raw)
        self.slow_node, self.release, self.pulls = 1000 + slow, release, 0
        self.pulled: list[Message] = []

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        ids = set(message_ids)
        if any(m.metadata.message_type == "train" for m in self.sent
               if m.metadata.message_id in ids):
            self.pulls += 1
            if self.pulls < self.release:
                ids -= {m.metadata.message_id for m in self.sent
                        if m.metadata.dst_node_id == self.slow_node}
        out = list(super().pull_messages(ids))
        self.pulled.extend(m for m in out if m.metadata.message_type == "train")
        return out


def first_model(grid: InProcessGrid) -> list[np.ndarray]:
    """w_0: the model the first train message carried."""
    first = next(m for m in grid.sent if m.metadata.message_type == "train")
    return unpack(first.content.array_records[rk.ARRAYS])


def run(tmp: Path, grid: InProcessGrid | None = None, **over: Any) -> tuple[
        list[np.ndarray], list[dict[str, Any]]]:
    raw = {**SMALL, "output-dir": str(tmp), **over}
    cfg = RunConfig.parse(raw)
    run_async_experiment(grid or InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg, tmp)
    with np.load(tmp / "final_model.npz") as z:
        final = [z[f"arr_{i}"] for i in range(len(z.files))]
    rows = [json.loads(x) for x in (tmp / "rounds.jsonl").read_text().splitlines()]
    return final, rows


def test_all_clients_one_buffer_constant_staleness_is_a_sync_fedavg_round(
        tmp_path: Path) -> None:
    over = {"num-server-rounds": 1, "staleness": "constant", "concurrency": 3,
            "buffer-size": 3, "beta": 0.0}
    grid = InProcessGrid(3, RunConfig.parse({**SMALL, **over}).to_dict())
    got, rows = run(tmp_path, grid, **over)
    sync = RunConfig.parse({**SMALL, **over, "rounds": "sync", "fraction-train": 1.0})
    assert max_diff(got, reference_fedavg(sync)) < 1e-5
    assert rows[0]["round"] == 1 and rows[0]["num-replies"] == 3
    assert rows[0]["staleness-max"] == 0 and rows[0]["clients-trained"] == [0, 1, 2]
    assert rows[0]["state-fallbacks"] == 0
    assert max_diff(got, first_model(grid)) > 1e-3  # the round really moved the model


@pytest.mark.parametrize("method", ["fedprox", "ditto", "fedadam", "scaffold"])
def test_methods_on_fedavgs_or_fedadams_server_rule_match_their_sync_round(
        tmp_path: Path, method: str) -> None:
    """One buffer of all clients at constant staleness is the method's sync round 1 (FedProx
    and Ditto: FedAvg's server rule and their own clients; FedAdam: its optimiser on D;
    SCAFFOLD: its c rule, tests/test_async_state.py)."""
    over = {"num-server-rounds": 1, "staleness": "constant", "concurrency": 3,
            "buffer-size": 3, "method": method}
    got, rows = run(tmp_path / "async", **over)
    raw = {**SMALL, **over, "rounds": "sync", "fraction-train": 1.0,
           "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    grid = InProcessGrid(3, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp_path / "sync")
    with np.load(tmp_path / "sync" / "final_model.npz") as z:
        sync = [z[f"arr_{i}"] for i in range(len(z.files))]
    assert max_diff(got, sync) < 1e-5
    assert max_diff(got, first_model(grid)) > 1e-4  # the round moved the model
    assert rows[0]["num-replies"] == 3


def fedbuff_by_hand(grid: HeldGrid, w0: list[np.ndarray], k: int, flushes: int,
                    s: dict[int, float], max_staleness: int = 0) -> tuple[
                        list[np.ndarray], list[list[int]], int]:
    """FedBuff over the replies in the order the loop pulled them: each task's version is
    the one made here that the model it carried equals (to float32 rounding)."""
    versions = [[a.astype(np.float64) for a in w0]]
    sent = {m.metadata.message_id: m for m in grid.sent}
    buffer: list[tuple[list[np.ndarray], int, float]] = []
    taus, dropped = [], 0
    for reply in grid.pulled:
        if len(versions) > flushes:
            break
        task = sent[reply.metadata.reply_to_message_id]
        carried = unpack(task.content.array_records[rk.ARRAYS])
        gaps = [max_diff([a.astype(np.float32) for a in w], carried) for w in versions]
        v = int(np.argmin(gaps))
        assert gaps[v] < 1e-6  # the task carried one of the versions made here
        tau = len(versions) - 1 - v
        if max_staleness and tau > max_staleness:
            dropped += 1
            continue
        up = unpack(reply.content.array_records[rk.ARRAYS])
        n = float(reply.content.metric_records[rk.METRICS][rk.NUM_EXAMPLES])
        buffer.append(([u.astype(np.float64) - c.astype(np.float64)
                        for u, c in zip(up, carried, strict=True)], tau, n))
        if len(buffer) == k:
            total = sum(n for _, _, n in buffer)
            w = versions[-1]
            new = [a + sum(s[t] * n / total * d[i] for d, t, n in buffer)
                   for i, a in enumerate(w)]
            versions.append([a.astype(np.float32).astype(np.float64) for a in new])
            taus.append(sorted(t for _, t, _ in buffer))
            buffer = []
    return [a.astype(np.float32) for a in versions[-1]], taus, dropped


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_slow_clients_stale_reply_is_weighted_by_s_tau(tmp_path: Path,
                                                        max_staleness: int) -> None:
    over = {"num-server-rounds": 3, "staleness": "poly", "staleness-a": 0.5,
            "concurrency": 3, "buffer-size": 2, "max-staleness": max_staleness}
    raw = {**SMALL, "output-dir": str(tmp_path), **over}
    grid = HeldGrid(RunConfig.parse(raw).to_dict(), slow=2, release=3)
    got, rows = run(tmp_path, grid, **over)
    w0 = first_model(grid)
    s = {t: (1.0 + t) ** -0.5 for t in range(5)}
    want, taus, dropped = fedbuff_by_hand(grid, w0, 2, 3, s, max_staleness)
    assert max_diff(got, want) < 1e-6
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert [r["staleness-max"] for r in rows] == [max(t) for t in taus]
    assert sum(r["dropped-stale"] for r in rows) == dropped
    if max_staleness == 0:  # client 2, held back two versions, is in the last flush at tau 2
        assert taus[-1] == [1, 2] and 2 in rows[-1]["clients-trained"]
        flat, _, _ = fedbuff_by_hand(grid, w0, 2, 3, dict.fromkeys(range(5), 1.0))
        assert max_diff(got, flat) > 1e-6  # s(tau) really changes the model
    else:  # its tau-2 reply is dropped and counted
        assert dropped == 1 and rows[-1]["dropped-stale"] == 1


def local_final(cfg: RunConfig, cid: int, start: list[np.ndarray], rnd: int,
                lr: float) -> list[np.ndarray]:
    """Client ``cid``'s local SGD from ``start`` in round ``rnd``, written as the reference
    FedAvg above runs it."""
    data = dataset_of(cfg)
    model = initial_model(cfg, data)
    set_weights(model, start)
    x, y = client_examples(cfg, cid)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence(
        [cfg.seed, rnd, cid]).generate_state(1)[0]))
    local_sgd(model, to_tensor(x, data.mean, data.std), torch.tensor(y),
              epochs=cfg.train.local_epochs, batch_size=cfg.train.batch_size, lr=lr,
              weight_decay=cfg.train.weight_decay, clip_norm=cfg.train.clip_norm, generator=gen)
    return get_weights(model)


def test_fedinit_starts_from_the_version_sent_and_its_own_last_model(tmp_path: Path) -> None:
    over = {"num-server-rounds": 2, "concurrency": 3, "buffer-size": 2, "beta": 0.1}
    raw = {**SMALL, "output-dir": str(tmp_path), **over}
    cfg = RunConfig.parse(raw)
    grid = HeldGrid(cfg.to_dict(), slow=2, release=3)
    run(tmp_path, grid, **over)
    sent = {m.metadata.message_id: m for m in grid.sent}
    by_client: dict[int, list[tuple[Message, Message]]] = {}
    for reply in grid.pulled:
        task = sent[reply.metadata.reply_to_message_id]
        by_client.setdefault(task.metadata.dst_node_id - 1000, []).append((task, reply))
    twice = [cid for cid, done in by_client.items() if len(done) >= 2]
    assert twice, "no client trained twice: the scenario does not test w_prev"
    w0 = first_model(grid)
    newer = 0
    for cid in twice:
        (task1, reply1), (task2, reply2) = by_client[cid][:2]
        conf = task2.content.config_records[rk.CONFIG]
        carried = unpack(task2.content.array_records[rk.ARRAYS])
        newer += max_diff(carried, w0) > 1e-4  # its second task carried version 1
        w_prev = unpack(reply1.content.array_records[rk.ARRAYS])  # model variant: w_iK
        start = [(c + 0.1 * (c - p)).astype(np.float32) for c, p in zip(carried, w_prev,
                                                                         strict=True)]
        rnd = int(conf[rk.ROUND])
        assert rnd > int(task1.content.config_records[rk.CONFIG][rk.ROUND])
        want = local_final(cfg, cid, start, rnd, float(conf[rk.LR]))
        assert max_diff(unpack(reply2.content.array_records[rk.ARRAYS]), want) < 1e-5
    assert newer, "no second task carried a newer version: the scenario tests too little"


@pytest.mark.slow  # no processes, but ~30 s on a loaded machine (the engine's start)
def test_async_runs_on_flowers_engine_with_state_on_disk(tmp_path: Path) -> None:
    """The same loop on Flower's InMemoryGrid and engine (tests/sim_engine.py): the
    simulation's clients keep their state in files, one version per task's round."""
    over = {**SMALL, "num-clients": 4, "num-server-rounds": 3, "concurrency": 3,
            "buffer-size": 2, "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(over)
    with InProcessSimulation(cfg.num_clients, over) as sim:
        run_async_experiment(sim.grid, cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["num-replies"] == 2 and r["test-acc"] is not None for r in rows)
    assert all(r["state-fallbacks"] == 0 for r in rows)  # each client found its last state
    assert rows[-1]["dispatched"] >= 6 + rows[-1]["in-flight"] - 3
    versions = sorted((tmp_path / "run").rglob("*.npz"))
    assert len([p for p in versions if p.name != "final_model.npz"]) >= 6  # client states


def test_the_app_selects_the_loop_by_rounds_and_stops_when_every_reply_fails(
        tmp_path: Path, serverapp_without_patches: None) -> None:
    """``server_app.app.main``: rounds=async writes the asynchronous columns, sync does not;
    an async run whose every reply is rejected stops with one line (not a dispatch loop)."""
    for rounds in ("async", "sync"):
        raw = RunConfig.parse({**SMALL, "rounds": rounds, "num-server-rounds": 1,
                               "output-dir": str(tmp_path / rounds)}).to_dict()
        main(InProcessGrid(3, raw), Context(run_id=1, node_id=0, node_config={},
                                            state=RecordDict(), run_config=raw))
        (run_dir,) = list((tmp_path / rounds).iterdir())
        row = json.loads((run_dir / "rounds.jsonl").read_text().splitlines()[0])
        assert ("staleness-mean" in row) is (rounds == "async")
    raw = RunConfig.parse({**SMALL, "num-server-rounds": 2, "max-failed-rounds": 2,
                           "concurrency": 3, "buffer-size": 2,
                           "output-dir": str(tmp_path / "bad")}).to_dict()
    grid = InProcessGrid(3, raw)
    grid.reply_filter = lambda r: corrupt("nan", r.metadata.src_node_id)(r)
    with pytest.raises(RunAborted, match=r"rounds=async: 4 replies since version 0 were "
                                         r"rejected or lost \(max-failed-rounds=2 x "
                                         r"buffer-size=2\); stopped"):
        main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                           run_config=raw))


class FakeClock:
    """The loop's clock (``strategies.async_loop.time``): each pull and each pause move it
    ``step`` seconds, so ``round-timeout`` passes in a few in-process pulls."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class DeadClientGrid(InProcessGrid):
    """The client of the first train message dies with it: its train tasks never come back
    (``error=None``) or the SuperLink answers them with ``error`` (Node Unavailable)."""

    def __init__(self, raw: dict[str, Any], error: int | None = None,
                 clock: FakeClock | None = None) -> None:
        super().__init__(raw["num-clients"], raw)
        self.dead: int | None = None
        self.error, self.clock = error, clock
        self.reply_filter = self.kill

    def kill(self, reply: Message) -> Message | None:
        if reply.metadata.message_type != "train":
            return reply
        node = reply.metadata.src_node_id
        self.dead = node if self.dead is None else self.dead
        if node != self.dead:
            return reply
        if self.error is None:
            return None
        task = next(m for m in self.sent
                    if m.metadata.message_id == reply.metadata.reply_to_message_id)
        return Message(Error(code=self.error, reason="Error: Node Unavailable"), reply_to=task)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if self.clock is not None:
            self.clock.now += self.clock.step
        return super().pull_messages(message_ids)

    def train_sent_to(self, node: int) -> int:
        return sum(m.metadata.message_type == "train" and m.metadata.dst_node_id == node
                   for m in self.sent)


@pytest.mark.parametrize(("error", "concurrency", "versions"), [
    (None, 3, 6), (ErrorCode.NODE_UNAVAILABLE, 3, 6), (None, 4, 12)])
def test_a_dead_clients_task_is_lost_and_its_slot_goes_to_another_client(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        error: int | None, concurrency: int, versions: int) -> None:
    """A task that never returns is given up at round-timeout (also while other replies keep
    coming), one the SuperLink answers with Node Unavailable at once: counted in num-missing,
    never aggregated, its slot re-sent to another idle client, the dead client benched
    (round-timeout, doubled per loss); the run completes its versions. With concurrency 4 of
    4 a slot that no other client can take goes to it again."""
    over = {"num-clients": 4, "num-server-rounds": versions, "concurrency": concurrency,
            "buffer-size": 2, "staleness": "poly", "staleness-a": 0.5,
            "round-timeout": 1.0 if error is None else 600.0}  # 1 s on the fake clock
    raw = RunConfig.parse({**SMALL, **over, "output-dir": str(tmp_path)}).to_dict()
    clock = None if error is not None else FakeClock(0.3 if concurrency == 3 else 0.6)
    if clock is not None:
        monkeypatch.setattr(async_loop, "time", clock)
    grid = DeadClientGrid(raw, error, clock)
    with caplog.at_level(logging.INFO):
        _, rows = run(tmp_path, grid, **over)
    dead = (grid.dead or 0) - 1000
    assert [r["round"] for r in rows] == list(range(1, versions + 1))
    assert all(r["num-replies"] == 2 and r["num-rejected"] == 0 for r in rows)
    assert all(dead not in r["clients-trained"] for r in rows)
    assert all(c != dead for r in rows for c, _, _, _ in r["buffered"])
    sent_dead = grid.train_sent_to(1000 + dead)
    missing = sum(r["num-missing"] for r in rows)
    assert missing >= 1 and sent_dead - missing in (0, 1)  # one may still be out at the end
    if error is not None:  # benched for round-timeout after its loss: never asked again
        assert sent_dead == 1 and missing == 1
    resent = [r.getMessage() for r in caplog.records if "lost task(s) re-sent" in r.getMessage()]
    assert resent, "no lost slot was refilled"
    if concurrency == 3:  # an idle client was there to take the slot
        assert all(f"[{dead}]" not in line for line in resent)
    else:  # a slot no other client takes (or its pause ran out): it is tried again
        assert sent_dead >= 2
    for r in rows:  # tau = the version it arrived at - the version sent; weight (1 + tau)^-a
        assert [t for _, _, t, _ in r["buffered"]] == [r["round"] - 1 - v
                                                      for _, v, _, _ in r["buffered"]]
        assert max(t for _, _, t, _ in r["buffered"]) == r["staleness-max"]
        assert all(s == pytest.approx((1.0 + t) ** -0.5) for _, _, t, s in r["buffered"])


def test_a_benched_client_takes_only_a_slot_no_other_can() -> None:
    def pick(idle: set[int], benched: set[int], free: int) -> list[int]:
        return async_loop.choose(idle, benched, free, np.random.default_rng([0, 32]))

    assert pick({0, 1, 2, 3}, set(), 3) == [1, 0, 2]  # seed 0's draws, as without a bench
    assert sorted(pick({0, 1, 2, 3}, {2}, 3)) == [0, 1, 3]  # enough others: 2 passed over
    assert pick({0, 2}, {2}, 2)[0] == 0 and sorted(pick({0, 2}, {2}, 2)) == [0, 2]
    assert pick({2}, {2}, 1) == [2]  # the only idle client takes the free slot
    assert pick({0, 1}, set(), 0) == []


def test_fedrelax_one_buffer_is_its_sync_round_and_its_tasks_content_is_checkpointed(
        tmp_path: Path) -> None:
    """Through ``run_async_experiment``: one buffer of all clients is FedRelax's sync round 1
    (the server's copies in the run directory, graph.json written); with buffer-size 2 of 3
    the checkpoint keeps each task in flight's own m_i and d_i (``task-<seq>/...``)."""
    graph = tmp_path / "graph.txt"
    graph.write_text("0 1 1.0\n1 2 0.5\n")
    over = {"num-server-rounds": 1, "staleness": "constant", "concurrency": 3,
            "buffer-size": 3, "method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.5,
            "graph": f"file:{graph}"}
    got, rows = run(tmp_path / "async", **over)
    cfg = RunConfig.parse({**SMALL, **over, "rounds": "sync", "fraction-train": 1.0,
                           "output-dir": str(tmp_path)})
    grid = InProcessGrid(3, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp_path / "sync")
    with np.load(tmp_path / "sync" / "final_model.npz") as z:
        sync = [z[f"arr_{i}"] for i in range(len(z.files))]
    assert max_diff(got, sync) < 1e-5
    assert max_diff(got, first_model(grid)) > 1e-4
    assert rows[0]["num-replies"] == 3
    assert sorted(p.name for p in (tmp_path / "async" / "server-models").iterdir()) == \
        ["0", "1", "2"]
    assert (tmp_path / "async" / "graph.json").is_file()
    run(tmp_path / "two", **{**over, "buffer-size": 2, "num-server-rounds": 2})
    ckpt = load_checkpoint(tmp_path / "two")
    in_flight = ckpt.async_state["in-flight"]  # type: ignore[index]
    assert in_flight
    for row in in_flight:
        assert f"task-{row[5]}/{rk.ARRAYS}" in ckpt.extra
        assert f"task-{row[5]}/fedrelax-degree" in ckpt.extra


def test_each_flush_row_counts_the_bytes_sent_and_buffered_since_the_last(
        tmp_path: Path) -> None:
    """``bytes-down``: the train messages pushed between two flushes, as serialized
    (``content_bytes``, pinned by hand in tests/test_bytes_down.py), the row's ``dispatched``
    telling which; ``bytes-up``: each buffered reply's float32 model, uncompressed."""
    over = {"num-server-rounds": 2, "concurrency": 2, "buffer-size": 2, "beta": 0.0}
    grid = InProcessGrid(3, RunConfig.parse({**SMALL, **over}).to_dict())
    _, rows = run(tmp_path, grid, **over)
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    model_bytes = sum(a.nbytes for a in first_model(grid))
    sent_before = 0
    for row in rows:
        assert row[rk.BYTES_DOWN] == content_bytes(train[sent_before:row["dispatched"]]) > 0
        assert row[rk.BYTES_UP] == row["num-replies"] * model_bytes
        sent_before = row["dispatched"]
