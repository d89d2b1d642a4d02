"""The K each candidate rule picks from the silhouettes a ``num-clusters=0`` run recorded.

    .venv/bin/python -m fedinit.scripts.k_rules RUN_DIR [RUN_DIR ...]

Reads each run's warm-up line of ``clusters.jsonl`` (every k's silhouette; every k's assignment
in ``tried`` where the run recorded it) and prints, per rule, the K picked and, where the run
has ``regimes.csv`` and ``tried``, the purity at the warm-up round of that K's clusters over the
clients trained by then (K = 1: the share of the largest regime). No training: a rule for K is
judged on the same k-means clusterings the run made.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from fedinit.config import RunConfig
from fedinit.methods.clustered import CLUSTERS_FILE
from fedinit.methods.sampling import sample_clients
from fedinit.scripts.cluster_purity import purity
from fedinit.scripts.run_dirs import run_dirs
from server_app.regime_files import read_regimes

Rule = Callable[[dict[int, float]], int]


def argmax_rule(floor: float) -> Rule:
    """The k of the best score (ties: smaller k), or 1 below ``floor`` (the current rule at 0.2)."""
    def pick(s: dict[int, float]) -> int:
        best = max(s.values(), default=-1.0)
        return min(k for k, v in s.items() if v == best) if best >= floor else 1
    return pick


def within_rule(floor: float, tol: float) -> Rule:
    """The largest k scoring at least (1 - ``tol``) x the best, or 1 when the best is below
    ``floor``."""
    def pick(s: dict[int, float]) -> int:
        best = max(s.values(), default=-1.0)
        return max(k for k, v in s.items() if v >= (1 - tol) * best) if best >= floor else 1
    return pick


RULES: dict[str, Rule] = {
    "max>=0.2 (current)": argmax_rule(0.2),
    "max>=0.4": argmax_rule(0.4),
    "max>=0.45": argmax_rule(0.45),
    "5%>=0.2": within_rule(0.2, 0.05),
    "5%>=0.4": within_rule(0.4, 0.05),
    "5%>=0.45": within_rule(0.45, 0.05),
    "10%>=0.45": within_rule(0.45, 0.10),
}


def warmup_line(run_dir: Path) -> dict | None:
    """The ``clusters.jsonl`` line where the warm-up chose K, or None."""
    path = run_dir / CLUSTERS_FILE
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        if "silhouette" in row:
            return row
    return None


def warmup_purity(run_dir: Path, row: dict, k: int) -> float | None:
    """Purity at the warm-up round of k's clusters over the clients trained by then."""
    regimes = read_regimes(run_dir)
    tried = dict(row.get("tried", {}))
    tried.setdefault(str(row["num-clusters"]), row["assignment"])
    if not regimes or (k > 1 and str(k) not in tried):
        return None
    cfg = RunConfig.parse(json.loads((run_dir / "config.json").read_text()))
    trained: set[int] = set()
    for rnd in range(1, int(row["round"]) + 1):
        trained |= set(sample_clients(cfg.seed, rnd, cfg.num_clients, cfg.clients_per_round))
    assignment = [int(a) for a in tried[str(k)]] if k > 1 else [0] * cfg.num_clients
    return purity(assignment, regimes, trained)


def main() -> None:
    runs = run_dirs(__doc__, what="run directories (config.json, clusters.jsonl)")
    print("| run | silhouette by k | " + " | ".join(RULES) + " |")
    print("|---|---|" + "---:|" * len(RULES))
    for run in runs:
        row = warmup_line(run)
        if row is None:
            print(f"| {run.name} | no warm-up line |")
            continue
        s = {int(k): float(v) for k, v in row["silhouette"].items()}
        cells = []
        for rule in RULES.values():
            k = rule(s)
            p = warmup_purity(run, row, k)
            cells.append(f"{k}" + ("" if p is None else f" ({100 * p:.0f}%)"))
        sil = " ".join(f"{v:.2f}" for _, v in sorted(s.items()))
        print(f"| {run.name} | {sil} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
