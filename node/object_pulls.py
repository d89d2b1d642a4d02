"""Object pulls that retry after 0.05 s instead of Flower 1.39's 1 s, applied only where known.

A receiver learns of a message before all its arrays are on the SuperLink: the sender pushes
the message, then its objects. Flower's ``pull_objects`` retries an object that is not there
yet after 1 s (then 2, 4, ... up to 10 s). So a SuperNode that pulls a round's message at
once waits a whole second for arrays that arrive milliseconds later (measured: a node's
"Receiving" to "Received successfully" took 1.1-1.4 s in every round, 3 nodes), and the
ServerApp's pulls of replies can wait the same. Neither caller lets us choose. We give the
two calling modules (the SuperNode loop, the deployment grid) a ``pull_objects`` whose first
retry comes after ``INITIAL_BACKOFF``; the backoff still doubles up to Flower's cap, so the
number of tries and the total time before giving up stay about Flower's. The guard is
``node.fast_poll``'s: only the checked flwr version, only when each module still calls
``pull_objects`` and the function still takes ``initial_backoff``; else Flower's own pulls,
with a warning.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from logging import INFO, WARNING

CHECKED_FLWR = "1.39.0"
INITIAL_BACKOFF = 0.05
"""Seconds before the first retry of an object that is not on the SuperLink yet."""
SUPERNODE = "flwr.supernode.start_client_internal"
SERVERAPP = "flwr.superlink.grid.http_grid"


def why_not_patchable(module_name: str) -> str | None:
    """None when ``module_name`` calls the checked ``pull_objects``; else the reason."""
    import flwr
    from flwr.supercore.inflatable import inflatable_utils

    if flwr.__version__ != CHECKED_FLWR:
        return f"flwr {flwr.__version__} is not the checked {CHECKED_FLWR}"
    module = importlib.import_module(module_name)
    if "initial_backoff" not in inspect.signature(inflatable_utils.pull_objects).parameters:
        return "pull_objects no longer takes initial_backoff"
    if (getattr(module, "pull_objects", None) is not inflatable_utils.pull_objects
            or "pull_objects(" not in inspect.getsource(module)):
        return f"{module_name} no longer calls inflatable_utils.pull_objects"
    return None


def install(module_name: str) -> bool:
    """Make ``module_name``'s object pulls retry first after ``INITIAL_BACKOFF`` seconds."""
    from flwr.supercore import log
    from flwr.supercore.inflatable import inflatable_utils

    current = getattr(importlib.import_module(module_name), "pull_objects", None)
    if isinstance(current, functools.partial) and current.func is inflatable_utils.pull_objects:
        return True  # installed already (a second run in the same process)
    reason = why_not_patchable(module_name)
    if reason is not None:
        log(WARNING, "fast object pulls not applied (%s); Flower's 1 s retry stays", reason)
        return False
    module = importlib.import_module(module_name)
    module.pull_objects = functools.partial(  # type: ignore[attr-defined]
        inflatable_utils.pull_objects, initial_backoff=INITIAL_BACKOFF)
    log(INFO, "object pulls in %s retry after %g s", module_name.rsplit(".", 1)[-1],
        INITIAL_BACKOFF)
    return True
