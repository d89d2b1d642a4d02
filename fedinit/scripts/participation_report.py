"""How often each client trained in a run, and how its own model scored by that count: the
measurement behind a personal model that is under-trained at low participation (FedRelax's
w^(i), Ditto's v_i, a client's last local model), docs/reproduction.md 6b.

    .venv/bin/python -m fedinit.scripts.participation_report RUN_DIR [RUN_DIR ...]

Per run directory: the participations per client (``clients-trained`` of ``rounds.jsonl``,
rounds up to the last personalized evaluation), their min / mean / max, and the mean of each
kind's accuracy (global, fine-tuned, own: ``personal_clients.csv``'s last evaluation) over
the clients that trained that many times. A client never sampled counts 0.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

from fedinit.scripts.run_dirs import print_reports
from server_app.results import read_personal_clients
from strategies.personal_summary import KINDS


def participations(run_dir: Path, up_to: int) -> Counter[int]:
    """Client id -> the rounds <= ``up_to`` it trained in (its reply came back)."""
    counts: Counter[int] = Counter()
    with (run_dir / "rounds.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            if int(row["round"]) <= up_to:
                counts.update(int(c) for c in row.get("clients-trained") or [])
    return counts


def by_participation(run_dir: Path) -> tuple[Counter[int], dict[int, dict[str, float]]]:
    """(participations per evaluated client, count -> kind -> mean accuracy in %) at the last
    personalized evaluation; ValueError when the run has none."""
    rows = read_personal_clients(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}: no personal_clients.csv (run with personal-eval-every "
                         "> 0)")
    last = max(int(r["round"]) for r in rows)
    rows = [r for r in rows if int(r["round"]) == last]
    trained = participations(run_dir, last)
    counts = Counter({int(r["partition-id"]): trained[int(r["partition-id"])] for r in rows})
    groups: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for kind in KINDS:
            value = r.get(f"acc-{kind}")
            if value not in (None, ""):
                groups[counts[int(r["partition-id"])]][kind].append(100 * float(value))
    means = {n: {k: math.fsum(v) / len(v) for k, v in kinds.items()}
             for n, kinds in sorted(groups.items())}
    return counts, means


def report(run_dir: Path) -> str:
    """A few lines for one run."""
    counts, means = by_participation(run_dir)
    values = list(counts.values())
    head = (f"{run_dir.name}: {len(values)} clients trained {min(values)} / "
            f"{math.fsum(values) / len(values):.1f} / {max(values)} times (min / mean / max)")
    lines = [head, "  times | clients | " + " | ".join(KINDS)]
    tally = Counter(values)
    for n, kinds in means.items():
        accs = " | ".join(f"{kinds[k]:.1f}" if k in kinds else "-" for k in KINDS)
        lines.append(f"  {n} | {tally[n]} | {accs}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return print_reports(__doc__, argv, report)


if __name__ == "__main__":
    raise SystemExit(main())
