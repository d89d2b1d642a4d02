"""The run's live status file (``<run dir>/status.json``): what the operator's page shows.

Written by the ServerApp at each round boundary and each fleet event (a node identified,
refused, or silent on its identity query), atomically (readers see the old file or the new
one), without fsync: a status lost to a power cut is rewritten at the next event, so a write
costs a small JSON dump and a rename, never a wait on the disk. The rows themselves stay in
``rounds.jsonl``; this file holds what the rows do not: the fleet, node by node.

Counts are per node (the node a task was sent to, found from the reply's
``reply_to_message_id``, so a SuperLink's error reply for a dead node counts against that node
and not against the reply's source id). They equal the round's ``num-replies`` /
``num-rejected`` / ``num-missing`` summed over nodes, since this server process started (a
resumed run counts from its resume).

Every node the run knows is listed: each the SuperLink says is connected, each in
``node-registry`` (``registered`` until it answers its identity query), and each that ever
answered or got a task. ``connected`` is the fleet's last answer from Flower's
``Grid.get_node_ids`` (``Fleet.online``, with when each node was last in it), which the rounds
ask for anyway (identity queries and sampling, each round; in a simulation once, at the start:
the engine's nodes never miss a heartbeat). A write asks the SuperLink nothing (with 1000
nodes in a SQLite-backed SuperLink the call alone was 18-24 ms of a 50-71 ms write, before
its gRPC: docs/benchmarks.md), so ``connected`` is at most one round old: a killed node
stays connected until the SuperLink misses its heartbeats (2 x 30 s in Flower 1.39) and a
round has asked since.

Under DP (``dp`` != off) the round's sample is secret (docs/faults.md, "What each DP mode
shows"): no per-node task count, train time, last task reply or participation is written, nor
which node is connected, nor the fleet's task totals, rejections by reason or round times.
The file is rewritten every round, so any total is a per-round count to whoever reads it
twice, and per-round replies and missing beside who is connected say how many connected
clients the round sampled. What stays is the fleet as identity queries found it (each node's
state, client and identity answer: none depends on the sample) and the run's progress.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.app import Message
from flwr.common.logger import log

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.store.files import atomic_write
from server_app.clients import Fleet

STATUS_FILE = "status.json"
SCHEMA = 1
WITHHELD = ("withheld under dp={dp}: the round's sample is secret (docs/faults.md, "
            "'What each DP mode shows'); no task counts, totals, round times or connectivity")


@dataclass
class NodeTally:
    """What one node's train tasks came to (in this server process)."""

    sent: int = 0
    replied: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    missing: int = 0
    train_seconds: float | None = None
    last_reply: float | None = None
    rounds: list[int] = field(default_factory=list)


class StatusWriter:
    """Keeps the fleet's tallies and rewrites ``status.json`` when something happens.

    ``watch`` binds the strategy whose last train round's rejections (``last_rejections``:
    node -> reason, as its decode and norm-filter stages gave them) are counted per node.
    """

    def __init__(self, run_dir: Path, cfg: RunConfig, fleet: Fleet, first_round: int) -> None:
        self.path = run_dir / STATUS_FILE
        self.cfg, self.fleet = cfg, fleet
        self.private = cfg.privacy.dp != "off"
        self.first_round = first_round
        self.started = time.time()
        self.round = first_round - 1
        self.state = "running"
        self.last_row: dict[str, Any] = {}
        self.tally: dict[int, NodeTally] = {}
        self.totals: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self._round_rejects: dict[int, str] = {}
        self._strategy: Any = None
        self._failed = False
        fleet.on_change = self.write

    def watch(self, strategy: Any) -> None:
        """Count the strategy's rejections by node and reason (its ``last_rejections``)."""
        self._strategy = strategy

    # ------------------------------------------------------------------ events
    def add_round(self, row: Mapping[str, Any], messages: Sequence[Message],
                  replies: Sequence[Message], sent_to: Mapping[int, int]) -> None:
        """Tally a finished round (its train messages and replies) and rewrite the file."""
        rnd = int(row["round"])
        if self._strategy is not None:
            self._round_rejects = dict(getattr(self._strategy, "last_rejections", {}))
        target = {m.metadata.message_id: m.metadata.dst_node_id for m in messages
                  if m.metadata.message_id}
        now = time.time()
        answered: set[int] = set()
        for reply in replies:
            src = reply.metadata.src_node_id
            node = target.get(reply.metadata.reply_to_message_id, src)
            answered.add(node)
            t = self.tally.setdefault(node, NodeTally())
            if reply.has_error():
                reason = f"client error: {_last_line(reply.error.reason)}"
            else:
                reason = self._round_rejects.get(src, "")
                t.last_reply = now
                value = (reply.content.metric_records[rk.METRICS].get(rk.COMPUTE_SECONDS)
                         if rk.METRICS in reply.content.metric_records else None)
                if isinstance(value, float):
                    t.train_seconds = value
            if reason:
                t.rejected[self._kind(reason)] += 1
                self.reasons[self._kind(reason)] += 1
                self.totals["rejected"] += 1
            else:
                t.replied += 1
                self.totals["replied"] += 1
        for node in sent_to:
            t = self.tally.setdefault(node, NodeTally())
            t.sent += 1
            t.rounds.append(rnd)
            if node not in answered:
                t.missing += 1
                self.totals["missing"] += 1
        self.totals["sent"] += len(sent_to)
        self._round_rejects = {}
        self.round, self.last_row = rnd, dict(row)
        self.write()

    def finish(self, state: str = "done") -> None:
        """The run ended (``done``: all rounds or the privacy budget): say so."""
        self.state = state
        self.write()

    # ------------------------------------------------------------------ file
    def write(self) -> None:
        """Rewrite status.json atomically (no fsync: see the module docstring). A failed
        write is logged once and never stops the run: the page is a view, not the record.
        Who is connected is the fleet's last answer (the module docstring): no SuperLink call."""
        try:
            text = json.dumps(self.snapshot(), separators=(",", ":"), allow_nan=False,
                              default=_plain)
            atomic_write(self.path, lambda f: f.write(text.encode()), sync=False)
        except (OSError, TypeError, ValueError) as err:
            if not self._failed:
                log(WARNING, "status file %s not written (the run goes on): %s", self.path, err)
            self._failed = True

    def snapshot(self) -> dict[str, Any]:
        """The status as a JSON-ready dict (shown as in docs/results.md, "The live fleet page")."""
        cfg, row, now = self.cfg, self.last_row, time.time()
        run = {"name": self.path.parent.name, "state": self.state, "round": self.round,
               "rounds": cfg.train.num_server_rounds, "first-round": self.first_round,
               "started": self.started, "elapsed-seconds": _num(row.get("elapsed-seconds")),
               "eval-source": cfg.eval_source, "method": cfg.method, "dp": cfg.privacy.dp,
               "dp-epsilon": _num(row.get("dp-epsilon")) if self.private else None,
               "dp-target-epsilon": ((cfg.privacy.dp_target_epsilon or None)
                                     if self.private else None),
               "dp-delta": cfg.privacy.dp_delta if self.private else None,
               "round-seconds": _num(row.get("round-seconds")),
               "collect-seconds": _num(row.get("collect-seconds"))}
        if self.private:  # each would time the round (public_rows.SAMPLE_FIGURES)
            run.update(dict.fromkeys(("elapsed-seconds", "round-seconds", "collect-seconds")))
        client_of = {node: client for client, node in self.fleet.node_of.items()}
        pending = set(self.fleet.pending.values())
        nodes = [self._node(node, client_of.get(node), node in pending, now)
                 for node in sorted(self._known_nodes())]
        fleet = {"num-clients": cfg.num_clients,
                 "identified": len(self.fleet.node_of),
                 "per-node-tasks": (WITHHELD.format(dp=cfg.privacy.dp) if self.private
                                    else "written"),
                 "totals": {} if self.private else {
                     k: self.totals[k] for k in ("sent", "replied", "rejected", "missing")},
                 "rejected-by-reason": {} if self.private else dict(self.reasons.most_common()),
                 "nodes": nodes}
        return {"schema": SCHEMA, "written": now, "run": run, "fleet": fleet}

    def _known_nodes(self) -> set[int]:
        f = self.fleet
        return (set(f.node_of.values()) | set(f.reasons) | set(f.refused)
                | set(f.pending.values()) | set(self.tally) | set(f.registry or {})
                | f.connected)

    def _node(self, node: int, client: int | None, pending: bool,
              now: float) -> dict[str, Any]:
        f = self.fleet
        if client is not None:
            state, reason = "identified", None
        elif node in f.reasons:
            state = "refused" if node in f.refused else "refused-retrying"
            reason = _short(f.reasons[node])
        elif pending:
            state, reason = "waiting-for-identity", None
        elif f.registry is not None and node in f.registry:
            state, reason = "registered", None
        else:
            state, reason = "unknown", None
        asked = f.asked_at.get(node)
        out: dict[str, Any] = {
            "node": node, "client": client, "state": state, "reason": reason,
            "registered-client": (f.registry or {}).get(node),
            "identity-seen": f.seen_at.get(node),
            "waiting-seconds": (time.monotonic() - asked) if state == "waiting-for-identity"
            and asked is not None else None}
        if self.private:  # who is connected beside the rows' counts: the sample (docstring)
            return out
        out.update({"connected": node in f.connected,
                    "last-connected": f.connected_at.get(node)})
        t = self.tally.get(node, NodeTally())
        seen = [x for x in (f.seen_at.get(node), t.last_reply) if x is not None]
        out.update({"last-seen": max(seen) if seen else None,
                    "tasks": {"sent": t.sent, "replied": t.replied,
                              "rejected": sum(t.rejected.values()), "missing": t.missing},
                    "rejected-reasons": dict(t.rejected), "train-seconds": t.train_seconds,
                    "rounds": t.rounds})
        return out

    def _kind(self, reason: str) -> str:
        """The reason as logged; under DP only its kind (no value that could name a client)."""
        if self.private:
            return re.split(r"[0-9:]", reason, maxsplit=1)[0].strip() or "rejected"
        return " ".join(reason.split())[:300]


def _num(value: object) -> float | None:
    """A row's number for the file; None for a missing or non-finite one."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _last_line(text: str) -> str:
    """An error reason's last line (a traceback's exception), which says what went wrong."""
    lines = [x.strip() for x in str(text).splitlines() if x.strip()]
    return lines[-1] if lines else ""


def _short(reason: str) -> str:
    """A reason holding a traceback as its lead and the exception (its last line)."""
    lines = [x.strip() for x in reason.splitlines() if x.strip()]
    if len(lines) <= 1:
        return reason
    lead = lines[0].split("Traceback")[0].strip()
    return f"{lead} {lines[-1]}".strip()


def _plain(value: object) -> object:
    """json.dumps fallback: numpy scalars as Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON: {value!r}")
