"""Recognising a user's ClientApp that does not run the client half, and stopping its run.

A strategy's train reply is only usable when it came from ``strategies.client.method_train``
(or the project's ClientApp): that reply says in its ``config`` record whether it uploads
Delta_i or w_iK (``fedinit.methods.wire.UPLOAD_DELTA``). A plain Flower ClientApp (``arrays`` and
``metrics`` only) never says it, so the server rejects every such reply and the model never
moves; without this check the run would end "successfully" with its starting accuracy.

The rule: a reply that carries content but no ``upload-delta`` in a ``config`` record is
*foreign*; each round with foreign replies logs one warning naming the fix; after
``stop_after`` rounds in a row in which every reply that arrived was foreign, the run stops
with one line naming ``strategies.client.method_train``. A fleet where only some nodes run a
wrong app goes on (their replies are rejected and counted, and named in the warning).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import WARNING

from flwr.app import Message
from flwr.common.logger import log

from fedinit.methods import wire as rk

FIX = ("return strategies.client.method_train(msg, context, model, trainloader, epochs=...) "
       "from the ClientApp's @app.train() function")
"""The fix, as every message about a foreign reply states it."""


class ClientHalfMissing(RuntimeError):
    """Every reply of ``stop_after`` rounds in a row came from a ClientApp without the
    client half: the run cannot train, so it stops with one line."""


def is_foreign(msg: Message) -> bool:
    """True for a reply with content that did not come from the client half (no
    ``upload-delta`` in a ``config`` record); an error reply is not foreign (it failed)."""
    if msg.has_error():
        return False
    conf = msg.content.config_records.get(rk.CONFIG)
    return conf is None or rk.UPLOAD_DELTA not in conf


@dataclass
class ClientHalfCheck:
    """Counts the rounds in a row whose arrived replies were all foreign."""

    strategy: str
    """The strategy's class name, for the messages."""
    stop_after: int
    """Rounds in a row of only foreign replies after which the run stops (>= 1)."""
    rounds_in_a_row: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop_after, bool) or not isinstance(self.stop_after, int) \
                or self.stop_after < 1:
            raise ValueError(f"{self.strategy}: stop_after_foreign_rounds={self.stop_after!r} "
                             "is not allowed; allowed: an integer >= 1")

    def check(self, server_round: int, replies: Iterable[Message]) -> None:
        """Log this round's foreign replies; raise ``ClientHalfMissing`` on the
        ``stop_after``-th round in a row in which every arrived reply was foreign."""
        arrived = [m for m in replies if not m.has_error()]
        foreign = [m for m in arrived if is_foreign(m)]
        if foreign:
            nodes = sorted(int(m.metadata.src_node_id) for m in foreign)
            log(WARNING, "%s round %d: %d of %d replies did not come from "
                "strategies.client.method_train (no %r in their 'config' record; nodes %s) and "
                "are rejected; %s", self.strategy, server_round, len(foreign), len(arrived),
                rk.UPLOAD_DELTA, nodes, FIX)
        if arrived and len(foreign) == len(arrived):
            self.rounds_in_a_row.append(server_round)
        else:
            self.rounds_in_a_row.clear()
        if len(self.rounds_in_a_row) >= self.stop_after:
            first, last = self.rounds_in_a_row[0], self.rounds_in_a_row[-1]
            span = f"round {last}" if first == last else f"rounds {first}-{last}"
            raise ClientHalfMissing(
                f"{self.strategy}: every reply of {span} came from a ClientApp that does not "
                f"run strategies.client.method_train (no {rk.UPLOAD_DELTA!r} in the reply), so "
                f"the model cannot move; {FIX}")


__all__ = ["FIX", "ClientHalfCheck", "ClientHalfMissing", "is_foreign"]
