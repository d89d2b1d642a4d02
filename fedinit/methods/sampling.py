"""Seeded client sampling by client id, so a simulation and a deployment pick alike."""

from collections.abc import Collection

import numpy as np

REPLACEMENT_STREAM = 0x5EED
"""Third word of the generator seed of the draw that replaces absent clients: a stream of its
own, so the first draw (``sample_clients``) stays exactly today's."""


def sample_clients(seed: int, server_round: int, num_clients: int, per_round: int) -> list[int]:
    """Partition ids of the clients trained in ``server_round`` (sorted, no repeats).

    The generator is seeded by (seed, round) alone, so the choice does not depend on node ids,
    on earlier rounds, or on anything else a restart could change.
    """
    rng = np.random.default_rng([seed, server_round])
    return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))


def sample_available(seed: int, server_round: int, num_clients: int, per_round: int,
                     available: Collection[int]) -> list[int]:
    """``sample_clients``' choice with its absent members replaced by available clients.

    With every client available this is ``sample_clients`` exactly (simulation and deployment
    agree bit for bit). Otherwise the chosen clients that are available stay, and a second
    draw seeded by (seed, round, REPLACEMENT_STREAM) picks as many of the other available
    clients as are missing: ``per_round`` clients when that many are available, else all.
    """
    chosen = sample_clients(seed, server_round, num_clients, per_round)
    online = set(available)
    kept = [c for c in chosen if c in online]
    if len(kept) == len(chosen):
        return chosen
    spare = sorted(online - set(chosen))
    need = min(len(chosen) - len(kept), len(spare))
    if need == 0:
        return kept
    rng = np.random.default_rng([seed, server_round, REPLACEMENT_STREAM])
    extra = rng.choice(len(spare), size=need, replace=False)
    return sorted(kept + [spare[int(i)] for i in extra])


def sample_registered(seed: int, server_round: int, num_clients: int, per_round: int,
                      available: Collection[int]) -> tuple[list[int], list[int]]:
    """(sampled, present): ``sample_clients``' m of ALL N registered clients, and those of
    them that are available now (the only ones messaged).

    Under DP the accountant's rate m / N holds only if every client is sampled with that
    probability whatever is connected: an absent client is a missing reply (it costs the round
    a contribution, not privacy), never replaced by another. Replacing it, as
    ``sample_available`` does, raises each connected client's rate to m / |A|.
    """
    sampled = sample_clients(seed, server_round, num_clients, per_round)
    online = set(available)
    return sampled, [c for c in sampled if c in online]
