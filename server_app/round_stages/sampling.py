"""Stage 1, who is asked: a seeded sample of client ids (``methods.sampling``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from methods.sampling import sample_available, sample_registered


@dataclasses.dataclass(frozen=True)
class Sample:
    """This round's sample: how many were drawn and which of them are messaged."""

    sampled: int
    messaged: list[int]


@dataclasses.dataclass
class AvailableSampler:
    """m clients among the connected ones: absent members replaced (``sample_available``)."""

    seed: int
    num_clients: int
    per_round: int

    def __call__(self, server_round: int, available: Collection[int]) -> Sample:
        chosen = sample_available(self.seed, server_round, self.num_clients, self.per_round,
                                  available)
        return Sample(len(chosen), chosen)


@dataclasses.dataclass
class RegisteredSampler:
    """Under DP: m of ALL N registered clients (``sample_registered``), the absent ones left
    out and counted missing, so each client's inclusion rate is the accountant's m / N
    whoever is connected (docs/algorithms.md, DP). ``seed`` is secret: amplification by
    sampling holds only if who was sampled is unknown, and the run's seed is public."""

    seed: int
    num_clients: int
    per_round: int

    def __call__(self, server_round: int, available: Collection[int]) -> Sample:
        sampled, present = sample_registered(self.seed, server_round, self.num_clients,
                                             self.per_round, available)
        return Sample(len(sampled), present)


Sampler = AvailableSampler | RegisteredSampler
