"""Cluster purity by round of clustered-FL runs on data with regimes.

    .venv/bin/python -m fedinit.scripts.cluster_purity RUN_DIR [RUN_DIR ...]

For each run directory (``config.json``, ``clusters.jsonl``, ``regimes.csv``) and each round:
the clients that have trained by then (the run's seeded sampling, ``fedinit.methods.sampling``),
their clusters (the last ``clusters.jsonl`` line at or before the round; cluster 0 before any), and
the purity: the share of those clients that sit with their cluster's majority regime (1.0:
every cluster holds one regime; 1 / #regimes or so: no better than chance for balanced
regimes). Also the number of clusters in use and how many hold more than one regime.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from fedinit.config import RunConfig
from fedinit.methods.clustered import CLUSTERS_FILE
from fedinit.methods.sampling import sample_clients
from fedinit.scripts.run_dirs import run_dirs
from server_app.regime_files import read_regimes


def purity(assignment: list[int], regimes: dict[int, int], clients: set[int]) -> float:
    """Share of ``clients`` in their cluster's majority regime."""
    by_cluster: dict[int, Counter[int]] = {}
    for cid in clients:
        by_cluster.setdefault(assignment[cid], Counter())[regimes[cid]] += 1
    kept = sum(c.most_common(1)[0][1] for c in by_cluster.values())
    return kept / max(len(clients), 1)


def by_round(run_dir: Path) -> list[dict[str, float]]:
    """One row per round: round, trained clients, purity, clusters used, mixed clusters."""
    cfg = RunConfig.parse(json.loads((run_dir / "config.json").read_text()))
    regimes = read_regimes(run_dir)
    if not regimes:
        raise SystemExit(f"{run_dir}: no regimes.csv (a run without num-regimes)")
    changes = {}
    path = run_dir / CLUSTERS_FILE
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            changes[int(row["round"])] = [int(a) for a in row["assignment"]]
    assignment = [0] * cfg.num_clients
    trained: set[int] = set()
    rows = []
    for rnd in range(1, cfg.train.num_server_rounds + 1):
        trained |= set(sample_clients(cfg.seed, rnd, cfg.num_clients, cfg.clients_per_round))
        assignment = changes.get(rnd, assignment)
        used: dict[int, set[int]] = {}
        for cid in trained:
            used.setdefault(assignment[cid], set()).add(regimes[cid])
        rows.append({"round": rnd, "trained": len(trained),
                     "purity": purity(assignment, regimes, trained),
                     "clusters": len(used), "mixed": sum(len(r) > 1 for r in used.values())})
    return rows


def main() -> None:
    for run in run_dirs(__doc__):
        print(run.name)
        print("round trained purity clusters mixed")
        for r in by_round(run):
            print(f"{r['round']:>5} {r['trained']:>7} {r['purity']:>6.2f} {r['clusters']:>8} "
                  f"{r['mixed']:>5}")


if __name__ == "__main__":
    main()
