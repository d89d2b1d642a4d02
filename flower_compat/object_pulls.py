"""Object pulls that retry after 0.05 s instead of Flower 1.39's 1 s, applied only where known.

A receiver learns of a message before all its arrays are on the SuperLink: the sender pushes
the message, then its objects. Flower's ``pull_objects`` retries an object that is not there
yet after 1 s (then 2, 4, ... up to 10 s). So a SuperNode that pulls a round's message at
once waits a whole second for arrays that arrive milliseconds later (measured: a node's
"Receiving" to "Received successfully" took 1.1-1.4 s in every round, 3 nodes), and the
ServerApp's pulls of replies can wait the same. Neither caller lets us choose. We give the
two calling modules (the SuperNode loop, the deployment grid) a ``pull_objects`` whose first
retry comes after ``INITIAL_BACKOFF``; the backoff still doubles up to Flower's cap, so the
number of tries and the total time before giving up stay about Flower's.

Guard (table entry ``object-pulls``): ``pull_objects`` and both callers' functions as
checked; besides, each module must still hold Flower's ``pull_objects`` as a global (what is
replaced). Declined: Flower's own pulls.
"""

from __future__ import annotations

import functools
import importlib
from logging import INFO, WARNING

from flower_compat.guard import allowed

NAME = "object-pulls"
INITIAL_BACKOFF = 0.05
"""Seconds before the first retry of an object that is not on the SuperLink yet."""
SUPERNODE = "flwr.supernode.start_client_internal"
SERVERAPP = "flwr.superlink.grid.http_grid"


def apply(module_name: str) -> bool:
    """Make ``module_name``'s object pulls retry first after ``INITIAL_BACKOFF`` seconds."""
    from flwr.supercore import log
    from flwr.supercore.inflatable import inflatable_utils

    current = getattr(importlib.import_module(module_name), "pull_objects", None)
    if isinstance(current, functools.partial) and current.func is inflatable_utils.pull_objects:
        return True  # installed already (a second run in the same process)
    if not allowed(NAME):
        return False
    if current is not inflatable_utils.pull_objects:
        log(WARNING, "flower_compat: %s not applied in %s (its pull_objects is not Flower's)",
            NAME, module_name)
        return False
    module = importlib.import_module(module_name)
    module.pull_objects = functools.partial(  # type: ignore[attr-defined]
        inflatable_utils.pull_objects, initial_backoff=INITIAL_BACKOFF)
    log(INFO, "object pulls in %s retry after %g s", module_name.rsplit(".", 1)[-1],
        INITIAL_BACKOFF)
    return True
