"""The environment switches the project sets for every Flower process it starts.

``offline-env``: Flower's runtime dependency installation (on by default on the SuperLink),
telemetry and update check would try the internet; their documented variables turn them
off. ``ray-loopback``: Ray, which the simulation starts, takes the machine's network address
as its node address and then listens on all interfaces (gcs_server, raylet, object manager,
workers), unauthenticated; unless the user attaches to a cluster on purpose (``RAY_ADDRESS``
set), Ray is told this is a one-machine setup, so every Ray service binds 127.0.0.1
(``ray._private.services.get_node_ip_address``). Guards (table entries of those names): the
sources that read the variables, as checked; declined, the variables are not set.
"""

from __future__ import annotations

from fedinit.flower_compat.guard import allowed

OFFLINE = "offline-env"
LOOPBACK = "ray-loopback"
OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}
RAY_SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for multi-machine clusters (ray_constants.ENABLE_RAY_CLUSTER); "0" makes its
node address loopback, so its services listen on 127.0.0.1 only."""


def offline(env: dict[str, str]) -> dict[str, str]:
    """``env`` with Flower's and Ray's offline switches, when the guard allows."""
    if allowed(OFFLINE):
        env.update(OFFLINE_ENV)
    return env


def loopback(env: dict[str, str]) -> dict[str, str]:
    """``env`` with Ray kept on 127.0.0.1, when the guard allows (the caller's RAY_ADDRESS,
    or its own RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, keeps Ray as the caller set it)."""
    if not env.get("RAY_ADDRESS") and allowed(LOOPBACK):
        env.setdefault(RAY_SINGLE_MACHINE, "0")
    return env
