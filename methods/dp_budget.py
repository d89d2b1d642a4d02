"""The privacy accountant: epsilon at ``dp-delta`` after t rounds, from Google's
``dp-accounting`` RDP accountant (no privacy formula is written here).

What one round is, as the accountant sees it (docs/algorithms.md, section DP):
- Neighbouring federations differ in ONE client's data, the number of clients N staying
  public (``REPLACE_ONE``): replacing one client's clipped contribution moves a channel's sum
  by at most 2 x its bound, so a channel noised with std z x bound is a Gaussian mechanism of
  noise multiplier z / 2. The channels of a round (the model upload, SCAFFOLD's Delta_c_i)
  compose as one Gaussian (``ComposedDpEvent``).
- ``central``: the server samples exactly m of N clients without replacement each round
  (``methods.sampling``, drawn from a secret seed under DP), which is the accountant's
  ``SampledWithoutReplacementDpEvent(N, m, ...)``; rounds compose. Sampling never costs
  privacy, but the library's bound for it (Wang et al. 2019) exceeds the plain Gaussian's at
  small noise and large m / N, so the reported epsilon is the smaller of the two bounds,
  each the library's.
- ``local``: each client's upload is itself the Gaussian mechanism; the server knows who was
  sampled, so there is no amplification by sampling: every round counts in full (a client
  that took part in every round, the worst case).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dp_accounting import DpEvent

    from methods.dp import DpSettings

REPLACE_SENSITIVITY = 2.0
"""A channel's L2 sensitivity in multiples of its clip bound under replace-one."""


def round_event(mode: str, noise_multiplier: float, channels: int, num_clients: int,
                per_round: int) -> DpEvent:
    """One round of the mechanism as a ``dp_accounting`` event."""
    import dp_accounting as dpa

    gaussian = dpa.ComposedDpEvent([dpa.GaussianDpEvent(noise_multiplier / REPLACE_SENSITIVITY)
                                    for _ in range(channels)])
    if mode == "local" or per_round >= num_clients:
        return gaussian
    return dpa.SampledWithoutReplacementDpEvent(source_dataset_size=num_clients,
                                                sample_size=per_round, event=gaussian)


class Budget:
    """Epsilon after t rounds of one run's mechanism; composes each round once."""

    def __init__(self, mode: str, noise_multiplier: float, channels: int, num_clients: int,
                 per_round: int, delta: float) -> None:
        from dp_accounting import NeighboringRelation
        from dp_accounting.rdp import RdpAccountant

        self.event = round_event(mode, noise_multiplier, channels, num_clients, per_round)
        plain = round_event(mode, noise_multiplier, channels, num_clients, num_clients)
        self.events = [self.event] if plain == self.event else [self.event, plain]
        """The round as sampled, and unsampled: both bounds hold; the smaller is reported."""
        self.delta = delta
        self._new = lambda: RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
        self._accountants = [self._new() for _ in self.events]
        self._rounds = 0
        self._cache: dict[int, float] = {0: 0.0}

    @classmethod
    def for_run(cls, cfg: DpSettings, channels: int) -> Budget:
        """The budget of ``cfg``'s mechanism with ``channels`` uploaded vectors per reply."""
        return cls(cfg.dp, cfg.dp_noise_multiplier, channels, cfg.num_clients,
                   cfg.clients_per_round, cfg.dp_delta)

    def epsilon(self, rounds: int) -> float:
        """Epsilon at ``delta`` after ``rounds`` rounds (inf when there is no noise)."""
        if rounds not in self._cache:
            if rounds < self._rounds:  # asked backwards (a resume): recount from zero
                self._accountants = [self._new() for _ in self.events]
                self._rounds = 0
            for accountant, event in zip(self._accountants, self.events, strict=True):
                accountant.compose(event, rounds - self._rounds)
            self._rounds = rounds
            eps = min(float(a.get_epsilon(self.delta)) for a in self._accountants)
            self._cache[rounds] = eps if math.isfinite(eps) else math.inf
        return self._cache[rounds]
