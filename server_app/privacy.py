"""The server's privacy budget over a run: the rounds counted, epsilon, the stop at the target.

Accounting is on the server in every mode (simulation and deployment alike): the mechanism
is fixed by the run config (``fedinit.methods.dp``), so epsilon is a function of the number of
rounds the mechanism ran (``fedinit.methods.dp_budget``). That number is the ``Ledger``'s, made
durable before a round's first message leaves the server: a crash after a round's model (or,
under ``local``, its uploads) went out and before its checkpoint is counted, and its rerun
after the resume (fresh sample, fresh noise) is counted again.
``dp-target-epsilon`` stops the run: the noise stays what ``dp-noise-multiplier`` says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from fedinit.config import ConfigError, RunConfig
from fedinit.config.shown import shown
from fedinit.methods.dp_budget import Budget
from fedinit.store.files import atomic_write_text
from server_app.checkpoint import CheckpointError
from strategies.method_strategy import MethodStrategy

LEDGER_FILE = "privacy_ledger.json"
"""In the run directory: ``{"rounds-counted": k, "last-round": t}``, rewritten (atomically,
fsynced) before each round's messages are sent. Counts only, no client ids."""
COUNTED = "dp-rounds-counted"
"""Round field: the mechanism's runs counted so far (the round number, plus one per round
rerun after a crash that had already sent it out)."""


class Ledger:
    """The number of rounds the mechanism ran, durable before anything of a round is sent."""

    def __init__(self, run_dir: Path, counted: int) -> None:
        self.path = run_dir / LEDGER_FILE
        self.counted = counted

    @classmethod
    def open(cls, run_dir: Path, done_rounds: int,
             rows: Sequence[dict[str, Any]] | None) -> Ledger:
        """The ledger of a run whose checkpoint ends at ``done_rounds`` (0: a new run): the
        largest of that, the checkpoint rows' own count and the ledger file's, so a round
        counted and sent but never checkpointed stays counted."""
        counted = done_rounds
        for row in rows or ():
            if isinstance(row.get(COUNTED), int):
                counted = max(counted, row[COUNTED])
        if done_rounds > 0 and (run_dir / LEDGER_FILE).is_file():
            try:
                on_disk = json.loads((run_dir / LEDGER_FILE).read_text())["rounds-counted"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise CheckpointError(f"resume-dir {run_dir}: {LEDGER_FILE} is unreadable ({err}); "
                                  "it holds the privacy rounds counted: restore it, or delete "
                                  "it to count from the checkpoint's rows") from None
            if not isinstance(on_disk, int) or on_disk < 0:
                raise CheckpointError(f"resume-dir {run_dir}: {LEDGER_FILE} has rounds-counted="
                                  f"{on_disk!r}; allowed: an integer >= 0")
            counted = max(counted, on_disk)
        return cls(run_dir, counted)

    def count(self, server_round: int) -> int:
        """Count one more run of the mechanism (round ``server_round``), durably; the new
        total."""
        self.counted += 1
        atomic_write_text(self.path, json.dumps({"rounds-counted": self.counted,
                                                 "last-round": server_round}))
        return self.counted


def privacy_budget(cfg: RunConfig, strategy: MethodStrategy) -> Budget | None:
    """The run's budget (one channel per uploaded vector), or None when ``dp`` is off."""
    if cfg.privacy.dp == "off":
        return None
    return Budget.for_run(cfg, channels=1 + len(strategy.rule.up_keys))


def budget_spent(budget: Budget, cfg: RunConfig, server_round: int, counted: int,
                 out: Path) -> bool:
    """True (logged in one line) when round ``server_round``, the mechanism's ``counted``-th
    run, would take epsilon (replace-one) past ``dp-target-epsilon``: the run stops there, the
    last checkpoint kept. ConfigError when even the first would."""
    target = cfg.privacy.dp_target_epsilon
    if target <= 0.0:
        return False
    eps = budget.epsilon(counted)
    if eps <= target:
        return False
    after, most = shown(eps, target, least=4)
    if counted == 1:
        raise ConfigError(f"run config: dp-target-epsilon={target!r} is not allowed; allowed: "
                          f"at least round 1's epsilon {after} at "
                          f"dp-delta={cfg.privacy.dp_delta:g} "
                          f"(or raise dp-noise-multiplier, or 0 for no limit)")
    log(WARNING, "dp: stopped before round %d, which would take epsilon to %s > "
        "dp-target-epsilon=%s at dp-delta=%g; round %d's checkpoint in %s is kept",
        server_round, after, most, cfg.privacy.dp_delta, server_round - 1, out)
    return True
