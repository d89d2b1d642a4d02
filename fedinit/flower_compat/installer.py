"""One install per process kind: every patch of that kind in the table, each behind its guard.

Nothing is patched by importing any project module; a process kind's patches are applied by
calling ``install`` in that process, at the point where they take effect:

- ``simulation-engine``: from the ClientApp module (``client_app/app.py``), which Flower's
  ``flwr-simulation`` imports while it loads the ClientApp, before it starts Ray; the patch
  acts only when it finds Flower's engine loading it (``ray_inline.loaded_by_engine``);
- ``serverapp``: from the ServerApp's ``main`` with the grid Flower gave it; it returns the
  grid to run on (``sim-window`` / ``reply-poll`` wrap it; ``fast-dispatch`` patches the
  simulation's LinkState; ``object-pulls`` the deployment grid's pulls);
- ``supernode``: from ``fedinit.node.launch`` before it starts ``flower-supernode`` in its process,
  always the reply order (``reply-order``), with the node's waits (``supernode-waits``;
  ``object-pulls`` for the node's message pulls) and, where the device has an approved-apps
  list, its check (``app-allowlist``).
  The executor choice (``warm-executor``) is made there too, by ``warm_executor.usable``.

The ``launcher`` entries (``app-source``, ``offline-env``, ``ray-loopback``) are functions the
commands (``fedinit/cli/``) call when they start Flower (``app_source.staged_app``,
``offline_env.offline`` and ``offline_env.loopback``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedinit.flower_compat.registry import KINDS


@dataclass
class Installed:
    """What ``install`` applied in this process, and the grid to run on (ServerApp)."""

    applied: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)
    grid: Any = None

    def note(self, name: str, done: bool) -> None:
        (self.applied if done else self.declined).append(name)


def install(kind: str, *, grid: Any = None, simulation: bool = False,
            poll: Any = None, allowlist: Any = None) -> Installed:
    """Apply the patches of process ``kind`` (``KINDS``); each declines on its own.

    ``serverapp``: ``grid`` (Flower's) and whether it is the simulation's; ``supernode``:
    ``reply-order`` always; ``poll``, a ``supernode_waits.AdaptivePoll`` (None: Flower's
    waits), and ``allowlist``, the device's ``fedinit.node.app_allowlist.Allowlist`` (None:
    none)."""
    if kind not in KINDS or kind == "launcher":
        raise ValueError(f"install: kind {kind!r} is not allowed; allowed: "
                         f"{', '.join(k for k in KINDS if k != 'launcher')}")
    done = Installed(grid=grid)
    if kind == "simulation-engine":
        from fedinit.flower_compat import ray_inline

        done.note(ray_inline.NAME, ray_inline.apply())
    elif kind == "serverapp":
        if grid is None:
            raise ValueError("install('serverapp') needs grid=, the grid Flower gave main()")
        if simulation:
            from fedinit.flower_compat import fast_dispatch, sim_window

            done.note(fast_dispatch.NAME, fast_dispatch.apply(grid.state))
            done.grid = sim_window.wrap(grid)
            done.note(sim_window.NAME, done.grid is not grid)
        else:
            from fedinit.flower_compat import object_pulls, reply_poll

            done.note(object_pulls.NAME, object_pulls.apply(object_pulls.SERVERAPP))
            done.grid = reply_poll.wrap(grid)
            done.note(reply_poll.NAME, done.grid is not grid)
    else:
        from fedinit.flower_compat import app_allowlist, object_pulls, reply_order, supernode_waits

        done.note(reply_order.NAME, reply_order.apply())
        if poll is not None:
            done.note(object_pulls.NAME, object_pulls.apply(object_pulls.SUPERNODE))
            done.note(supernode_waits.NAME, supernode_waits.apply(poll))
        if allowlist is not None:
            done.note(app_allowlist.NAME, app_allowlist.apply(allowlist))
    return done
