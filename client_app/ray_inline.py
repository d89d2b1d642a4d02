"""Simulated clients' messages passed inline by Ray, not through its object store.

Flower's simulation sends each message and its Context to a Ray actor as task arguments and
gets the reply back as the task's return value. Ray inlines an argument or return value only
up to ``max_direct_call_object_size`` (100 KiB by default); anything larger is written to the
node's shared-memory object store and fetched through the raylet. The default CNN's message
is 221 kB each way, so every client turn cost two object-store round trips: at 200 clients a
round the raylet alone used 21% of a core (of 2) and the rounds took 1.47x the plain PyTorch
loop. With the limit at 4 MiB the raylet uses 0.9% and the ratio is 1.21, with the same
model (``docs/benchmarks.md``). Larger messages (above 4 MiB) still go through the store,
where their bytes, not the per-object cost, dominate.

Ray reads its system settings from ``RAY_<name>`` environment variables when it starts its
processes. Flower's simulation loads the ClientApp once in the ``flwr-simulation`` process
before it calls ``ray.init`` (``vce_api.start_vce``: "Test if ClientApp can be loaded"), so
setting the variable when this module is imported reaches the driver, the raylet and the
actors. A value the user set is kept, and so is an existing cluster's own configuration
(``RAY_ADDRESS`` set: ``docs/scaling.md``).
"""

from __future__ import annotations

import os

INLINE_LIMIT_ENV = "RAY_max_direct_call_object_size"
INLINE_LIMIT_BYTES = 4 * 1024 * 1024


def inline_messages() -> bool:
    """Raise Ray's inline limit for the Ray this process will start; False when left alone."""
    if os.environ.get("RAY_ADDRESS") or INLINE_LIMIT_ENV in os.environ:
        return False
    os.environ[INLINE_LIMIT_ENV] = str(INLINE_LIMIT_BYTES)
    return True
