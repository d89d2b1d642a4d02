"""``rounds=async`` as an experiment: the FedBuff loop's flushes (``strategies/async_loop.py``,
the schedule a strategy's ``BufferedAsync`` runs too) on the round engine
(``strategies/engine.py``), with what a run of the project adds: the data, the central
evaluation after each flush, the rows, a checkpoint at every flush written before anything
of the new version is sent (``resume-dir`` continues from it, re-sending the tasks that were
in flight as they were: ``server_app/async_resume.py``), and central DP's ledger
(``server_app/async_privacy.py``: each flush one counted release).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedinit.config import RunConfig, check_examples, check_writable
from fedinit.methods import wire as rk
from fedinit.methods.fedbuff import Flush
from fedinit.task.data_paths import check_present
from fedinit.task.federated_data import dataset_of, partition_sizes
from fedinit.task.models import get_weights, initial_model
from server_app.async_privacy import ASYNC_DP_CONVENTIONS, DP_ASYNC_LEFT_OUT, FlushPrivacy
from server_app.async_resume import async_checkpoint, loop_state_of, resume_loop
from server_app.central_eval import CentralEvaluator
from server_app.checkpoint import save_checkpoint
from server_app.clients import Fleet
from server_app.engine_facts import client_state_entry
from server_app.public_rows import withheld
from server_app.results import DP_FIELDS, DP_LEFT_OUT, Recorder
from server_app.run_basics import NothingTrained, check_finite, resume_point, run_name, write_model
from strategies.async_loop import ASYNC_FIELDS, AsyncLoop, BufferedStrategy
from strategies.engine import Step, run_steps
from strategies.virtual_clock import CLOCK_FIELDS, VirtualClock


def run_async_experiment(grid: Grid, cfg: RunConfig, out_dir: Path | None = None,
                         stop: Callable[[dict[str, Any]], bool] | None = None
                         ) -> dict[str, Any]:
    """The ``rounds=async`` run of ``cfg`` on ``grid``: its results, as ``run_experiment``
    writes them (rounds.jsonl, summary.json, final_model.npz, model.pt, and checkpoint.npz
    at every flush); with ``resume-dir``, continued from that run's checkpoint. ``stop``
    (benchmarks: ``bench/async_speed.py --until-sync``) sees each flush's row once it is
    written and checkpointed; True ends the run there, before ``num-server-rounds``."""
    resume = resume_point(cfg)
    check_writable("resume-dir" if resume else "output-dir",
                   resume[0] if resume else out_dir or Path(cfg.fleet.output_dir).resolve())
    check_present(cfg.data.dataset, Path(cfg.data.resolved_data_dir))
    has_clock = VirtualClock.for_run(cfg) is not None
    loaded = loop_state_of(resume[0], resume[1], has_clock) if resume else None
    fleet = Fleet(grid, cfg)
    node_of = fleet.discover()
    check_examples(cfg, len(dataset_of(cfg).train_y))
    out = resume[0] if resume else out_dir or Path(cfg.fleet.output_dir).resolve() / run_name(cfg)
    central = CentralEvaluator(cfg)
    model = initial_model(cfg)
    weights = get_weights(model)
    log(INFO, "results: %s (rounds=async: concurrency %d, buffer-size %d, staleness %s)%s",
        out, cfg.async_concurrency, cfg.async_buffer_size, cfg.schedule.staleness,
        f" (resuming after version {resume[1].server_round})" if resume else "")
    strategy = BufferedStrategy(cfg, node_of, weights, available=fleet.available,
                                examples=partition_sizes(cfg))
    strategy.bind_run_dir(out)
    loop = AsyncLoop(grid, cfg, strategy, fleet.available, node_of, ConfigRecord(
        {rk.EXPERIMENT: out.name, **client_state_entry(grid, cfg, out)}))
    loop.run_dir = out
    if resume and loaded:
        weights = resume_loop(loop, resume[0], resume[1], loaded)
    loop.privacy = privacy = FlushPrivacy.for_run(
        cfg, tuple(strategy.rule.up_keys), out, resume[1].server_round if resume else 0,
        resume[1].rows if resume else None)
    fields = tuple(f for f in ASYNC_FIELDS if privacy is None or f not in DP_ASYNC_LEFT_OUT)
    rec = Recorder(out, cfg.to_dict(), eval_source="central",
                   keep_rounds=resume[1].server_round if resume else 0,
                   rows=resume[1].rows if resume else None,
                   extra_fields=(fields + (CLOCK_FIELDS if loop.clock else ())
                                 + (DP_FIELDS if privacy else ())),
                   left_out=DP_LEFT_OUT if privacy else (), tracking=cfg.fleet.tracking,
                   withheld=withheld(cfg.privacy.dp, secret_sample=False, eval_source="central",
                                     release_client_metrics=cfg.privacy.dp_release_client_metrics),
                   private_log=privacy is not None)
    n = cfg.train.num_server_rounds
    final = weights

    def on_flush(step: Step[Flush], began: float) -> bool:
        nonlocal final
        flush = step.detail
        version, final = step.number, flush.weights
        check_finite(version, flush.weights, strategy.server_state(), out)
        acc = loss = None
        if version % cfg.eval.eval_every == 0 or version == n:
            loss, acc = central(flush.weights)
        row = {**step.fields, "test-acc": acc, "test-loss": loss,
               "round-seconds": time.monotonic() - began, "elapsed-seconds": rec.elapsed()}
        rec.add_round(row)
        save_checkpoint(out, async_checkpoint(loop.state(), flush.weights, loop.sent(),
                                              strategy.server_state(), cfg.to_dict(),
                                              rec.rows, loop.sent_down(),
                                              loop.sent_content()))
        log(INFO, "[version %d/%d] acc %s replies %d staleness mean %.2f max %d dropped %d "
            "| %.1fs", version, n, "-" if acc is None else f"{100 * acc:.2f}%",
            flush.replies, row["staleness-mean"], row["staleness-max"], flush.dropped,
            row["round-seconds"])
        if stop is not None and stop(row):
            log(INFO, "version %d: the caller's stop condition holds; the run ends here",
                version)
            return True
        return False

    run_steps(loop.steps(weights), on_flush)
    if rec.aggregated_rounds() == 0:
        raise NothingTrained("rounds=async: no flush aggregated a reply")
    write_model(model, final, out)
    summary = rec.finish(final, {"results-dir": str(out), "eval-source": "central",
                                 **({**{k: rec.rows[-1].get(k) for k in DP_FIELDS},
                                     "dp-epsilon-conventions": ASYNC_DP_CONVENTIONS,
                                     "dp-delta": cfg.privacy.dp_delta} if privacy else {})})
    log(INFO, "done: final acc %.2f%%, %.1f s; results in %s",
        100 * (summary["final-test-acc"] or math.nan), summary["wall-seconds"], out)
    return summary
