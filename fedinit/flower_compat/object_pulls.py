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

A pull also gives up when the caller's deadline passes (``pulls_until``), not after Flower's
two hours (``PULL_MAX_TIME`` 7200 s, 500 tries): a node killed while it pushed its reply
leaves the reply registered with some of its arrays missing for good, and the ServerApp's
pull of that reply held the round (and the run) for as long. ``FastPollGrid`` pulls a
round's replies until the round's timeout, and the asynchronous loop each pull until its
round-timeout: a reply whose arrays do not all arrive by then is Flower's own error reply
for a missing object (the round counts it, as any failed reply). Without a deadline (the
SuperNode's pulls, a caller that sets none) Flower's limits stay.

Guard (table entry ``object-pulls``): ``pull_objects`` and both callers' functions as
checked; besides, each module must still hold Flower's ``pull_objects`` as a global (what is
replaced). Declined: Flower's own pulls, with Flower's limits.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from logging import INFO, WARNING
from typing import Any

from fedinit.flower_compat.guard import allowed

NAME = "object-pulls"
INITIAL_BACKOFF = 0.05
"""Seconds before the first retry of an object that is not on the SuperLink yet."""
SUPERNODE = "flwr.supernode.start_client_internal"
SERVERAPP = "flwr.superlink.grid.http_grid"
_DEADLINE: ContextVar[float | None] = ContextVar("object_pull_deadline", default=None)
"""time.monotonic() by which the current caller's pulls give up (None: Flower's limits)."""


@contextmanager
def pulls_until(deadline: float | None) -> Iterator[None]:
    """Object pulls made inside give up once ``time.monotonic()`` passes ``deadline`` (an
    object already there is still fetched); None leaves Flower's limits."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def pull_objects(object_ids: list[str], pull_object_fn: Callable[[str], bytes],
                 **kwargs: Any) -> dict[str, bytes]:
    """Flower's ``pull_objects`` with a first retry after ``INITIAL_BACKOFF`` and, inside
    ``pulls_until``, at most the time left to the caller's deadline."""
    from flwr.supercore.inflatable import inflatable_utils

    kwargs.setdefault("initial_backoff", INITIAL_BACKOFF)
    deadline = _DEADLINE.get()
    if deadline is not None:
        left = max(0.0, deadline - time.monotonic())
        kwargs["max_time"] = min(left, kwargs.get("max_time") or left)
    return inflatable_utils.pull_objects(object_ids, pull_object_fn, **kwargs)


def apply(module_name: str) -> bool:
    """Make ``module_name``'s object pulls retry first after ``INITIAL_BACKOFF`` seconds."""
    from flwr.supercore import log
    from flwr.supercore.inflatable import inflatable_utils

    current = getattr(importlib.import_module(module_name), "pull_objects", None)
    if current is pull_objects:
        return True  # installed already (a second run in the same process)
    if not allowed(NAME):
        return False
    if current is not inflatable_utils.pull_objects:
        log(WARNING, "flower_compat: %s not applied in %s (its pull_objects is not Flower's)",
            NAME, module_name)
        return False
    module = importlib.import_module(module_name)
    module.pull_objects = pull_objects  # type: ignore[attr-defined]
    log(INFO, "object pulls in %s retry after %g s (and stop at the caller's deadline)",
        module_name.rsplit(".", 1)[-1], INITIAL_BACKOFF)
    return True
