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
aggregated (``strategies.async_loop.AsyncLoop.take``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedinit.methods.weights import Weights
from server_app.checkpoint import Checkpoint, CheckpointError
from strategies.async_loop import AsyncLoop
from strategies.async_state import LoopState


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
                                  f"client {t.cid}'s task in flight (dispatch {t.seq}, sent "
                                  f"version {t.version}), which a resume re-sends as it went "
                                  "out")
        out[t.seq] = records
    return out


def resume_loop(loop: AsyncLoop, run_dir: Path, ckpt: Checkpoint,
                loaded: tuple[LoopState, dict[int, Weights]]) -> Weights:
    """Continue ``loop`` from ``ckpt`` (its loop state ``loaded``): the method's server
    state, then the loop's, each task in flight to be re-sent with its version's model and
    down arrays; returns the checkpoint's model."""
    strategy = loop.strategy
    strategy.load_server_state(ckpt.strategy_state)
    down = strategy.rule.down(strategy.state)  # the checkpoint's version's
    state, sent = loaded
    loop.load(state, sent, {**sent_downs_of(run_dir, ckpt, state, tuple(down)),
                            state.version: down},
              sent_contents_of(run_dir, ckpt, state) if strategy.rule.replaces_models
              else None)
    return list(ckpt.weights)
