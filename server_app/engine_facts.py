"""What the ServerApp can learn from Flower's simulation engine without asking the clients.

In flwr 1.39 the engine (``flwr/simulation/run_simulation.py`` ``_main_loop``) hands the
ServerApp an ``InMemoryGrid`` over the in-memory LinkState in which it then registers the
simulated nodes (``flwr/server/superlink/fleet/vce/vce_api.py`` ``_register_nodes``): the
i-th node created gets ``partition-id`` i. The LinkState keeps its nodes in a dict, so its
node list is in that order. A deployment's Grid is never an ``InMemoryGrid``, which makes the
Grid the one reliable sign of a simulation: a simulated node's node config can look exactly
like a deployed one's.
"""

from __future__ import annotations

from pathlib import Path

from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

from fedinit.config import RunConfig, check_writable
from fedinit.store.simulated_state import STATE_ROOT, state_root


def in_simulation(grid: Grid) -> bool:
    """Whether ``grid`` is Flower's simulation engine (its in-memory Grid)."""
    return isinstance(grid, InMemoryGrid)


def nodes_in_registration_order(grid: InMemoryGrid) -> list[int]:
    """The connected simulated nodes' ids, in the order the engine registered them, which is
    their partition-id order."""
    online = set(grid.get_node_ids())
    return [info.node_id for info in grid.state.get_node_info() if info.node_id in online]


def client_state_entry(grid: Grid, cfg: RunConfig, run_dir: Path) -> dict[str, str]:
    """The train-message entry telling simulated clients where their state lives: {} in a
    deployment or with ``simulation-client-state=memory`` (Flower's ``context.state``)."""
    if not in_simulation(grid) or cfg.fleet.simulation_client_state != "disk":
        return {}
    root = state_root(cfg.fleet.client_state_dir, run_dir)
    check_writable("client-state-dir" if cfg.fleet.client_state_dir else "output-dir", root)
    return {STATE_ROOT: str(root)}
