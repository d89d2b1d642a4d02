"""What ``rounds=async``'s loop (``strategies/async_loop.py``) is at a flush, beside the model
and the strategy's server state: the version, the client choice's generator, the clock, the
tasks in flight. A checkpoint saves it and a resume re-sends those tasks exactly as they
went out (the file format: ``server_app/async_resume.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TASK_FIELDS = ("cid", "version", "round", "base", "finish", "seq")
"""One task in flight, as saved: client, version sent, its round number, the round of the
state it starts from, simulated finish time, dispatch number."""


@dataclass(frozen=True)
class InFlight:
    """A task out at the checkpoint, to be re-sent as it was."""

    cid: int
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
            cid, version, rnd, base, finish, seq = row
            tasks.append(InFlight(int(cid), int(version), int(rnd), int(base), float(finish),
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
