"""One experiment from validated config to written results: the server's round loop.

The loop is ours rather than ``Strategy.start`` so that a round has a deadline, the
divergence term and timings land in the results as each round ends, and a person watching
the log sees round, accuracy, loss, divergence and elapsed time.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedinit.config import RunConfig, check_examples, check_writable
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import pack, unpack
from fedinit.store.files import sync_filesystem
from fedinit.store.simulated_state import STATE_ROOT
from fedinit.task.data_paths import check_present
from fedinit.task.federated_data import dataset_of, partition_sizes
from fedinit.task.models import get_weights, initial_model
from server_app.async_rounds import run_async_experiment
from server_app.central_eval import CentralEvaluator
from server_app.checkpoint import (
    Checkpoint,
    save_checkpoint,
)
from server_app.client_divergence import ClientDivergence
from server_app.clients import Fleet
from server_app.engine_facts import client_state_entry
from server_app.federated_eval import FederatedEvaluator
from server_app.personal_round import personal_round
from server_app.privacy import Ledger, budget_spent, privacy_budget
from server_app.public_rows import withheld
from server_app.regime_files import CENTRAL_TEST, write_regimes
from server_app.results import AGGREGATED, DP_CONVENTIONS, DP_FIELDS, DP_LEFT_OUT, Recorder
from server_app.run_basics import (
    NothingTrained,
    check_finite,
    dp_fields,
    resume_point,
    run_name,
    write_model,
)
from server_app.status import StatusWriter
from server_app.tracking import check_available as check_tracking
from strategies.engine import Step, run_steps
from strategies.method_strategy import MethodStrategy
from strategies.operator_log import log_line
from strategies.over_select import OVER_SELECT_FIELDS
from strategies.personal_summary import KINDS
from strategies.round_stages.quorum import TooFewReplies
from strategies.sync_schedule import RoundDone, SyncSchedule
from strategies.virtual_clock import CLOCK_FIELDS, VirtualClock


def run_experiment(grid: Grid, cfg: RunConfig, out_dir: Path | None = None,
                   stop: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """Run ``cfg`` on ``grid`` on its schedule's driver (``rounds=sync``: the rounds below;
    ``rounds=async``: ``server_app/async_rounds.py``) and return the summary written to disk.
    ``stop`` (benchmarks) sees each row once it is written and checkpointed; True ends the
    run there, before ``num-server-rounds``."""
    if cfg.schedule.rounds == "async":
        return run_async_experiment(grid, cfg, out_dir, stop)
    return run_sync_experiment(grid, cfg, out_dir, stop)


def run_sync_experiment(grid: Grid, cfg: RunConfig, out_dir: Path | None = None,
                        stop: Callable[[dict[str, Any]], bool] | None = None
                        ) -> dict[str, Any]:
    """All rounds of ``cfg`` on ``grid``, each a step of the engine's synchronous schedule,
    and the summary written to disk."""
    if not cfg.fleet.resume_dir:
        check_writable("output-dir", out_dir or Path(cfg.fleet.output_dir).resolve())
    # Cheap checks first, so that a missing data set or a wrong-sized federation fails in
    # seconds, before the data is decoded; "results:" is printed once the run really starts.
    # With device data the server holds none: the model is built from the run's schema.
    if not cfg.data.on_devices:
        check_present(cfg.data.dataset, Path(cfg.data.resolved_data_dir))
    check_tracking(cfg.fleet.tracking)
    resume = resume_point(cfg)
    if resume:
        check_writable("resume-dir", resume[0])
    fleet = Fleet(grid, cfg)
    warming = _warm_server_data(cfg)
    node_of = fleet.discover()
    if warming is not None:
        warming.join()
    if not cfg.data.on_devices:
        check_examples(cfg, len(dataset_of(cfg).train_y))
    out = resume[0] if resume else (out_dir or Path(cfg.fleet.output_dir).resolve() / run_name(cfg))
    central = CentralEvaluator(cfg) if cfg.eval_source == "central" else None
    federated = (FederatedEvaluator(cfg, node_of, fleet.available) if central is None
                 else None)
    divergence = ClientDivergence(cfg, node_of, fleet.available)
    model = initial_model(cfg)
    weights = get_weights(model)
    log(INFO, "results: %s%s", out, f" (resuming after round {resume[1].server_round})"
        if resume else "")
    strategy = MethodStrategy.for_run(cfg, node_of, weights, available=fleet.available)
    strategy.bind_run_dir(out)  # a method's own server files (FedRelax's client models)
    strategy.summary()

    first = 1
    if resume:
        weights, first = resume[1].weights, resume[1].server_round + 1
        strategy.load_server_state(resume[1].strategy_state)
    budget = privacy_budget(cfg, strategy)
    ledger = None if budget is None else Ledger.open(out, first - 1,
                                                     resume[1].rows if resume else None)
    clock = VirtualClock.for_run(cfg)
    rec = Recorder(out, cfg.to_dict(), keep_rounds=first - 1,
                   rows=resume[1].rows if resume else None, eval_source=cfg.eval_source,
                   extra_fields=((DP_FIELDS if budget else
                                  OVER_SELECT_FIELDS if cfg.fleet.over_select > 0.0 else ())
                                 + (CLOCK_FIELDS if clock else ())),
                   left_out=DP_LEFT_OUT if budget else (), tracking=cfg.fleet.tracking,
                   withheld=withheld(cfg.privacy.dp, secret_sample=True,
                                     eval_source=cfg.eval_source,
                                     release_client_metrics=cfg.privacy.dp_release_client_metrics),
                   private_log=budget is not None)
    if clock is not None and rec.rows:  # a resumed run's clock goes on from its last row
        clock.now = float(rec.rows[-1].get("sim-time") or 0.0)
    rounds = SyncSchedule(strategy, grid, cfg, clock)  # the engine's synchronous schedule
    write_regimes(out, cfg)
    status = StatusWriter(out, cfg, fleet, first)  # status.json: the operator's live page
    status.watch(strategy)
    status.write()
    arrays = pack(weights)
    round_config = ConfigRecord({rk.EXPERIMENT: out.name, **client_state_entry(grid, cfg, out)})
    state_root = Path(str(round_config[STATE_ROOT])) if STATE_ROOT in round_config else None
    n = cfg.train.num_server_rounds
    failed = 0

    def before_round(rnd: int) -> bool:
        if ledger is not None and budget is not None and budget_spent(
                budget, cfg, rnd, ledger.counted + 1, out):
            return True
        fleet.collect()  # newcomers identified beside the last round take part from now on
        fleet.ask()  # identity queries to new nodes, answered beside this round
        return False

    def on_round(step: Step[RoundDone], began: float) -> bool:
        nonlocal failed, weights, arrays  # the global model as the last round left it
        rnd, messages, replies, new_arrays = step.number, step.messages, step.replies, step.arrays
        if state_root is not None:  # the clients wrote their state without fsync: one
            sync_filesystem(state_root)  # flush for all, before the checkpoint relies on it
        failed = failed + 1 if step.held else 0
        if new_arrays is not None:  # decoded once: evaluation and checkpoint read ``weights``
            weights = unpack(new_arrays)
            check_finite(rnd, weights, strategy.server_state(), out)
            arrays = new_arrays
        acc = loss = None
        evaluated: dict[str, Any] = {}
        if (rnd % cfg.eval.eval_every == 0 or rnd == n) and federated is not None:
            loss, acc, evaluated = federated(grid, rnd, arrays, round_config)
        elif (rnd % cfg.eval.eval_every == 0 or rnd == n) and central is not None:
            loss, acc = central(weights)
        evaluated.update(divergence(grid, rnd, arrays, round_config))
        personal, per_client = personal_round(strategy, grid, rnd, arrays, round_config,
                                              cfg.fleet.round_timeout)
        if per_client and budget is None:  # under DP it says who has trained (DP_LEFT_OUT)
            rec.write_personal_clients(per_client)
        row = {"round": rnd, "test-acc": acc, "test-loss": loss, "lr": cfg.train.lr_at(rnd),
               "round-seconds": time.monotonic() - began, "elapsed-seconds": rec.elapsed(),
               **step.fields, **personal, **evaluated,
               "clients-trained": clients_trained(replies, strategy.sent_to),
               **(dp_fields(budget, ledger.counted) if budget and ledger else {}),
               AGGREGATED: new_arrays is not None}
        rec.add_round(row)
        status.add_round(row, messages, replies, strategy.sent_to)
        save_checkpoint(out, Checkpoint(rnd, weights,
                                        strategy.server_state(), cfg.to_dict(), rec.rows))
        log(INFO, "%s", _progress_line(rec.public_row(row), n, len(messages),
                                       cfg.privacy.dp_delta))
        if budget is not None:  # the operator's own line, with what the files withhold
            log_line(True, INFO, "%s", _progress_line(row, n, len(messages),
                                                      cfg.privacy.dp_delta))
        if stop is not None and stop(row):
            log(INFO, "round %d: the caller's stop condition holds; the run ends here", rnd)
            return True
        if failed >= cfg.fleet.max_failed_rounds:
            raise TooFewReplies(
                f"{failed} rounds in a row had fewer than "
                f"min-replies={cfg.fleet.min_replies} usable "
                f"replies; stopped after round {rnd}. Bring the SuperNodes back and resume "
                f"with --run-config \"resume-dir='{out}'\"")
        return False

    # under DP a round is counted durably before its first message: its uploads (local DP)
    # and its model (evaluation, next round) are then counted
    run_steps(rounds.steps(arrays, first, n, round_config, before_round,
                           None if ledger is None else ledger.count), on_round)

    if rec.aggregated_rounds() == 0:  # the rows a resume kept count too
        raise NothingTrained(
            f"no round of the run aggregated a reply (all {len(rec.rows)} rounds had fewer than "
            f"min-replies={cfg.fleet.min_replies} usable replies: see the rejected replies above); "
            "the model is the initial one, so no final results were written")
    status.finish()
    final = weights
    write_model(model, final, out)
    summary = rec.finish(final, {"results-dir": str(out), "eval-source": cfg.eval_source,
                                 **({"central-test": CENTRAL_TEST}
                                    if cfg.data.num_regimes and central is not None else {}),
                                 **({**{k: rec.rows[-1].get(k) for k in DP_FIELDS},
                                     "dp-epsilon-conventions": DP_CONVENTIONS,
                                     "dp-delta": cfg.privacy.dp_delta} if budget else {})})
    log(INFO, "done: final acc %.2f%%, best %.2f%%, %.1f s%s; results in %s",
        100 * (summary["final-test-acc"] or math.nan), 100 * (summary["best-test-acc"] or math.nan),
        summary["wall-seconds"],
        _epsilon_part(summary, cfg.privacy.dp_delta) if budget else "", out)
    return summary


def _warm_server_data(cfg: RunConfig) -> threading.Thread | None:
    """Decode the data set and draw the partitions (both cached in-process) while the
    federation is found: in a simulation that waits seconds for the engine to start its
    workers, and the server needs both right after (its evaluator, the clients' sizes). A
    failure here is left for the same call after discovery to report."""
    if cfg.data.on_devices:
        return None

    def warm() -> None:
        with contextlib.suppress(Exception):  # the same call on the main thread reports it
            dataset_of(cfg)
            partition_sizes(cfg)

    thread = threading.Thread(target=warm, name="warm-server-data", daemon=True)
    thread.start()
    return thread


def clients_trained(replies: list[Message], sent_to: dict[int, int]) -> list[int]:
    """Client ids of the round's replies that came back without an error (aggregated or
    rejected by a check): who trained, with late joiners and dropped nodes visible."""
    return sorted(sent_to[m.metadata.src_node_id] for m in replies
                  if not m.has_error() and m.metadata.src_node_id in sent_to)


def _progress_line(row: dict[str, Any], n: int, sent: int, delta: float = 0.0) -> str:
    """'[round 3/60] acc 71.20% loss 0.8123 div 1.23e-02 ...' for the live log: each part
    whose field is in ``row`` (a column the public files withhold is not)."""
    parts = [f"[round {row['round']}/{n}]"]
    if "test-acc" in row:
        acc = "  -   " if row["test-acc"] is None else f"{100 * row['test-acc']:5.2f}%"
        loss = "  -   " if row.get("test-loss") is None else f"{row['test-loss']:.4f}"
        parts.append(f"acc {acc} loss {loss}")
    if "divergence" in row:
        div = row["divergence"]
        div_s = "-" if div is None else f"{div:.3e}"
        for name, key in (("all", "divergence-all"), ("sample", "divergence-sample")):
            if row.get(key) is not None:
                div_s += (f" (div-{name} {row[key]:.3e}, {row.get('divergence-clients')} "
                          "clients)")
        parts.append(f"div {div_s}")
    if "train-loss" in row:
        tl = row["train-loss"]
        parts.append(f"train-loss {'-' if tl is None else f'{tl:.4f}'}")
    if "num-replies" in row:
        parts.append(f"replies {row['num-replies'] or 0}/{sent} rejected "
                     f"{row.get('num-rejected') or 0}")
    personal = _personal_part(row).rstrip()
    if personal:
        parts.append(personal)
    if "round-seconds" in row:
        parts.append(f"| {row['round-seconds']:.1f}s, elapsed {row['elapsed-seconds']:.0f}s")
    return " ".join(parts) + _epsilon_part(row, delta)


def _epsilon_part(row: dict[str, Any], delta: float) -> str:
    """', epsilon 54.41 (replace-one, fixed-size sampling) / 6.337 (add/remove, Poisson q=m/N)
    at delta 1e-05' for the live log, or '' outside DP."""
    if row.get("dp-epsilon") is None:
        return ""
    return (f", epsilon {row['dp-epsilon']:.4g} (replace-one, fixed-size sampling) / "
            f"{row['dp-epsilon-add-remove']:.4g} (add/remove, Poisson q=m/N) at delta "
            f"{delta:g}")


def _personal_part(row: dict[str, Any]) -> str:
    """'local g/ft/own mean 60.1/85.3/80.2 p10 ... min ... (20 clients) ' in rounds with a
    personalized evaluation, else ''."""
    if row.get("local-global-mean") is None:
        return ""

    def three(stat: str) -> str:
        return "/".join("-" if row.get(f"local-{k}-{stat}") is None
                        else f"{100 * row[f'local-{k}-{stat}']:.1f}" for k in KINDS)

    return (f"local g/ft/own mean {three('mean')} p10 {three('p10')} min {three('min')} "
            f"({row.get('local-eval-clients', 0)} clients) ")
