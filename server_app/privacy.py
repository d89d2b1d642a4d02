"""The server's privacy budget over a run: epsilon per round and the stop at the target.

Accounting is on the server in every mode (simulation and deployment alike): the mechanism
is fixed by the run config (``methods.dp``), so epsilon after t rounds is a function of t
alone (``methods.dp_budget``) and a resumed run counts from its checkpoint's round.
``dp-target-epsilon`` stops the run: the noise stays what ``dp-noise-multiplier`` says.
"""

from __future__ import annotations

from logging import WARNING
from pathlib import Path

from flwr.common.logger import log

from methods.dp_budget import Budget
from server_app.strategy import MethodStrategy
from task.config import ConfigError, RunConfig


def privacy_budget(cfg: RunConfig, strategy: MethodStrategy) -> Budget | None:
    """The run's budget (one channel per uploaded vector), or None when ``dp`` is off."""
    if cfg.dp == "off":
        return None
    return Budget.for_run(cfg, channels=1 + len(strategy.rule.up_keys))


def budget_spent(budget: Budget, cfg: RunConfig, server_round: int, out: Path) -> bool:
    """True (logged in one line) when round ``server_round`` would take epsilon past
    ``dp-target-epsilon``: the run stops there, the last checkpoint kept. ConfigError when
    even round 1 would."""
    target = cfg.dp_target_epsilon
    if target <= 0.0:
        return False
    eps = budget.epsilon(server_round)
    if eps <= target:
        return False
    if server_round == 1:
        raise ConfigError(f"run config: dp-target-epsilon={target!r} is not allowed; allowed: "
                          f"at least round 1's epsilon {eps:.4g} at dp-delta={cfg.dp_delta:g} "
                          f"(or raise dp-noise-multiplier, or 0 for no limit)")
    log(WARNING, "dp: stopped before round %d, which would take epsilon to %.4g > "
        "dp-target-epsilon=%g at dp-delta=%g; round %d's checkpoint in %s is kept",
        server_round, eps, target, cfg.dp_delta, server_round - 1, out)
    return True
