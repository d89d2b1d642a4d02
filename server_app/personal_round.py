"""One personalized evaluation inside the round loop: Flower evaluate messages out and back.

The shell decides whether the round has one and whom to ask (``configure_evaluate``) and sums
up the replies (``aggregate_evaluate``); this adds the cost (messages, seconds) for the round's
row and the per-client rows for the results directory.
"""

from __future__ import annotations

import time
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from strategies.method_strategy import MethodStrategy
from strategies.personal_summary import client_rows


def personal_round(strategy: MethodStrategy, grid: Grid, server_round: int,
                   arrays: ArrayRecord, config: ConfigRecord,
                   timeout: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the round row's personalized-evaluation fields, per-client rows); both empty in a
    round without one."""
    t0 = time.monotonic()
    messages = list(strategy.configure_evaluate(server_round, arrays, config, grid))
    if not messages:
        return {}, []
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    summary = strategy.aggregate_evaluate(server_round, replies)
    fields = {**dict(summary or {}), "local-eval-messages": len(messages) + len(replies),
              "local-eval-seconds": time.monotonic() - t0}
    return fields, client_rows(server_round, strategy.personal_scores)
