"""Where a client keeps its state on disk: a device's own ``state-dir``, never a server's path.

A device (a SuperNode's ClientApp) keeps its state in its node config's ``state-dir`` only.
A directory the server names (the simulation's ``client-state-root`` in the message, the run
config's ``client-state-dir``) is used only by a client the server itself hosts: one run by
Flower's simulation engine or by this project's in-process grid (``fedinit/cli/inprocess_grid.py``),
both on the server's own machine. A device told such a directory refuses the task. The
server's ``experiment-id`` names one plain directory inside the chosen root
(``fedinit.store.path_names``), and no path of the client's leads outside it (``StateDir.check``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedinit.config import RunConfig
from fedinit.store.path_names import PathError
from fedinit.store.simulated_state import STATE_ROOT
from fedinit.store.state_dir import StateDir

HOSTS = (("flwr.simulation.ray_transport.ray_actor", "VirtualClientEngineActor.run"),
         ("flwr.server.superlink.fleet.vce.vce_api", "worker"),
         ("fedinit.cli.inprocess_grid", "InProcessGrid.send_and_receive"))
"""(module, function) of each caller that runs a ClientApp on the server's machine: Flower's
simulation engine (its Ray actor; its worker loop, which calls a backend in its own process)
and the in-process grid."""


def server_hosted() -> bool:
    """Whether a host of ``HOSTS`` is on this call's stack: the code it runs is compared,
    so neither a message nor an imported module makes a device look hosted."""
    codes = set()
    for module, name in HOSTS:
        func: Any = sys.modules.get(module)
        for part in name.split("."):
            func = getattr(func, part, None)
        code = getattr(func, "__code__", None)
        if code is not None:
            codes.add(code)
    frame = sys._getframe(1) if codes else None
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def state_dir_of(node_config: Mapping[str, Any], cfg: RunConfig, experiment: str, cid: int,
                 sim_root: str = "") -> StateDir | None:
    """This client's state directory, checked (``StateDir.check``), or None (no disk state:
    no root, or the server names no experiment). PathError, before any work, when a
    device is told a server's directory or a name or path would leave its root."""
    node_root = str(node_config.get("state-dir", ""))
    told = sim_root or (cfg.fleet.client_state_dir and not node_root)  # a server's place
    if told and not server_hosted():  # the stack is walked only when the server names one
        if sim_root:
            raise PathError(f"{STATE_ROOT}={sim_root!r} names a place on this device; "
                            "allowed: only a simulated client takes its state directory "
                            "from the server (a device uses its node config's state-dir)")
        if cfg.fleet.client_state_dir and not node_root:
            raise PathError(f"run config client-state-dir={cfg.fleet.client_state_dir!r} "
                            "names a place on this device; allowed: '' (a device keeps its "
                            "state in its node config's state-dir, else in memory)")
    if sim_root and experiment and not node_root:
        disk = StateDir(Path(sim_root), experiment, cid, sync=False)
    else:
        root = node_root or cfg.fleet.client_state_dir
        disk = StateDir(Path(root), experiment, cid) if root and experiment else None
    if disk is not None:
        disk.check()
    return disk
