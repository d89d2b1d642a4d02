"""Seeded client sampling by partition id, so a simulation and a deployment pick alike."""

import numpy as np


def sample_clients(seed: int, server_round: int, num_clients: int, per_round: int) -> list[int]:
    """Partition ids of the clients trained in ``server_round`` (sorted, no repeats).

    The generator is seeded by (seed, round) alone, so the choice does not depend on node ids,
    on earlier rounds, or on anything else a restart could change.
    """
    rng = np.random.default_rng([seed, server_round])
    return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))
