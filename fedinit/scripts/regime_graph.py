"""The given graph of a regimes data set, as an edge file for FedRelax: clients of the same
regime are joined (weight ``--weight``), clients of different regimes are not.

    .venv/bin/python -m fedinit.scripts.regime_graph --out graph.txt \
        num-clients=50 num-regimes=4 seed=0
    .venv/bin/python -m fedinit.scripts.regime_graph --out graph.txt --run-dir RUN  # regimes.csv

The regimes come from a finished run's ``regimes.csv`` or, computed the way every client
computes them, from run-config overrides ``key=value`` (the assignment depends only on
num-clients, num-regimes and seed). The file: ``#`` comment lines, then one edge per line,
``i j weight`` (partition ids i < j, a positive weight), each undirected edge once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedinit.cli.simulate import parse_overrides
from fedinit.config import ConfigError, RunConfig
from fedinit.store.files import atomic_write_text
from fedinit.task.regimes import client_regimes, same_regime_edges
from server_app.regime_files import REGIMES_FILE, read_regimes


def format_edges(edges: list[tuple[int, int, float]], comment: str) -> str:
    """The edge file's text: a comment header, then ``i j weight`` per line."""
    head = f"# {comment}\n# i j weight (partition ids, undirected, each edge once)\n"
    return head + "".join(f"{i} {j} {w:g}\n" for i, j, w in edges)


def read_edges(path: Path) -> list[tuple[int, int, float]]:
    """The edges of an edge file (comments and blank lines skipped); ValueError naming the
    line that is not ``i j weight``."""
    edges = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        try:
            if len(parts) != 3:
                raise ValueError
            edges.append((int(parts[0]), int(parts[1]), float(parts[2])))
        except ValueError:
            raise ValueError(f"{path}:{number}: {line!r} is not 'i j weight'") from None
    return edges


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--run-dir", type=Path, help=f"read the regimes from RUN/{REGIMES_FILE}")
    ap.add_argument("--out", type=Path, required=True, help="the edge file to write")
    ap.add_argument("--weight", type=float, default=1.0, help="every edge's weight (> 0)")
    args = ap.parse_args(argv)
    try:
        if args.run_dir is not None:
            by_client = read_regimes(args.run_dir)
            if not by_client:
                raise ValueError(f"{args.run_dir / REGIMES_FILE} is missing: the run had "
                                 "num-regimes=0")
            regimes = [by_client[p] for p in sorted(by_client)]
            source = f"regimes of {args.run_dir}"
        else:
            cfg = RunConfig.parse(parse_overrides(args.overrides))
            if cfg.data.num_regimes == 0:
                raise ValueError("num-regimes=0 has no regimes; give num-regimes=R (R >= 1)")
            regimes = [int(r) for r in
                       client_regimes(cfg.num_clients, cfg.data.num_regimes, cfg.seed)]
            source = (f"num-clients={cfg.num_clients} num-regimes={cfg.data.num_regimes} "
                      f"seed={cfg.seed}")
        edges = same_regime_edges(regimes, args.weight)
    except (ConfigError, ValueError) as err:
        print(f"regime_graph: {err}", file=sys.stderr)
        return 2
    atomic_write_text(args.out, format_edges(edges, f"same-regime graph, {source}"))
    print(f"{args.out}: {len(edges)} edges among {len(regimes)} clients")
    return 0


if __name__ == "__main__":
    sys.exit(main())
