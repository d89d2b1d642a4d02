"""What the stages share across rounds: the method (its rule and typed state) and the round of
each client's last aggregated reply. Held by reference, so a checkpoint restore reaches every
stage that reads them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from fedinit.methods.method import ServerRule, ServerState
from fedinit.methods.weights import Weights

ACCOUNTED_STATE = "accounted-rounds"
"""Server-state name of the round each client's last aggregated reply came from (0: none)."""


@dataclasses.dataclass
class HeldMethod:
    """The method's pure rule and its current server state (replaced by each update)."""

    rule: ServerRule
    state: ServerState


@dataclasses.dataclass
class AccountedRounds:
    """Client id -> round of its last aggregated reply, named in each train message so the
    client starts its server-summed state (``ClientRule.accounted_keys``) from the version
    the server counted. ``rounds`` None: not tracked (a run resumed from a checkpoint made
    before it was): clients then use their newest state, as that run did."""

    rounds: dict[int, int] | None = dataclasses.field(default_factory=dict)

    def round_of(self, client: int) -> int | None:
        """The round to name in client ``client``'s message, or None when not tracked."""
        return None if self.rounds is None else self.rounds.get(client, 0)

    def count(self, clients: Iterable[int], server_round: int) -> None:
        """``clients``' replies were aggregated in ``server_round``."""
        if self.rounds is not None:
            self.rounds.update((c, server_round) for c in clients)

    def arrays(self, num_clients: int) -> dict[str, Weights]:
        """The server-state entry (none when not tracked)."""
        if self.rounds is None:
            return {}
        rounds = np.zeros(num_clients, dtype=np.int64)
        for client, rnd in self.rounds.items():
            rounds[client] = rnd
        return {ACCOUNTED_STATE: [rounds]}

    def load(self, state: dict[str, Weights]) -> None:
        """Restore from a server state; an older one without the entry: not tracked."""
        held = state.get(ACCOUNTED_STATE)
        self.rounds = (None if held is None else
                       {client: int(r) for client, r in enumerate(held[0]) if r > 0})
