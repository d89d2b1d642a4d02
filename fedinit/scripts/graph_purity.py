"""How many of a FedRelax run's graph edges join clients of the same regime.

    .venv/bin/python -m fedinit.scripts.graph_purity RUN_DIR [RUN_DIR ...]

For each run directory (``graph.json``: the last graph in use; ``regimes.csv``): the graph's
source, the round it was built after, its edges, the edges inside one regime, and the clients
that have no edge. With 4 balanced regimes about a quarter of random edges would be inside one.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedinit.methods.fedrelax import GRAPH_FILE
from fedinit.scripts.run_dirs import print_reports
from server_app.regime_files import read_regimes


def inside(edges: list[list[float]], regimes: dict[int, int]) -> int:
    """The number of edges [i, j, A_ij] whose two ends are in the same regime."""
    return sum(regimes[int(i)] == regimes[int(j)] for i, j, _ in edges)


def row(run_dir: Path) -> str:
    """One line for ``run_dir``; ValueError naming a missing file."""
    regimes = read_regimes(run_dir)
    path = run_dir / GRAPH_FILE
    if not regimes or not path.is_file():
        raise ValueError(f"{run_dir}: needs {GRAPH_FILE} and regimes.csv (a FedRelax run on "
                         "data with regimes)")
    graph = json.loads(path.read_text())
    edges = graph["edges"]
    linked = {int(e) for i, j, _ in edges for e in (i, j)}
    alone = sorted(set(regimes) - linked)
    return (f"{run_dir.name}: graph={graph['source']} after round {graph['round']}: "
            f"{inside(edges, regimes)} of {len(edges)} edges inside one regime; "
            f"{len(alone)} clients without an edge")


def main(argv: list[str] | None = None) -> int:
    return print_reports(__doc__, argv, row)


if __name__ == "__main__":
    raise SystemExit(main())
