"""``rounds=async`` on the least-squares problem: the real FedBuff loop (``AsyncLoop``), its
strategy and the real client path (``client_round`` with a client store and state directory
per client), with the order of the replies written by hand or derived from device speeds.

Every client is always training (concurrency = N), so the order of replies alone fixes the
run: a client's reply is handed back when the script names it, and its next task goes out
at once, carrying the version current after that reply (and after the flush it completed).
A scripted reply may be lost (the SuperLink's ``Node Unavailable``: the client trained and
saved its state, the server never saw it) or rejected (its arrays NaN).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from client_app.round import client_round
from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import pack, shapes, unpack
from fedinit.store.client_store import ClientStore
from fedinit.store.state_dir import StateDir
from strategies.async_loop import AsyncLoop, BufferedStrategy
from testbeds.lsq_problem import Problem, VectorModel

EXPERIMENT = "lsq-async"
"""The experiment id the clients' state directories are named by."""
Script = list[tuple[int, str]]
"""(client, fate): ``ok``, ``lost``, ``nan`` or ``flip`` (its upload x -10), in the order the
replies come back."""


class ScriptedGrid(Grid):
    """Each train message answered at push (the client trains and saves its state then, as
    a node does before it replies) by the real client path with a disk state dir; one reply
    handed back per pull, the next one the script names."""

    def __init__(self, p: Problem, cfg: RunConfig, script: Script, root: Path,
                 experiment: str = EXPERIMENT) -> None:
        set_task_identity()
        self.p, self.cfg, self.root, self.experiment = p, cfg, root, experiment
        self.script = list(script)
        self.memory = {cid: RecordDict() for cid in range(p.num_clients)}
        self.pending: dict[int, tuple[Message, Message]] = {}
        self.pushed = 0

    def store(self, cid: int) -> ClientStore:
        return ClientStore(self.memory[cid], StateDir(self.root, self.experiment, cid))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            self.pushed += 1
            msg.metadata.__dict__["_message_id"] = f"task-{self.pushed}"
            ids.append(msg.metadata.message_id)
            cid = msg.metadata.dst_node_id - 1000
            assert cid not in self.pending, "a client was sent two tasks at once"
            self.pending[cid] = (msg, self.answer(cid, msg))
        return ids

    def answer(self, cid: int, msg: Message) -> Message:
        """What ``client_app.app.train_content`` does, on the problem's data and model."""
        conf = msg.content.config_records[rk.CONFIG]
        rnd, accounted = int(conf[rk.ROUND]), int(conf[rk.ACCOUNTED_ROUND])
        store = self.store(cid)
        store.restore(self.experiment, rnd, shapes(msg.content.array_records[rk.ARRAYS]), accounted,
                      self.cfg.spec.client.accounted_keys)
        p = self.p
        content = client_round(self.cfg, self.cfg.spec.client(self.cfg.params), msg.content,
                               store, VectorModel(p.w0, p.linear), p.xs[cid], p.ys[cid],
                               initial=lambda: [p.w0], partition_id=cid, loss_fn=p.loss_fn)
        store.save(self.experiment, rnd, pin=rk.kept_rounds(conf))
        return Message(content=content, reply_to=msg)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        assert self.script, "the loop wants more replies than the script holds"
        cid, fate = self.script.pop(0)
        task, reply = self.pending.pop(cid)
        assert task.metadata.message_id in set(message_ids)
        if fate == "lost":
            return [Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node gone"),
                            reply_to=task)]
        if fate == "nan":
            arrays = reply.content.array_records[rk.ARRAYS]
            reply.content.array_records[rk.ARRAYS] = pack(
                [np.full(a.shape, np.nan, np.float32) for a in arrays.to_numpy_ndarrays()])
        if fate == "flip":  # a hostile reply: its upload times -10 (passes every check)
            arrays = reply.content.array_records[rk.ARRAYS]
            reply.content.array_records[rk.ARRAYS] = pack(
                [-10.0 * a for a in unpack(arrays)])
        return [reply]

    # the rest of Grid's API is not used by the loop
    def set_run(self, run: Any) -> None:  # pragma: no cover
        raise NotImplementedError

    @property
    def run(self) -> Any:  # pragma: no cover
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:  # pragma: no cover
        return [1000 + i for i in range(self.p.num_clients)]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:  # pragma: no cover
        raise NotImplementedError


def make_loop(grid: ScriptedGrid) -> tuple[AsyncLoop, BufferedStrategy]:
    """The real loop and strategy of ``grid``'s run config, as ``run_async_experiment``
    builds them."""
    p, cfg = grid.p, grid.cfg
    node_of = {cid: 1000 + cid for cid in range(p.num_clients)}
    strategy = BufferedStrategy(cfg, node_of, [p.w0.copy()], available=lambda: list(node_of),
                                examples=[len(y) for y in p.ys])
    loop = AsyncLoop(grid, cfg, strategy, lambda: list(node_of), node_of,
                     ConfigRecord({rk.EXPERIMENT: grid.experiment}))
    return loop, strategy


def speed_order(speeds: list[float], replies: int) -> Script:
    """The first ``replies`` completions when client i takes ``speeds[i]`` per task and is
    always busy (ties: the lower id), each ``ok``: the virtual clock's order."""
    due = {cid: s for cid, s in enumerate(speeds)}
    out: Script = []
    while len(out) < replies:
        cid = min(due, key=lambda i: (due[i], i))
        out.append((cid, "ok"))
        due[cid] += speeds[cid]
    return out


def run_lsq_async(p: Problem, cfg: RunConfig, script: Script, root: Path) -> tuple[
        np.ndarray, BufferedStrategy, ScriptedGrid, AsyncLoop]:
    """The real loop over ``script`` until ``num-server-rounds`` flushes; its final model
    (one vector), strategy, grid and loop."""
    grid = ScriptedGrid(p, cfg, script, root)
    loop, strategy = make_loop(grid)
    final = loop.run([p.w0.copy()], lambda flush, facts: None)
    return final[0], strategy, grid, loop
