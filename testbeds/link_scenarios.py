"""Device links as data: what the kernel does (tbf rates on the veth pair) and what the fault
proxy does (latency, held-back chunks, resets, a cut), per scenario.

The issue's scenarios at full length are minutes long; ``scaled`` shortens the proxy's
periods for a test. A cut stays longer than Flower 1.39's node expiry (HEARTBEAT_PATIENCE 2
x the 30 s heartbeat interval = 60 s) so that the SuperLink marks the node offline and it
must come back as a returning node, which is what the scenario is about."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from testbeds.fault_proxy import Faults

NODE_EXPIRY_SECONDS = 60.0
"""Flower 1.39: a SuperNode silent for 2 x 30 s is offline (HEARTBEAT_PATIENCE x
HEARTBEAT_DEFAULT_INTERVAL)."""


@dataclass(frozen=True)
class Scenario:
    """One link. Rates in Mbit/s (0: no limit), ``rtt`` in seconds, periods in seconds."""

    name: str
    up_mbit: float = 0.0
    down_mbit: float = 0.0
    rtt: float = 0.0
    hold_fraction: float = 0.0
    hold_seconds: float = 0.0
    reset_every: float = 0.0
    cut_from_round: int = 0
    """The link goes away once this round's train messages are out (0: never)."""
    cut_seconds: float = 0.0

    def faults(self) -> Faults:
        """What the proxy does: half the round trip each way."""
        return Faults(delay=self.rtt / 2, hold_fraction=self.hold_fraction,
                      hold_seconds=self.hold_seconds, reset_every=self.reset_every)

    def scaled(self, reset_every: float | None = None, cut_seconds: float | None = None
               ) -> Scenario:
        """The same link with shorter periods for a test (None: keep)."""
        return dataclasses.replace(
            self, reset_every=self.reset_every if reset_every is None else reset_every,
            cut_seconds=self.cut_seconds if cut_seconds is None else cut_seconds)

    def describe(self) -> str:
        parts = [f"{self.up_mbit:g}/{self.down_mbit:g} Mbit/s up/down"
                 if self.up_mbit or self.down_mbit else "no rate limit",
                 f"{1000 * self.rtt:.0f} ms RTT"]
        if self.hold_fraction:
            parts.append(f"{100 * self.hold_fraction:g}% chunks held {self.hold_seconds:g} s")
        if self.reset_every:
            parts.append(f"reset every {self.reset_every:g} s")
        if self.cut_from_round:
            parts.append(f"cut {self.cut_seconds:g} s from round {self.cut_from_round}")
        return f"{self.name}: " + ", ".join(parts)


LOOPBACK = Scenario("loopback")
"""The baseline: the node in the root namespace on 127.0.0.1, no proxy."""
VETH = Scenario("veth")
"""A namespace, a veth pair and the proxy, no fault: the testbed's own cost."""
CELLULAR = Scenario("cellular", up_mbit=1.0, down_mbit=5.0, rtt=0.3, hold_fraction=0.02,
                    hold_seconds=1.0)
FLAKY_WIFI = Scenario("flaky-wifi", up_mbit=10.0, down_mbit=20.0, rtt=0.05, reset_every=60.0)
CUT = Scenario("cut", cut_from_round=3, cut_seconds=120.0)

SCENARIOS = {s.name: s for s in (LOOPBACK, VETH, CELLULAR, FLAKY_WIFI, CUT)}
