"""``rounds=async``: FedBuff's server loop on Flower's ``Grid.push_messages`` / ``pull_messages``.

Why not a round: under ``rounds=sync`` every round waits for its slowest sampled client. Here
``concurrency`` clients train at once; each reply is checked as the sync path checks it
(``MethodStrategy.decode`` and the norm filter, against the model version that client was
sent), its update Delta_i is buffered with the version it started from, and every
``buffer-size`` accepted replies ``fedinit.methods.fedbuff.FedBuff`` applies the staleness-weighted
step. A freed slot is refilled at once with a seeded choice of the idle connected clients
(``refill=balanced``: among those sent the fewest tasks), sent the newest model. Each flush
is one row of rounds.jsonl (``round`` is the new version).

A task that never ends (its node died mid-task) is given up after ``round-timeout``; one the
SuperLink answers with its own error (``Node Unavailable`` once the node missed its
heartbeats) is given up at once. Either way it counts as lost (``num-missing``), never as
aggregated, its slot goes to another idle client, and that client is benched: passed over
for ``round-timeout`` seconds, doubled with each further loss in a row, until it answers
again, unless no other idle client can take a free slot.

The flush hands D to the method's own server rule: FedAvg's (FedAvg/FedInit, FedProx, FedSAM,
Ditto) is w + eta_g D, FedAdam's its optimiser step, SCAFFOLD's w + eta_g D with
c += (1/N) sum Delta_c_i over the buffer (each reply's Delta_c_i added once, unweighted by
staleness; docs/algorithms.md). A reply counts as accounted for its client
(``AccountedRounds``) when it is buffered: it will be in the next flush, so the client's next
task starts its c_i from it; a rejected, lost or stale-dropped reply never is. FedRelax (book
eq. 128): each task carries m_i built at send time from the client models the server holds
then (``Task.content``), and a flush replaces each buffered client's model with its reply
(``ServerRule.replaces_models``; s(tau) not applied, ``staleness=constant`` only). ``dp=central``:
each flush is one release (``server_app/async_privacy.py``: clipped at buffering, noised at
the flush, a rejected reply a zero contribution, one reply per client per flush, counted
before the flush is computed). A robust ``aggregation`` runs over the buffer
(``strategies/async_robust.py``). Not built yet (refused by the run config): local and
distributed DP, federated and personalized evaluation, and the methods whose spec says
why (``MethodSpec.async_refusal``; FedDyn's rule diverges with stale replies).

Every flush writes a checkpoint before anything of the new version is sent; ``resume-dir``
continues from it, re-sending the tasks that were in flight as they were
(``server_app/async_resume.py``).

With ``device-speeds`` on, the loop runs on the virtual clock (``strategies/virtual_clock.py``):
a task sent at simulated time t to client i finishes at t + d_i, and the loop waits for the
one reply that finishes first in simulated time (ties: the earlier dispatch), whatever order
replies arrive in; flushes, staleness and the model are then the same on any machine. With
availability windows (a ``device-speeds`` file) a slot goes only to a client in a window now,
the clock jumps to the next window start when none is, and a task whose window closes before
it ends is never pushed: it is lost at that window's end, in simulated order
(``AsyncLoop.window_event``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedinit.config import RunConfig
from fedinit.flower_compat.object_pulls import pulls_until
from fedinit.methods import wire as rk
from fedinit.methods.async_server_opt import expected_staleness, lr_scale
from fedinit.methods.fedbuff import (
    BufferedUpdate,
    FedBuff,
    Flush,
    delta_of,
    mean_max,
    staleness_weight,
)
from fedinit.methods.method import ClientUpdate, RoundInput
from fedinit.methods.packed_arrays import pack, unpack
from fedinit.methods.stale_correction import delay_compensated
from fedinit.methods.weights import Weights
from strategies.async_robust import robust_flush
from strategies.async_state import InFlight, LoopState
from strategies.download_bytes import content_bytes
from strategies.engine import Step, Steps, run_steps
from strategies.method_strategy import MethodStrategy
from strategies.round_stages.combine import RobustMean
from strategies.round_stages.quorum import TooFewReplies
from strategies.round_stages.replies import RoundReplies, state_fallbacks
from strategies.virtual_clock import VirtualClock


class FlushRelease(Protocol):
    """Central DP's release at each flush, as the loop calls it (the experiment's
    ``server_app.async_privacy.FlushPrivacy``, which also keeps the ledger): who is in the
    buffer, each reply clipped or a zero contribution, the flush's noise, and its
    accounting before the flush exists."""

    members: set[int]

    def clipped(self, update: ClientUpdate) -> ClientUpdate: ...

    def zero(self, w: Weights) -> ClientUpdate: ...

    def noised(self, step: Weights, updates: Sequence[ClientUpdate]
               ) -> tuple[Weights, dict[str, Weights]]: ...

    def spent(self, version: int) -> bool: ...

    def count(self, version: int) -> None: ...

    def fields(self) -> dict[str, Any]: ...


ASYNC_FIELDS = ("staleness-mean", "staleness-max", "dropped-stale", "in-flight", "dispatched",
                "buffered")
"""Columns an asynchronous row adds to ROUND_FIELDS: the buffer's mean and max staleness,
replies dropped for ``max-staleness`` since the previous flush, tasks out at the flush, all
tasks sent so far, and each buffered reply as [client, version sent, tau, s(tau)] in arrival
order."""
LINK_ERRORS = frozenset({ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE,
                         ErrorCode.REPLY_MESSAGE_UNAVAILABLE})
"""Error replies the SuperLink writes itself: the client never answered (a lost task)."""
POLL_SECONDS = 0.1
"""Pause between pulls that brought nothing."""


@dataclass(frozen=True)
class Task:
    """One train message out: who, from which version, with which model, since when."""

    cid: int
    node: int
    version: int
    weights: Weights
    sent_at: float
    finish: float = 0.0
    """Simulated finish time (``device-speeds`` on): send time + the client's duration."""
    seq: int = 0
    """Dispatch number: breaks ties of ``finish`` by send order."""
    round: int = 0
    """The ``rk.ROUND`` the client was sent."""
    base: int = 0
    """The client's round before this task (0: none): the state it starts from."""
    down: Mapping[str, Weights] = field(default_factory=dict)
    """The method's down arrays it carried (SCAFFOLD's c of ``version``)."""
    content: Mapping[str, Weights] = field(default_factory=dict)
    """A method that replaces its clients' models (``ServerRule.replaces_models``): every
    array record its message carried (FedRelax's m_i in place of the model, d_i), built at
    send time; a resume re-sends exactly these. Empty for the other methods."""
    doomed: bool = False
    """Availability windows: its client's window closes before it ends, so it is never
    pushed and is lost at ``finish`` (that window's end), in simulated order."""


class BufferedStrategy(MethodStrategy):
    """``MethodStrategy`` sending to the clients the loop names, and checking a reply against
    the version its client was sent, with the pipeline's own decode and norm-filter stages
    (``strategies/round_stages/``) applied to that one reply."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chosen: list[int] = []

    def sample(self, server_round: int) -> list[int]:
        return list(self.chosen)

    def check(self, version: int, msg: Message, task: Task) -> ClientUpdate | str:
        """The reply decoded and norm-filtered as the sync path does, or why not (one line)."""
        sent_to = {task.node: task.cid}
        decoded = self.decoder.decode(msg, sent_to, task.weights)
        if isinstance(decoded, str):
            return decoded
        norm_filter = self.norm_filter
        if norm_filter is None:
            return decoded
        one = RoundReplies(version, task.weights, sent_to, 1, (msg,),
                           accepted=((task.node, decoded),))
        return decoded if norm_filter(one).accepted else "norm filter (logged above)"


@dataclass
class Counters:
    """What happened since the last flush (its row), and in all."""

    rejected: int = 0
    lost: int = 0
    fallbacks: int = 0
    """Replies whose client could not use its saved state (``rk.STATE_FALLBACK``)."""
    dispatched: int = 0
    bytes_up: int = 0
    """The encoded uploads of the replies buffered since the last flush (``bytes-up``)."""
    bytes_down: int = 0
    """The serialized train messages pushed since the last flush (``bytes-down``)."""
    refill: int = 0
    """Lost tasks whose slots the next ``fill`` hands on (its log line names who got them)."""


@dataclass
class Bench:
    """Clients whose last task was lost: passed over until ``until``, a pause of
    ``round-timeout`` doubled with each loss in a row (a dead node costs a few slots, a
    node that only stalled once comes back soon); a reply of theirs ends it. A benched
    client still takes a slot that no other idle client can (nothing is lost by trying)."""

    timeout: float
    strikes: dict[int, int] = field(default_factory=dict)
    until: dict[int, float] = field(default_factory=dict)

    def lost(self, cid: int, now: float) -> float:
        self.strikes[cid] = self.strikes.get(cid, 0) + 1
        pause = self.timeout * 2 ** (self.strikes[cid] - 1)
        self.until[cid] = now + pause
        return pause

    def answered(self, cid: int) -> None:
        self.strikes.pop(cid, None)
        self.until.pop(cid, None)

    def benched(self, now: float) -> set[int]:
        return {cid for cid, t in self.until.items() if t > now}


def choose(idle: set[int], benched: set[int], free: int, rng: np.random.Generator,
           sent_count: Mapping[int, int] | None = None) -> list[int]:
    """Up to ``free`` of the ``idle`` clients, a seeded choice; a benched one only for a slot
    that no other can take. Without benched clients: one draw per slot from the sorted idle
    list, as before benching existed (the same seed picks the same clients). With
    ``sent_count`` (``refill=balanced``) each draw is among the clients of the pool sent the
    fewest tasks so far (counting those chosen in this call), so fast devices cannot take
    most of the slots (docs/algorithms.md, FedBuff: Refill)."""
    chosen = []
    counts = dict(sent_count) if sent_count is not None else None
    for pool in (sorted(idle - benched), sorted(idle & benched)):
        while free > 0 and pool:
            if counts is None:
                chosen.append(pool.pop(int(rng.integers(len(pool)))))
            else:
                least = min(counts.get(p, 0) for p in pool)
                ties = [j for j, p in enumerate(pool) if counts.get(p, 0) == least]
                cid = pool.pop(ties[int(rng.integers(len(ties)))])
                counts[cid] = least + 1
                chosen.append(cid)
            free -= 1
    return chosen


def pins_of(last_round: Mapping[int, int], in_flight: Collection[InFlight]) -> dict[int, int]:
    """The round each client's next task after a resume starts from: the state of the round
    before its task in flight, or, idle, of its last round."""
    return {**last_round, **{t.cid: t.base for t in in_flight}}


class AsyncLoop:
    """The FedBuff server: ``run`` until ``num-server-rounds`` flushes, one row per flush."""

    def __init__(self, grid: Grid, cfg: RunConfig, strategy: BufferedStrategy,
                 available: Callable[[], Collection[int]], node_of: Mapping[int, int],
                 round_config: ConfigRecord) -> None:
        self.grid, self.cfg, self.strategy = grid, cfg, strategy
        self.available, self.node_of, self.round_config = available, node_of, round_config
        self.buffer = FedBuff(buffer_size=cfg.async_buffer_size, server_lr=cfg.train.server_lr,
                              staleness=cfg.schedule.staleness, a=cfg.schedule.staleness_a,
                              b=cfg.schedule.staleness_b,
                              max_staleness=cfg.schedule.max_staleness)
        self.rng = np.random.default_rng([cfg.seed, 32])
        """The seeded choice of idle clients (issue 32's stream)."""
        self.tasks: dict[str, Task] = {}
        self.sent_count: dict[int, int] = {}
        """Tasks each client was chosen for so far (re-sends after a resume not counted
        again): ``refill=balanced`` prefers the lowest."""
        self.last_round: dict[int, int] = {}
        """Each client's last ``rk.ROUND``: it rises with every task, so the client's state
        store (versions by round) sees each participation after the one before."""
        self.losses: list[tuple[float, float]] = []
        self.accepted: list[tuple[ClientUpdate, float]] = []
        """The buffer's decoded replies, each with its upload replaced by Delta_i against the
        version its task carried, and weights (the method's rule sees them at a flush)."""
        self.counts = Counters()
        self.bench = Bench(cfg.fleet.round_timeout)
        self.clock = VirtualClock.for_run(cfg)
        """None under ``device-speeds=off``; its ``now`` is the finish time of the reply
        handled last."""
        self.windowed = self.clock if self.clock is not None and self.clock.windows else None
        """The clock when its file has availability windows (else None)."""
        self.waiting: tuple[str, float] = ("", 0.0)
        """On the clock: the task whose reply the loop waits for, and since when (wall)."""
        self.early: dict[str, Message] = {}
        """On the clock: replies a grid handed back before their turn, kept for it."""
        self.pins: dict[int, int] = {}
        """Per client, the round of its state that a resume from the last checkpoint starts
        it from (``pins_of``): named in its train messages (``rk.KEEP_ROUND``), so the
        client keeps that version however often it trains before the next checkpoint."""
        self.accounted_pins: dict[int, int] = {}
        """Per client, its accounted round at the last checkpoint, which a resume names again
        (methods with server-summed state only; ``rk.KEEP_ACCOUNTED``): the client keeps that
        version too, though its accounted round may move on before the next checkpoint."""
        self.redo: tuple[InFlight, ...] = ()
        """After a resume: the checkpoint's tasks in flight, re-sent by the first ``fill``."""
        self.sent_versions: dict[int, Weights] = {}
        """After a resume: the model versions those tasks carry."""
        self.sent_downs: dict[int, dict[str, Weights]] = {}
        """After a resume: the method's down arrays of those versions (SCAFFOLD's c)."""
        self.sent_contents: dict[int, dict[str, Weights]] = {}
        """After a resume: by dispatch number, the content each of those tasks carried
        (FedRelax's m_i and d_i: ``Task.content``)."""
        self.run_dir = Path(cfg.fleet.output_dir)
        """Where the checkpoint is (set by ``run_async_experiment``), named when it stops."""
        self.privacy: FlushRelease | None = None
        """``dp=central`` (set by ``run_async_experiment``): each flush one counted release."""
        self.stopped = False
        """Set when ``dp-target-epsilon`` allows no further flush: the loop ends."""
        self.newest: Weights = []
        """The model the next flush steps from (``run`` keeps it): w_now of
        ``stale-correction=dc``."""

    def busy(self) -> set[int]:
        return {t.cid for t in self.tasks.values()}

    def fill(self, weights: Weights) -> None:
        """Send the newest model to seeded idle clients until ``concurrency`` are training."""
        if self.redo:
            self.resend()
        held = self.privacy.members if self.privacy is not None else set()
        idle = set(self.available()) - self.busy() - held
        if self.windowed is not None:  # only a client in one of its windows now
            idle = set(self.windowed.available_at(self.windowed.now, idle))
        chosen = choose(idle,
                        self.bench.benched(time.monotonic()),
                        self.cfg.async_concurrency - len(self.tasks), self.rng,
                        self.sent_count if self.cfg.schedule.refill == "balanced" else None)
        if not chosen:
            return
        for cid in chosen:
            self.sent_count[cid] = self.sent_count.get(cid, 0) + 1
        version = self.buffer.version
        self.strategy.chosen = chosen
        arrays = pack(weights)
        down = self.strategy.rule.down(self.strategy.state)
        messages = list(self.strategy.configure_train(version + 1, arrays, self.round_config,
                                                      self.grid))
        own = {cid: self.content_of(msg) for msg, cid in zip(messages, chosen, strict=True)}
        rounds = {}
        for i, (msg, cid) in enumerate(zip(messages, chosen, strict=True)):
            base = self.last_round.get(cid, 0)
            rounds[cid] = (max(version + 1, base + 1), base)
            self.mark(msg, cid, rounds[cid][0])
            self.scale_lr(msg, len(self.tasks) + i)
            self.last_round[cid] = rounds[cid][0]
        now = time.monotonic()
        sim = self.clock
        leaves = {} if self.windowed is None else {
            cid: end for cid in chosen
            if (end := self.windowed.leaves_at(cid, self.windowed.now)) is not None}
        sending = [m for m, cid in zip(messages, chosen, strict=True) if cid not in leaves]
        self.counts.bytes_down += content_bytes(sending)
        pushed = iter(self.grid.push_messages(sending))
        for seq, cid in enumerate(chosen, self.counts.dispatched):
            if cid in leaves:  # never pushed: the device goes away before it would end
                self.tasks[f"lost-{seq}"] = Task(cid, self.node_of[cid], version, weights,
                                                 now, leaves[cid], seq, *rounds[cid],
                                                 down=down, content=own[cid], doomed=True)
                continue
            msg_id = next(pushed)
            if msg_id:
                finish = sim.now + sim.duration(cid) if sim is not None else 0.0
                self.tasks[msg_id] = Task(cid, self.node_of[cid], version, weights, now,
                                          finish, seq, *rounds[cid], down=down,
                                          content=own[cid])
        self.counts.dispatched += len(chosen)
        if self.counts.refill:
            log(INFO, "version %d: %d lost task(s) re-sent: client(s) %s now train", version,
                self.counts.refill, chosen[:self.counts.refill])
            self.counts.refill = max(0, self.counts.refill - len(chosen))

    def scale_lr(self, msg: Message, in_flight: int) -> None:
        """``async-lr-scale`` a > 0: the task's local lr x (1 + tau_hat)^-a, tau_hat its
        expected staleness from the ``in_flight`` tasks sent before it and the replies
        buffered now (``fedinit.methods.async_server_opt``)."""
        a = self.cfg.schedule.async_lr_scale
        if not a:
            return
        config = msg.content.config_records[rk.CONFIG]
        tau_hat = expected_staleness(in_flight, len(self.buffer.buffer),
                                     self.buffer.buffer_size)
        config[rk.LR] = float(config[rk.LR]) * lr_scale(a, tau_hat)

    def content_of(self, msg: Message) -> dict[str, Weights]:
        """What a train message carried, where the method gives each client its own content
        and replaces its model (else nothing: the version and its down arrays say it)."""
        if not self.strategy.rule.replaces_models:
            return {}
        return {k: unpack(v) for k, v in msg.content.array_records.items()}

    def mark(self, msg: Message, cid: int, rnd: int) -> None:
        """Set the client's round number and, if it has one, the round it must keep."""
        config = msg.content.config_records[rk.CONFIG]
        config[rk.ROUND] = rnd
        if cid in self.pins:
            config[rk.KEEP_ROUND] = self.pins[cid]
        if self.accounted_pins.get(cid, 0):
            config[rk.KEEP_ACCOUNTED] = self.accounted_pins[cid]

    def resend(self) -> None:
        """After a resume: send every task of the checkpoint that was in flight again, as it
        went out (version, round, finish time, dispatch number); a client no longer
        connected loses its task (its slot is refilled)."""
        redo, self.redo = self.redo, ()
        online = set(self.available())
        now = time.monotonic()
        sent = []
        for t in redo:
            down = self.sent_downs.get(t.version, {})
            own = self.sent_contents.get(t.seq, {})
            if self.windowed is not None and self.windowed.doomed(t.cid, t.finish):
                self.tasks[f"lost-{t.seq}"] = Task(
                    t.cid, self.node_of.get(t.cid, -1), t.version,
                    self.sent_versions[t.version], now, t.finish, t.seq, t.round, t.base,
                    down, own, doomed=True)
                continue
            if t.cid not in online or t.cid not in self.node_of:
                self.lose(Task(t.cid, -1, t.version, self.sent_versions[t.version], now,
                               t.finish, t.seq, t.round, t.base, down, own),
                          "not connected when the resumed run re-sent its task")
                continue
            weights = self.sent_versions[t.version]
            self.strategy.chosen = [t.cid]
            (msg,) = self.strategy.configure_train(t.version + 1, pack(weights),
                                                   self.round_config, self.grid)
            for key, arrays in down.items():  # the version's own (c_v), not the newest
                msg.content.array_records[key] = pack(arrays)
            for key, arrays in own.items():  # m_i as sent then, not of the checkpoint's models
                msg.content.array_records[key] = pack(arrays)
            self.mark(msg, t.cid, t.round)
            self.counts.bytes_down += content_bytes([msg])
            (msg_id,) = self.grid.push_messages([msg])
            if msg_id:
                self.tasks[msg_id] = Task(t.cid, self.node_of[t.cid], t.version, weights, now,
                                          t.finish, t.seq, t.round, t.base, down, own)
                sent.append(f"{t.cid} (version {t.version})")
        log(INFO, "version %d: re-sent %d of the %d task(s) in flight at the checkpoint, each "
            "from its own version: client(s) %s", self.buffer.version, len(sent), len(redo),
            ", ".join(sent))
        self.sent_versions, self.sent_downs, self.sent_contents = {}, {}, {}

    def state(self) -> LoopState:
        """The loop's state for the checkpoint of the flush just made (buffer empty); from
        now on each client with a task out keeps the state that task started from."""
        in_flight = tuple(sorted((InFlight(t.cid, t.version, t.round, t.base, t.finish, t.seq)
                                  for t in self.tasks.values()), key=lambda t: t.seq))
        self.pins = pins_of(self.last_round, in_flight)
        self.accounted_pins = self.accounted_at_checkpoint()
        return LoopState(self.buffer.version, dict(self.rng.bit_generator.state),
                         None if self.clock is None else self.clock.now,
                         self.counts.dispatched, dict(self.last_round), in_flight,
                         dict(self.sent_count))

    def sent(self) -> dict[int, Weights]:
        """The model version each task in flight carries, by version."""
        return {t.version: t.weights for t in self.tasks.values()}

    def sent_down(self) -> dict[int, dict[str, Weights]]:
        """The method's down arrays each task in flight carries, by version (none: empty)."""
        return {t.version: dict(t.down) for t in self.tasks.values() if t.down}

    def sent_content(self) -> dict[int, dict[str, Weights]]:
        """The content each task in flight carried, by dispatch number (methods that replace
        their clients' models only; else empty)."""
        return {t.seq: dict(t.content) for t in self.tasks.values() if t.content}

    def load(self, state: LoopState, sent: dict[int, Weights],
             downs: dict[int, dict[str, Weights]] | None = None,
             contents: dict[int, dict[str, Weights]] | None = None) -> None:
        """Continue from a checkpoint's ``state``: its tasks in flight are re-sent by the
        first ``fill``, from the versions in ``sent`` with their down arrays ``downs`` (or,
        by dispatch number, the content each carried: ``contents``)."""
        self.buffer.version = state.version
        self.rng.bit_generator.state = state.rng
        if self.clock is not None and state.clock_now is not None:
            self.clock.now = state.clock_now
        self.counts.dispatched = state.dispatched
        self.last_round = dict(state.last_round)
        self.sent_count = dict(state.sent_count)
        self.redo, self.sent_versions = state.in_flight, sent
        self.sent_downs = dict(downs or {})
        self.sent_contents = dict(contents or {})
        self.pins = pins_of(self.last_round, state.in_flight)
        self.accounted_pins = self.accounted_at_checkpoint()

    def accounted_at_checkpoint(self) -> dict[int, int]:
        """The accounted rounds a resume from the checkpoint being written (or read) names,
        for a method whose clients rebase server-summed state on them (else none)."""
        if not self.cfg.spec.client.accounted_keys:
            return {}
        return dict(self.strategy.accounted or {})

    def take(self, msg: Message) -> Task | None:
        """The task ``msg`` answers, checked and buffered (or counted as rejected/dropped)."""
        task = self.tasks.pop(msg.metadata.reply_to_message_id, None)
        if task is None:
            self.dead(msg)
            return None
        version = self.buffer.version
        if msg.has_error() and msg.error.code in LINK_ERRORS:
            self.lose(task, f"the SuperLink answered for it: {msg.error.reason}")
            return task
        self.bench.answered(task.cid)
        self.counts.fallbacks += state_fallbacks([msg])
        decoded = self.strategy.check(version, msg, task)
        privacy = self.privacy
        if isinstance(decoded, str):
            self.counts.rejected += 1
            log(WARNING, "version %d: rejected reply of client %d (sent version %d): %s%s",
                version, task.cid, task.version, decoded,
                "; under dp it is a zero contribution" if privacy is not None else "")
            if privacy is not None:  # no data-dependent skip: the slot is filled with zeros
                zero = privacy.zero(task.weights)
                if self.buffer.offer(BufferedUpdate(zero.upload, task.version, 1.0, task.cid)):
                    self.accepted.append((zero, 1.0))
                    privacy.members.add(task.cid)
            self.give_up_check()
            return task
        if privacy is not None:
            decoded = privacy.clipped(decoded)
        weight = self.strategy.reply_weights([decoded])[0]
        replaces = self.strategy.rule.replaces_models  # the upload is the client's model
        delta = (decoded.upload if replaces else
                 delta_of(decoded.upload, task.weights, self.cfg.train.ri_aggregation))
        s = self.cfg.schedule
        if s.stale_correction == "dc" and task.version < version:  # tau 0: nothing to move
            delta = delay_compensated(delta, task.weights, self.newest, s.dc_lambda)
        if self.buffer.offer(BufferedUpdate(delta, task.version, weight, task.cid)):
            self.counts.bytes_up += decoded.upload_bytes
            self.losses.append((weight, decoded.train_loss))
            self.accepted.append((decoded if replaces else replace(decoded, upload=delta),
                                  weight))
            # in the next flush: the client's next task starts its c_i from this one
            self.strategy.accounted_rounds.count([task.cid], task.round)
            if privacy is not None:
                privacy.members.add(task.cid)
        else:
            log(INFO, "version %d: dropped the reply of client %d: staleness %d > "
                "max-staleness=%d", version, task.cid, version - task.version,
                self.cfg.schedule.max_staleness)
        return task

    def give_up_check(self) -> None:
        """Stop, as ``max-failed-rounds`` failed sync rounds do, once that many buffers' worth
        of replies since the last flush were rejected or lost (else the loop would dispatch
        forever to clients whose every reply fails). Under DP only lost tasks count: a
        rejected reply is a zero contribution, and stopping on it would depend on data."""
        c = self.cfg
        failed = self.counts.lost + (self.counts.rejected if self.privacy is None else 0)
        if failed >= c.fleet.max_failed_rounds * c.async_buffer_size:
            raise TooFewReplies(
                f"rounds=async: {failed} replies since version {self.buffer.version} were "
                f"rejected or lost (max-failed-rounds={c.fleet.max_failed_rounds} x buffer-size="
                f"{c.async_buffer_size}); stopped, see the rejected replies above"
                + (f"; the last flush's checkpoint is there: resume with --run-config "
                   f"\"resume-dir='{self.run_dir}'\"" if self.buffer.version else ""))

    def expire(self) -> None:
        """Give up on tasks older than ``round-timeout`` (checked on every pass, also while
        other replies keep coming): their slots are refilled. On the virtual clock only the
        task waited for can be given up, timed from when the loop began waiting for it (a
        later task's reply may sit pulled-for-later meanwhile)."""
        now = time.monotonic()
        for msg_id, task in list(self.tasks.items()):
            since = task.sent_at
            if self.clock is not None:
                if msg_id != self.waiting[0]:
                    continue
                since = self.waiting[1]
            if now - since > self.cfg.fleet.round_timeout:
                del self.tasks[msg_id]
                self.early.pop(msg_id, None)
                self.lose(task, f"no reply within round-timeout={self.cfg.fleet.round_timeout:g}s")

    def lose(self, task: Task, why: str) -> None:
        """Count ``task`` as lost (never aggregated), bench its client, refill its slot."""
        self.counts.lost += 1
        self.counts.refill += 1
        pause = self.bench.lost(task.cid, time.monotonic())
        log(WARNING, "version %d: lost the task of client %d (sent version %d): %s; its slot "
            "goes to another idle client, client %d is passed over for %gs",
            self.buffer.version, task.cid, task.version, why, task.cid, pause)
        self.give_up_check()

    def run(self, weights: Weights, on_flush: Callable[[Flush, dict[str, Any]], None]) -> Weights:
        """``steps`` on the engine, ``on_flush(flush, row facts)`` after each (it may set
        ``stopped``); the final model."""
        final = [weights]

        def on_step(step: Step[Flush], _began: float) -> bool:
            final[0] = step.detail.weights
            on_flush(step.detail, step.fields)
            return self.stopped

        run_steps(self.steps(weights), on_step)
        return final[0]

    def steps(self, weights: Weights) -> Steps[Flush]:
        """Keep ``concurrency`` clients busy and flush every K accepted replies, each flush a
        step of the engine (``strategies/engine.py``), until ``num-server-rounds`` flushes
        or ``stopped``."""
        n = self.cfg.train.num_server_rounds
        idle_since = time.monotonic()
        self.newest = weights
        self.stopped = self.privacy is not None and self.privacy.spent(self.buffer.version)
        while self.buffer.version < n and not self.stopped:
            self.fill(weights)
            if not self.tasks and time.monotonic() - idle_since > self.cfg.fleet.node_wait_timeout:
                raise TooFewReplies(f"rounds=async: no client to train for "
                                    f"node-wait-timeout={self.cfg.fleet.node_wait_timeout:g}s at "
                                    f"version {self.buffer.version}")
            self.expire()
            if self.windowed is not None and self.window_event():
                continue
            replies = self.pull()
            if not replies:
                time.sleep(POLL_SECONDS)
                continue
            idle_since = time.monotonic()
            for msg in replies:
                if self.take(msg) is None:
                    continue
                if self.buffer.full:
                    if self.privacy is not None:  # counted before the flush exists
                        self.privacy.count(self.buffer.version + 1)
                    flush = self.buffer.flush(weights, self.apply)
                    weights = self.newest = flush.weights
                    facts = self.row_facts(flush)
                    yield Step(flush.version, weights=flush.weights,
                               metrics={k: v for k, v in facts.items()
                                        if isinstance(v, int | float) and v is not None
                                        and not isinstance(v, bool)},
                               fields=facts, detail=flush)
                    if self.buffer.version >= n or self.stopped:
                        break
                    if self.privacy is not None and self.privacy.spent(self.buffer.version):
                        self.stopped = True
                        break
                self.fill(weights)

    def window_event(self) -> bool:
        """Availability windows: handle the next simulated event if it is not a reply. A
        free slot that no idle client can take now waits for the first window start among
        the idle ones: the clock jumps there if that comes before the first task's end (no
        task out and no window ahead: the run cannot go on). Else, if the first task to end
        is a lost one, the clock moves to its window's end and it is lost. True: handled."""
        sim = self.windowed
        assert sim is not None
        first = min(self.tasks, key=lambda i: (self.tasks[i].finish, self.tasks[i].seq),
                    default=None)
        if len(self.tasks) < self.cfg.async_concurrency:
            held = self.privacy.members if self.privacy is not None else set()
            start = sim.next_start(set(self.available()) - self.busy() - held)
            if start is None and first is None:
                raise TooFewReplies(f"rounds=async: no client is available at or after "
                                    f"sim-time {sim.now:g} (version {self.buffer.version}): "
                                    f"every availability window in device-speeds has ended")
            if start is not None and (first is None or start < self.tasks[first].finish):
                log(INFO, "version %d: no idle client in a window at sim-time %g; the clock "
                    "jumps to the next window start, %g", self.buffer.version, sim.now, start)
                sim.now = start
                return True
        if first is None or not self.tasks[first].doomed:
            return False
        task = self.tasks.pop(first)
        sim.now = task.finish
        self.counts.lost += 1
        self.counts.refill += 1
        log(WARNING, "version %d: lost the task of client %d (sent version %d): its "
            "availability window closed at sim-time %g before the task ended; its slot goes "
            "to another idle client", self.buffer.version, task.cid, task.version, task.finish)
        self.give_up_check()
        return True

    def pull(self) -> list[Message]:
        """Replies to handle now: whatever came back (wall order), or, on the virtual clock,
        only the reply of the task that finishes first in simulated time (the clock moves
        to its finish); other replies wait on the SuperLink for their turn."""
        if not self.tasks:
            return []
        # a reply whose arrays never all arrive (its node died mid-upload) fails after
        # round-timeout, as a lost task does, instead of holding the loop for Flower's 2 hours
        until = time.monotonic() + self.cfg.fleet.round_timeout
        if self.clock is None:
            with pulls_until(until):
                return list(self.grid.pull_messages(list(self.tasks)))
        first = min(self.tasks, key=lambda i: (self.tasks[i].finish, self.tasks[i].seq))
        if self.waiting[0] != first:
            self.waiting = (first, time.monotonic())
        if first not in self.early:
            with pulls_until(until):
                pulled = list(self.grid.pull_messages([first]))
            for msg in pulled:
                if msg.metadata.reply_to_message_id in self.tasks:
                    self.early.setdefault(msg.metadata.reply_to_message_id, msg)
                else:
                    self.dead(msg)
        got = self.early.pop(first, None)
        if got is None:
            return []
        self.clock.now = self.tasks[first].finish
        return [got]

    def dead(self, msg: Message) -> None:
        """Log a reply to no task of this loop (one sent before a resume, or by an earlier
        ServerApp): dropped, never aggregated."""
        log(WARNING, "version %d: dropped a reply from node %d to message %s: no task of this "
            "run is waiting for it (sent before a resume, or by an earlier ServerApp); not "
            "aggregated", self.buffer.version, msg.metadata.src_node_id,
            msg.metadata.reply_to_message_id)

    def apply(self, w: Weights, step: Weights) -> Weights:
        """The method's server rule on the buffered update D = ``step`` (FedAvg's: w + eta_g
        D; FedAdam's: its Adam step, its moments kept on the strategy as in a sync round;
        SCAFFOLD's: c from every buffered reply's Delta_c_i once, unweighted).
        Each reply reaches the rule as its Delta_i against the version its task carried
        (``variant`` ``update``), so a stale reply's move is not measured from the newest w;
        a rule that replaces its clients' models (FedRelax) gets the uploaded models
        (``variant`` ``model``) and ignores D: the flush is the book's event k, A(k) the
        buffered clients, each client's model replaced by its last buffered reply.
        Under DP: D and each extra upload's sum carry the flush's noise (``FlushPrivacy``)."""
        c = self.cfg
        updates = [u for u, _ in self.accepted]
        weights = [p for _, p in self.accepted]
        sums = None
        if self.privacy is not None:
            step, sums = self.privacy.noised(step, updates)
        r, s = c.robust, c.schedule
        if r.aggregation != "mean":  # the rule over the raw deltas, x mean s(tau) of the kept
            factors = [staleness_weight(s.staleness, self.buffer.tau(b.version), s.staleness_a,
                                        s.staleness_b) for b in self.buffer.buffer]
            step, kept = robust_flush(updates, factors, r.aggregation, r.trim_fraction,
                                      r.byzantine_f, self.strategy.rule.up_keys,
                                      self.buffer.version)
            updates, weights = [updates[i] for i in kept], [1.0] * len(kept)
        rnd = RoundInput(server_round=self.buffer.version + 1,
                         aggregate=[d.astype(np.float32) for d in step],
                         updates=updates, weights=weights,
                         variant="model" if self.strategy.rule.replaces_models else "update",
                         num_clients=c.num_clients, lr=c.train.lr_at(self.buffer.version + 1),
                         server_lr=c.train.server_lr, upload_sums=sums, combine=RobustMean(c),
                         aggregation=c.robust.aggregation)
        self.accepted = []
        w_next, self.strategy.state = self.strategy.rule.update(self.strategy.state, w, rnd)
        return w_next

    def row_facts(self, flush: Flush) -> dict[str, Any]:
        """The flush's row fields that the loop knows (the caller adds time and accuracy)."""
        mean, most = mean_max(flush.staleness)
        total = sum(w for w, _ in self.losses)
        loss = sum(w * x for w, x in self.losses) / total if total else None
        self.losses = []
        facts = {"round": flush.version, rk.NUM_REPLIES: flush.replies,
                 rk.NUM_REJECTED: self.counts.rejected, rk.NUM_MISSING: self.counts.lost,
                 rk.ROUND_TRAIN_LOSS: loss, "lr": self.cfg.train.lr_at(flush.version),
                 "staleness-mean": mean, "staleness-max": most,
                 "dropped-stale": flush.dropped, "in-flight": len(self.tasks),
                 "dispatched": self.counts.dispatched,
                 rk.BYTES_UP: self.counts.bytes_up, rk.BYTES_DOWN: self.counts.bytes_down,
                 "buffered": [list(b) for b in zip(flush.clients, flush.started,
                                                   flush.staleness, flush.factors,
                                                   strict=True)],
                 "state-fallbacks": self.counts.fallbacks,
                 "clients-trained": sorted(flush.clients),
                 rk.AGGREGATED: True,  # a flush always applies its (non-empty) buffer
                 **({"sim-time": self.clock.now} if self.clock is not None else {}),
                 **(self.privacy.fields() if self.privacy is not None else {})}
        self.counts.rejected = self.counts.lost = self.counts.fallbacks = 0
        self.counts.bytes_up = self.counts.bytes_down = 0
        return facts


