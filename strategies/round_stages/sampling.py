"""Stage 1, who is asked: a seeded sample of client ids (``fedinit.methods.sampling``)."""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Collection
from logging import WARNING

from flwr.common.logger import log

from fedinit.methods.sampling import sample_available, sample_registered

SEED_ENV = "FEDINIT_DP_SAMPLING_SEED"
"""For tests only: an integer here, in the ServerApp's environment, fixes the secret DP
sampling seed, so that a test can run two fleets whose samples differ in a known way. The
environment is the operator's, who sees every sample anyway; no run config or file names it."""


def secret_seed() -> int:
    """The DP sampler's seed: 63 bits of OS entropy, never written anywhere; ``SEED_ENV``
    when set (logged, without its value)."""
    fixed = os.environ.get(SEED_ENV, "").strip()
    if not fixed:
        return secrets.randbits(63)
    if not fixed.isdigit():
        raise ValueError(f"{SEED_ENV}={fixed!r}: a non-negative integer, or unset (the "
                         "default: a fresh secret seed per run)")
    log(WARNING, "dp: the secret sampling seed is fixed by %s in the server's environment "
        "(for tests: runs with the same value draw the same samples)", SEED_ENV)
    return int(fixed)


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
