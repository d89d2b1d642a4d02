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
processes. The one moment project code runs in ``flwr-simulation`` before Flower starts Ray
is while ``vce_api.start_vce`` loads the ClientApp ("Test if ClientApp can be loaded", then
``run_api`` builds the ``RayBackend``, whose ``init_ray`` calls ``ray.init``). So the
ClientApp module calls ``flower_compat.install("simulation-engine")``, and ``apply`` sets the
variable only when it finds ``start_vce`` loading it on the call stack: importing the module
anywhere else (a test, a deployment's ClientApp process) changes nothing. A value the user
set is kept, and so is an existing cluster's own configuration (``RAY_ADDRESS`` set:
``docs/scaling.md``). Guard (table entry ``ray-inline``): ``start_vce`` and
``RayBackend.init_ray`` as checked; declined, Ray's default limit.
"""

from __future__ import annotations

import os
import sys

from fedinit.flower_compat.guard import allowed

NAME = "ray-inline"
INLINE_LIMIT_ENV = "RAY_max_direct_call_object_size"
INLINE_LIMIT_BYTES = 4 * 1024 * 1024
ENGINE_MODULE = "flwr.server.superlink.fleet.vce.vce_api"


def loaded_by_engine() -> bool:
    """Whether Flower's simulation engine (``start_vce``) is on the call stack, i.e. this
    process is ``flwr-simulation`` loading the ClientApp before it starts Ray."""
    engine = sys.modules.get(ENGINE_MODULE)
    start_vce = getattr(engine, "start_vce", None)
    code = getattr(start_vce, "__code__", None)
    if code is None:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def inline_messages() -> bool:
    """Raise Ray's inline limit for the Ray this process will start; False when left alone
    (the user's value, an attached cluster)."""
    if os.environ.get("RAY_ADDRESS") or INLINE_LIMIT_ENV in os.environ:
        return False
    os.environ[INLINE_LIMIT_ENV] = str(INLINE_LIMIT_BYTES)
    return True


def apply() -> bool:
    """``inline_messages`` while Flower's engine loads the ClientApp and the guard allows;
    False (nothing changed) otherwise."""
    return loaded_by_engine() and allowed(NAME) and inline_messages()
