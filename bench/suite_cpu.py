"""CPU seconds of test files at a git ref and in the working tree, back to back.

    .venv/bin/python -m bench.suite_cpu --ref main tests/test_resume_and_faults.py
    .venv/bin/python -m bench.suite_cpu --ref HEAD~3 --rounds 2 tests/test_fleet.py tests/test_dp.py

The fast suite's time (scripts/test.sh, two pytest-xdist workers) is about the sum of its
tests' CPU over the two cores; wall time on a shared machine says more about the neighbours
than about the tests. For each file this runs ``pytest -q -p no:warnings FILE`` serially in
the ref's tree (``git archive`` into a temporary folder, this checkout's .venv linked in) and
then in the working tree, alternately for ``--rounds`` rounds, and prints each side's CPU
seconds (user + system of pytest and its children: getrusage of the finished child), wall
seconds and the after/before ratio. A failing run is reported and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def export(ref: str, dest: Path) -> Path:
    """The tree of ``ref`` under ``dest``, with this checkout's virtual environment linked."""
    archive = dest / "ref.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), ref], check=True)
    tree = dest / "tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    (tree / ".venv").symlink_to((REPO / ".venv").resolve())
    return tree


def cpu_of(tree: Path, test_file: str) -> tuple[float, float, bool]:
    """(CPU seconds, wall seconds, passed) of one serial pytest run of ``test_file``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", test_file],
                          cwd=tree, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        print(f"  {test_file} failed in {tree}:\n{done.stdout[-2000:]}", file=sys.stderr)
    return cpu, wall, done.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="git ref to compare the working tree with")
    ap.add_argument("--rounds", type=int, default=1, help="alternations per file (>= 1)")
    ap.add_argument("files", nargs="+", help="test files, relative to the repository root")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: must be >= 1")
    missing = [f for f in args.files if not (REPO / f).is_file()]
    if missing:
        ap.error(f"no such test file in the working tree: {', '.join(missing)}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ref_tree = export(args.ref, Path(tmp))
        print(f"{'file':44s} {'cpu ref':>8s} {'cpu now':>8s} {'ratio':>6s} "
              f"{'wall ref':>9s} {'wall now':>9s}")
        totals = [0.0, 0.0]
        for test_file in args.files:
            cpu = [0.0, 0.0]
            wall = [0.0, 0.0]
            for _ in range(args.rounds):
                for side, tree in enumerate((ref_tree, REPO)):
                    if side == 0 and not (tree / test_file).is_file():
                        continue  # a file the ref does not have: its CPU before is 0
                    c, w, passed = cpu_of(tree, test_file)
                    cpu[side] += c / args.rounds
                    wall[side] += w / args.rounds
                    ok = ok and passed
            totals = [totals[0] + cpu[0], totals[1] + cpu[1]]
            ratio = cpu[1] / cpu[0] if cpu[0] else float("nan")
            print(f"{test_file:44s} {cpu[0]:8.1f} {cpu[1]:8.1f} {ratio:6.2f} "
                  f"{wall[0]:9.1f} {wall[1]:9.1f}")
        print(f"{'total':44s} {totals[0]:8.1f} {totals[1]:8.1f} "
              f"{totals[1] / totals[0] if totals[0] else float('nan'):6.2f}")
    print(f"(ref {args.ref}, CPU = user + system seconds of each serial pytest run, "
          f"{os.cpu_count()} cores)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
