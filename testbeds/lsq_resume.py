"""Kill and resume on the least-squares FedBuff runs (``testbeds.lsq_async``): a grid that
kills the server where its script ends, and the real loop writing the checkpoint of one
version, or resumed from it, as ``run_async_experiment`` does."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message

from fedinit.config import RunConfig
from fedinit.methods.fedbuff import Flush
from server_app.async_resume import async_checkpoint, loop_state_of, resume_loop
from server_app.checkpoint import load_checkpoint, save_checkpoint
from strategies.async_loop import BufferedStrategy
from testbeds.lsq_async import Script, ScriptedGrid, make_loop
from testbeds.lsq_problem import Problem


class DyingGrid(ScriptedGrid):
    """Killed (``KeyboardInterrupt``) when the loop pulls past the end of its script."""

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if not self.script:
            raise KeyboardInterrupt("server killed")
        return super().pull_messages(message_ids)


def resumable_run(grid: ScriptedGrid, run_dir: Path, ckpt_at: int,
                  resume: bool = False) -> tuple[np.ndarray, BufferedStrategy]:
    """The real loop with the server's files in ``run_dir`` (as ``run_async_experiment``
    binds them: FedRelax's per-client models), writing the checkpoint of version
    ``ckpt_at`` there, or resumed from the one there."""
    loop, strategy = make_loop(grid)
    run_dir.mkdir(exist_ok=True)
    strategy.bind_run_dir(run_dir)
    w = [grid.p.w0.copy()]
    if resume:
        ckpt = load_checkpoint(run_dir)
        w = resume_loop(loop, run_dir, ckpt, loop_state_of(run_dir, ckpt, has_clock=False))

    def on_flush(flush: Flush, facts: dict[str, Any]) -> None:
        state = loop.state()  # every flush, as the real loop's (it sets the pins)
        if flush.version == ckpt_at:
            save_checkpoint(run_dir, async_checkpoint(
                state, flush.weights, loop.sent(), strategy.server_state(),
                grid.cfg.to_dict(), [], loop.sent_down(), loop.sent_content()))

    return loop.run(w, on_flush)[0], strategy


def uninterrupted_and_killed(p: Problem, cfg: RunConfig, tmp: Path, killed: Script,
                             after: Script, ckpt_at: int
                             ) -> tuple[np.ndarray, BufferedStrategy, Path, Path]:
    """The uninterrupted run's model and strategy (``killed`` but its last reply, then
    ``after``, which redoes it), and the run and state directories of the same run killed
    where ``killed`` ends, its checkpoint of version ``ckpt_at`` on disk."""
    ref_grid = ScriptedGrid(p, cfg, killed[:-1] + after, tmp / "ref-state")
    ref_w, ref = resumable_run(ref_grid, tmp / "ref-run", ckpt_at=ckpt_at)
    run_dir, states = tmp / "run", tmp / "state"
    try:
        resumable_run(DyingGrid(p, cfg, killed, states), run_dir, ckpt_at=ckpt_at)
    except KeyboardInterrupt:
        return ref_w, ref, run_dir, states
    raise AssertionError("the killed run went past the end of its script")
