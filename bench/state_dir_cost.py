"""One client participation's state-file cost against the number of clients, both layouts.

    .venv/bin/python -m bench.state_dir_cost                     # 100, 1000, 10000 clients
    .venv/bin/python -m bench.state_dir_cost --clients 100 20000 --repeats 200

A participation reads the client's newest state and writes the new one (``StateDir``). Each
client now has its own directory; before, every client's versions lay side by side in the
experiment's directory and a participation listed that directory twice (once to find the
version to read, once to prune after writing). For each federation size this fills a
directory with two versions of every client, then times, side by side in one run:

- ``per-client``: ``load_usable_before`` + ``save`` of one client, as a participation does;
- ``listing``: the two listings of the flat directory the layout before added to it (the
  read and the fsynced write are the same in both layouts).

The model is the CNN's w_prev (212 KiB). Prints the median of ``--repeats`` participations,
in milliseconds, and the flat layout's listing as a ratio of the whole participation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedinit.store.state_dir import StateDir


def fill(root: Path, clients: int, model: list[np.ndarray]) -> None:
    """Two versions of every client, as after every client trained twice."""
    for cid in range(clients):
        disk = StateDir(root, "run", cid)
        for r in (1, 2):
            disk.save(r, {"w_prev": model})


def flat_names(clients: int) -> list[str]:
    """The flat layout's file names for the same federation (empty files: only listed)."""
    return [f"client-{cid}-r{r:06d}.npz" for cid in range(clients) for r in (1, 2)]


def median_ms(fn: Callable[[int], None], repeats: int) -> float:
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(n: int, root: Path, model: list[np.ndarray], repeats: int) -> tuple[float, float]:
    """(one participation in the per-client layout, the flat layout's two listings), ms."""
    fill(root / "dirs", n, model)
    flat = root / "flat" / "run"
    flat.mkdir(parents=True)
    for name in flat_names(n):
        (flat / name).touch()

    def participate(i: int) -> None:
        disk = StateDir(root / "dirs", "run", i % n)
        saved, _ = disk.load_usable_before(3 + i, model)
        assert saved is not None
        disk.save(3 + i, saved[1])

    def list_flat(i: int) -> None:
        prefix = f"client-{i % n}-r"
        for _ in range(2):
            [name for name in os.listdir(flat) if name.startswith(prefix)]

    return median_ms(participate, repeats), median_ms(list_flat, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--repeats", type=int, default=100)
    args = ap.parse_args()
    from fedinit.task.models import build_model

    model = [p.detach().numpy().copy() for p in build_model("cnn", 10, 1, 0).parameters()]
    print(f"{'clients':>8} {'files':>8} {'per-client ms':>14} {'flat listing ms':>16} "
          f"{'listing / participation':>24}")
    for n in args.clients:
        with tempfile.TemporaryDirectory(prefix="state-dir-cost-") as tmp:
            part, listing = measure(n, Path(tmp), model, args.repeats)
        print(f"{n:>8} {2 * n:>8} {part:>14.2f} {listing:>16.2f} {listing / part:>23.0%}",
              flush=True)


if __name__ == "__main__":
    main()
