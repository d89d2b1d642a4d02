"""Checkpoint and exact resume of ``rounds=async`` (FedBuff): what the loop saves at a flush.

When. At every flush, after the new model version is applied and its row recorded, before
any task of that version is sent. The buffer is empty then, so no buffered reply needs
saving. The tasks still in flight are saved as tasks (client, version sent, the client's
round number, simulated finish time, dispatch number), with each model version they were
sent. A resumed run re-sends each of them exactly as it went out: the same version, round
and, on the virtual clock (``device-speeds``), the same finish time and dispatch number. So
the resumed run handles the same replies in the same simulated order as the uninterrupted
one, and its final model is bit-identical to that run's. Re-sending them from the newest
version instead would change their staleness and their finish times.

A method that sends arrays beside the model (SCAFFOLD's c) has them saved for each of those
older versions too (``version-<v>/<name>``): a re-sent task carries c of the version it was
sent, not the newest; the checkpoint's own version's are the server state's. A method whose
clients each get their own content and whose replies replace their models (FedRelax: m_i,
built from the neighbours' models the server held when the task was sent) has every array
record of each task in flight saved by dispatch number (``task-<seq>/<name>``): a re-sent
task carries its m_i as sent, not one rebuilt from the checkpoint's models.

What else. The seeded generator of the client choice (its bit generator's state), the
clock's ``now``, the dispatch count, each client's last round number and count of tasks
(``refill=balanced`` chooses by it), the method's server
state (FedAdam's moments, the norm history) and the rows of versions 1..k. Not saved: the
bench of clients whose last task was lost (it is timed on the wall clock, so a resumed run
starts with none benched).

The clients' side. A task in flight at the checkpoint restores the client's state of the
round before it (``fedinit.store.client_store``: the newest version before the task's round). Until
the next checkpoint, that client may train again and save newer versions; the state files
keep only the newest two, which would delete the one the redo needs. So every train message
names, in ``rk.KEEP_ROUND``, the round of that state (0: none), and the client keeps it.

A reply to a task the resumed loop never sent (a task of the killed run, a reply of an
earlier ServerApp's message) matches no task of the loop: it is logged and dropped, never
aggregated (``server_app.async_rounds.AsyncLoop.take``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedinit.methods.weights import Weights
from server_app.checkpoint import Checkpoint, CheckpointError

TASK_FIELDS = ("pid", "version", "round", "base", "finish", "seq")
"""One task in flight, as saved: client, version sent, its round number, the round of the
state it starts from, simulated finish time, dispatch number."""


@dataclass(frozen=True)
class InFlight:
    """A task out at the checkpoint, to be re-sent as it was."""

    pid: int
    version: int
    round: int
    base: int
    finish: float
    seq: int


@dataclass(frozen=True)
class LoopState:
    """The loop's state at a flush, beside the model and the strategy's server state."""

    version: int
    rng: dict[str, Any]
    clock_now: float | None
    dispatched: int
    last_round: dict[int, int]
    in_flight: tuple[InFlight, ...]
    sent_count: dict[int, int] = field(default_factory=dict)
    """Tasks each client was chosen for (``refill=balanced``'s order); a checkpoint written
    before it was kept reads as none."""

    def to_meta(self) -> dict[str, Any]:
        return {"version": self.version, "rng": self.rng, "clock-now": self.clock_now,
                "dispatched": self.dispatched,
                "last-round": {str(p): r for p, r in sorted(self.last_round.items())},
                "in-flight": [[getattr(t, f) for f in TASK_FIELDS] for t in self.in_flight],
                "sent-count": {str(p): n for p, n in sorted(self.sent_count.items())}}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> LoopState:
        """The state ``to_meta`` wrote; KeyError/TypeError/ValueError when it is malformed."""
        clock = meta["clock-now"]
        tasks = []
        for row in meta["in-flight"]:
            if len(row) != len(TASK_FIELDS):
                raise ValueError(f"an in-flight task {row!r} has {len(row)} fields, expected "
                                 f"{len(TASK_FIELDS)}")
            pid, version, rnd, base, finish, seq = row
            tasks.append(InFlight(int(pid), int(version), int(rnd), int(base), float(finish),
                                  int(seq)))
        rng = meta["rng"]
        if not isinstance(rng, dict):
            raise TypeError(f"rng is a {type(rng).__name__}, not an object")
        return cls(int(meta["version"]), rng, None if clock is None else float(clock),
                   int(meta["dispatched"]),
                   {int(p): int(r) for p, r in dict(meta["last-round"]).items()}, tuple(tasks),
                   {int(p): int(n) for p, n in dict(meta.get("sent-count", {})).items()})

    def versions(self) -> list[int]:
        """The versions the tasks in flight were sent, older than the checkpoint's model."""
        return sorted({t.version for t in self.in_flight if t.version != self.version})


def version_key(version: int) -> str:
    return f"version-{version}"


def down_key(version: int, name: str) -> str:
    """The checkpoint entry of down array ``name`` (e.g. ``scaffold-c``) of ``version``."""
    return f"{version_key(version)}/{name}"


def task_key(seq: int, name: str) -> str:
    """The checkpoint entry of array record ``name`` of the task with dispatch number
    ``seq`` (a method whose clients each get their own content)."""
    return f"task-{seq}/{name}"


def async_checkpoint(state: LoopState, weights: Weights, sent: dict[int, Weights],
                     strategy_state: dict[str, Weights], config: dict[str, Any],
                     rows: list[dict[str, Any]],
                     sent_down: dict[int, dict[str, Weights]] | None = None,
                     sent_content: dict[int, dict[str, Weights]] | None = None) -> Checkpoint:
    """The checkpoint of a flush: ``weights`` is version ``state.version``; ``sent`` holds
    each older version a task in flight carries, ``sent_down`` the method's down arrays of
    each (its own version's follow from ``strategy_state``), ``sent_content`` each task's
    own records by dispatch number (FedRelax)."""
    extra = {version_key(v): list(sent[v]) for v in state.versions()}
    downs = sent_down or {}
    extra.update({down_key(v, k): list(a) for v in state.versions()
                  for k, a in downs.get(v, {}).items()})
    contents = sent_content or {}
    extra.update({task_key(t.seq, k): list(a) for t in state.in_flight
                  for k, a in contents.get(t.seq, {}).items()})
    return Checkpoint(state.version, list(weights), strategy_state, config, rows,
                      state.to_meta(), extra)


def loop_state_of(run_dir: Path, ckpt: Checkpoint, has_clock: bool) -> tuple[
        LoopState, dict[int, Weights]]:
    """The loop state and the model versions of the tasks in flight, checked; one-line
    CheckpointError when the checkpoint is a sync run's or malformed."""
    where = f"resume-dir {run_dir}: the checkpoint"
    if ckpt.async_state is None:
        raise CheckpointError(f"{where} is of a rounds='sync' run (no asynchronous loop "
                              "state); this run has rounds='async'")
    try:
        state = LoopState.from_meta(ckpt.async_state)
    except KeyError as err:
        raise CheckpointError(f"{where} has an incomplete asynchronous state: missing "
                              f"{err}") from None
    except (TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{where} has a malformed asynchronous state: {err}") from None
    if state.version != ckpt.server_round:
        raise CheckpointError(f"{where} is at version {ckpt.server_round}, its asynchronous "
                              f"state at version {state.version}")
    if (state.clock_now is not None) != has_clock:
        raise CheckpointError(f"{where} was made with the virtual clock "
                              f"{'on' if state.clock_now is not None else 'off'}, this run has "
                              f"it {'on' if has_clock else 'off'} (device-speeds)")
    sent = {state.version: ckpt.weights}
    for v in state.versions():
        arrays = ckpt.extra.get(version_key(v))
        if not arrays or len(arrays) != len(ckpt.weights):
            raise CheckpointError(f"{where} lacks model version {v}, which a task in flight "
                                  "was sent")
        sent[v] = arrays
    return state, sent


def sent_downs_of(run_dir: Path, ckpt: Checkpoint, state: LoopState,
                  names: tuple[str, ...]) -> dict[int, dict[str, Weights]]:
    """The method's down arrays ``names`` of each older version a task in flight was sent;
    one-line CheckpointError when one is missing (a checkpoint made before they were kept
    cannot redo such a task exactly)."""
    out: dict[int, dict[str, Weights]] = {}
    for v in state.versions():
        for name in names:
            arrays = ckpt.extra.get(down_key(v, name))
            if not arrays:
                raise CheckpointError(f"resume-dir {run_dir}: the checkpoint lacks {name} of "
                                      f"version {v}, which a task in flight was sent")
            out.setdefault(v, {})[name] = arrays
    return out


def sent_contents_of(run_dir: Path, ckpt: Checkpoint,
                     state: LoopState) -> dict[int, dict[str, Weights]]:
    """Each task in flight's own array records, by dispatch number (``task_key``); one-line
    CheckpointError when a task has none (a checkpoint made before they were kept cannot
    re-send that task's m_i as it went out)."""
    out: dict[int, dict[str, Weights]] = {}
    for t in state.in_flight:
        prefix = task_key(t.seq, "")
        records = {k.removeprefix(prefix): list(a) for k, a in ckpt.extra.items()
                   if k.startswith(prefix)}
        if not records:
            raise CheckpointError(f"resume-dir {run_dir}: the checkpoint lacks the content of "
                                  f"client {t.pid}'s task in flight (dispatch {t.seq}, sent "
                                  f"version {t.version}), which a resume re-sends as it went "
                                  "out")
        out[t.seq] = records
    return out
