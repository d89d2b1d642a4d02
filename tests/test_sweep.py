"""Experiment grids and the sweep runner: parsing, errors with lines, expansion, resume, tables."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fedinit.cli.flower_env import REPO, flower_env
from fedinit.cli.report import collect, finished_run, markdown, metric_of, write_report
from fedinit.cli.sweep import dry_run, select, set_aside_unfinished
from fedinit.cli.sweep_plan import Cell, PlanError, load_plan
from fedinit.methods.registry import METHOD_NAMES, composes_with_ri
from tests.conftest import kill_local_superlink

EXPERIMENTS = sorted((REPO / "experiments").glob("*.yaml"))
SWEEP_HTTP_PORT, SWEEP_CONTROL_PORT = "39391", "39393"  # not conftest's 39191/39193


def write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def error_of(path: Path) -> str:
    with pytest.raises(PlanError) as info:
        load_plan(path)
    return str(info.value)


# --------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.name for p in EXPERIMENTS])
def test_every_shipped_grid_is_valid(path: Path) -> None:
    grid = load_plan(path)
    assert grid.cells and len({c.id for c in grid.cells}) == len(grid.cells)


@pytest.mark.parametrize(("text", "expected"), [
    ("base: {beta: 0.1}\ngrid:\n  method: [fedavg]\n  colour: [red]\n",
     ":4: grid.colour: unknown grid key"),
    ("base:\n  lr: 0.1\n  learning-rate: 0.1\ngrid: {seed: [0]}\n",
     ":3: base.learning-rate: unknown run-config key 'learning-rate'"),
    ("grid:\n  beta:\n    - 0.0\n    - high\n",
     ":4: grid.beta[1]: expected float, got str 'high'"),
    ("grid:\n  seed: [0]\n  beta:\n    - 0.1\n    - 1.5\n",
     ":5: grid.beta[1]: run config: beta=1.5 is not allowed"),
    ("base:\n  num-server-rounds: 0\ngrid: {seed: [0]}\n",
     ":2: base.num-server-rounds: run config: num-server-rounds=0 is not allowed"),
    ("grid: {method: [fedavg, fedadam]}\noverrides:\n  fedadam:\n    server-lr: -1.0\n",
     ":4: overrides.fedadam.server-lr: run config: server-lr=-1.0 is not allowed"),
    ("grid: {method: [fedavg]}\noverrides:\n  fedmagic: {lr: 0.1}\n",
     ":3: overrides.fedmagic: unknown method"),
    ("grid:\n  method: [fedavg]\n  beta: [0.0, 0.1]\noverrides:\n  fedavg: {beta: 0.2}\n",
     ":5: overrides.fedavg.beta: the grid sets this key"),
    ("base: {seed: 1}\ngrid:\n  seed: [0, 1]\n", ":1: base.seed: also set by the grid"),
    ("base: {output-dir: /tmp/x}\ngrid: {seed: [0]}\n", ":1: base.output-dir: output-dir is set"),
    ("grid:\n  seed: [0]\n  seed: [1]\n", ":3: grid.seed: duplicate key"),
    ("grid:\n  seed: [0, 0]\n", ":2: grid.seed: repeated value"),
    ("grid:\n  seed: 0\n", ":2: grid.seed: expected a non-empty list, got int"),
    ("grid:\n  participation:\n    - {num-clients: 100, fraction: 0.1}\n",
     ":3: grid.participation[0].fraction: a participation item sets"),
    ("grid: {seed: [0]}\nmetric: {window: 0}\n", ":2: metric.window: expected a int >= 1"),
    ("grid: {seed: [0]}\nrounds: 3\n", ":2: rounds: unknown top-level key"),
    ("grid: {seed: [0]\n", ":2: not valid YAML"),
    ("base: {lr: 0.1}\n", ":1: grid: no axes"),
])
def test_bad_files_name_the_file_line_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    message = error_of(path)
    assert message.startswith(str(path) + ":"), message
    assert expected in message, message
    assert "\n" not in message


# --------------------------------------------------------------------------- expansion
def test_grid_expands_to_the_product_with_per_method_overrides(tmp_path: Path) -> None:
    grid = load_plan(write(tmp_path, """
        base: {num-server-rounds: 5, lr-decay: 0.998}
        grid:
          method: [fedavg, fedadam, feddyn]
          beta: [0.0, 0.1]
          dirichlet-alpha: [0.6, 0.1]
          participation:
            - {num-clients: 100, fraction-train: 0.1}
            - {num-clients: 200, fraction-train: 0.05}
          seed: [0, 1, 2]
        overrides:
          fedadam: {server-lr: 0.1}
          feddyn: {lr-decay: 0.9995}
    """))
    assert len(grid.cells) == 3 * 2 * 2 * 2 * 3
    by_method: dict[str, list[Cell]] = {}
    for c in grid.cells:
        by_method.setdefault(c.config["method"], []).append(c)
    assert {c.config["server-lr"] for c in by_method["fedadam"]} == {0.1}
    assert {c.config["server-lr"] for c in by_method["fedavg"] + by_method["feddyn"]} == {1.0}
    assert {c.config["lr-decay"] for c in by_method["feddyn"]} == {0.9995}
    assert {c.config["lr-decay"] for c in by_method["fedavg"]} == {0.998}
    assert {(c.config["num-clients"], c.config["fraction-train"]) for c in grid.cells} == {
        (100, 0.1), (200, 0.05)}
    assert all(c.config["num-server-rounds"] == 5 for c in grid.cells)
    first = grid.cells[0]  # the first axis varies slowest
    assert (first.config["method"], first.config["beta"], first.config["seed"]) == \
        ("fedavg", 0.0, 0)
    assert first.id.startswith("fedavg-nori-fashion-mnist-cnn-dir0.6-p10of100-s0-")


def test_variant_axis_gives_table4_rows_and_set_overrides_base(tmp_path: Path) -> None:
    path = write(tmp_path, """
        base: {num-server-rounds: 500}
        grid:
          variant:
            - {method: fedavg, beta: 0.0}
            - {method: scaffold, beta: 0.0}
            - {method: fedavg, beta: 0.1}
          seed: [0, 1]
    """)
    grid = load_plan(path, {"num-server-rounds": 3})
    assert [(c.config["method"], c.config["beta"]) for c in grid.cells[::2]] == [
        ("fedavg", 0.0), ("scaffold", 0.0), ("fedavg", 0.1)]
    assert {c.config["num-server-rounds"] for c in grid.cells} == {3}
    with pytest.raises(PlanError, match="--set seed: the grid varies this key"):
        load_plan(path, {"seed": 3})
    with pytest.raises(PlanError, match="--set num-server-rounds: run config"):
        load_plan(path, {"num-server-rounds": -1})


def test_cell_ids_ignore_paths_and_follow_the_experiment(tmp_path: Path) -> None:
    a = load_plan(write(tmp_path, "base: {data-dir: /a}\ngrid: {seed: [0]}\n", "a.yaml"))
    b = load_plan(write(tmp_path, "base: {data-dir: /b}\ngrid: {seed: [0]}\n", "b.yaml"))
    c = load_plan(write(tmp_path, "base: {lr: 0.2}\ngrid: {seed: [0]}\n", "c.yaml"))
    assert a.cells[0].id == b.cells[0].id != c.cells[0].id


def test_only_selects_by_glob_or_substring(tmp_path: Path) -> None:
    grid = load_plan(write(tmp_path, "grid:\n  method: [fedavg, scaffold]\n  seed: [0, 1]\n"))
    assert len(select(grid.cells, "scaffold")) == 2
    assert len(select(grid.cells, "*-s1-*")) == 2
    assert len(select(grid.cells, "fedavg-*-s0-*")) == 1
    assert select(grid.cells, None) == grid.cells


def test_shipped_grids_cover_every_registered_method() -> None:
    """Table 6 is RI off and on: every method that runs with RI (FedRelax and clustered FL
    refuse it; they belong in the personalized-evaluation grid)."""
    grid = load_plan(REPO / "experiments" / "fmnist-table6.yaml")
    assert {c.config["method"] for c in grid.cells} == {
        m for m in METHOD_NAMES if composes_with_ri(m)}
    assert {c.config["beta"] for c in grid.cells} == {0.0, 0.1}


# --------------------------------------------------------------------------- resume
def fake_run(cell_dir: Path, cell: Cell, accs: list[float], name: str = "run-1",
             finished: bool = True, rounds: int | None = None, **config: Any) -> Path:
    """A run directory as the ServerApp leaves it (summary.json only when finished)."""
    run = cell_dir / name
    run.mkdir(parents=True)
    cfg = {**cell.config, "output-dir": str(cell_dir),
           **{k.replace("_", "-"): v for k, v in config.items()}}
    (run / "config.json").write_text(json.dumps(cfg))
    rows = [{"round": i + 1, "test-acc": a, "divergence": 0.1 / (i + 1),
             "round-seconds": 2.0} for i, a in enumerate(accs)]
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        summary = {"config": cfg, "rounds": rounds or cfg["num-server-rounds"],
                   "final-test-acc": accs[-1],
                   "best-test-acc": max(accs), "smoothed-peak-acc": max(accs),
                   "mean-round-seconds": 2.0, "wall-seconds": 2.0 * len(accs)}
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_finished_cells_are_skipped_and_stale_runs_set_aside(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = load_plan(write(tmp_path, "grid:\n  beta: [0.0, 0.1]\n"))
    cells_dir = tmp_path / "cells"
    done, todo = grid.cells
    run = fake_run(cells_dir / done.id, done, [0.5, 0.6], data_dir="/elsewhere")
    assert finished_run(cells_dir / done.id, done) == run  # data-dir is not identity
    partial = fake_run(cells_dir / todo.id, todo, [0.5], name="run-partial", finished=False)
    other = fake_run(cells_dir / todo.id, todo, [0.5], name="run-other", lr=0.3)
    short = fake_run(cells_dir / todo.id, todo, [0.5], name="run-short", rounds=1)
    assert finished_run(cells_dir / todo.id, todo) is None  # unfinished, other config, short
    dry_run(grid.cells, cells_dir)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["1", "done", done.id]
    assert lines[1].split()[:3] == ["2", "todo", todo.id]
    moved = set_aside_unfinished(cells_dir / todo.id)
    assert sorted(p.name for p in moved) == ["run-other", "run-partial", "run-short"]
    assert not partial.exists() and not other.exists() and not short.exists()
    assert (cells_dir / todo.id / ".stale" / "run-partial" / "rounds.jsonl").exists()


@pytest.fixture()
def sweep_main() -> Iterator[Callable[[list[str]], int]]:
    """fedinit.cli.sweep's ``main`` in this process (a fresh interpreter cost about 3 s of CPU:
    torch, Flower), with the SIGTERM handler it installs put back afterwards. The
    ``-m fedinit.cli.sweep`` entry itself runs in test_two_cell_sweep_end_to_end (slow)."""
    from fedinit.cli import sweep

    before = signal.getsignal(signal.SIGTERM)
    yield sweep.main
    signal.signal(signal.SIGTERM, before)


def test_a_sweep_with_every_cell_finished_runs_nothing(
        tmp_path: Path, sweep_main: Callable[[list[str]], int],
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from fedinit.cli import report

    monkeypatch.setattr(report, "plot_curves", lambda *_: [])  # figures: tested below
    path = write(tmp_path, "grid:\n  beta: [0.0, 0.1]\n")
    grid = load_plan(path)
    for cell in grid.cells:
        fake_run(tmp_path / "out" / "cells" / cell.id, cell, [0.4, 0.5])
    code = sweep_main([str(path), "--out", str(tmp_path / "out")])
    out = capfd.readouterr().out  # file-descriptor level: a started run's output counts too
    assert code == 0, out
    assert "2 already finished, 0 to run" in out
    assert "start |" not in out and "simulate" not in out
    assert (tmp_path / "out" / "results.md").exists()


def test_bad_grid_fails_before_running_anything(
        tmp_path: Path, sweep_main: Callable[[list[str]], int],
        capfd: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "grid:\n  beta: [0.0, 2.0]\n")
    assert sweep_main([str(path), "--out", str(tmp_path / "out")]) == 2
    assert capfd.readouterr().err.startswith(
        f"sweep: {path}:2: grid.beta[1]: run config: beta=2.0")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- tables
def test_table_is_laid_out_like_the_paper_with_mean_and_std_over_seeds(tmp_path: Path) -> None:
    grid = load_plan(write(tmp_path, """
        name: fake
        grid:
          method: [fedavg, scaffold]
          beta: [0.0, 0.1]
          participation:
            - {num-clients: 100, fraction-train: 0.1}
            - {num-clients: 200, fraction-train: 0.05}
          dirichlet-alpha: [0.6, 0.1]
          seed: [0, 1, 2]
    """))
    cells_dir = tmp_path / "cells"
    # Metric = the summary's smoothed-peak-acc, here max(accs): seeds give 70, 71, 72 (+ offsets)
    offset = {("fedavg", 0.0): 0.0, ("fedavg", 0.1): 0.03, ("scaffold", 0.0): 0.02}
    for c in grid.cells:
        key = (c.config["method"], c.config["beta"])
        if key == ("scaffold", 0.1) and c.config["seed"] == 2:
            continue  # one seed missing
        acc = 0.70 + 0.01 * c.config["seed"] + offset.get(key, 0.05)
        acc += 0.10 * (c.config["dirichlet-alpha"] == 0.6) - 0.02 * (c.config["num-clients"] > 100)
        fake_run(cells_dir / c.id, c, [0.1, acc, acc - 0.01])
    results = collect(grid, cells_dir)
    md = markdown(grid, results, "cmd")
    table = md[md.index("| Method"):].split("\n\n")[0].splitlines()
    assert table[0] == ("| Method | 10%-100 Dir-0.6 | 10%-100 Dir-0.1 | 5%-200 Dir-0.6 | "
                        "5%-200 Dir-0.1 |")
    # fedavg, Dir-0.6, 10%-100: 80, 81, 82 -> mean 81.00, sample std 1.00
    assert table[2] == "| FedAvg | 81.00 ± 1.00 | 71.00 ± 1.00 | 79.00 ± 1.00 | 69.00 ± 1.00 |"
    assert table[3] == "| FedInit | 84.00 ± 1.00 | 74.00 ± 1.00 | 82.00 ± 1.00 | 72.00 ± 1.00 |"
    assert table[4].startswith("| SCAFFOLD | 83.00 ± 1.00 |")
    # seeds 0, 1 only: 85, 86 -> 85.50, std 0.71 (sqrt(0.5))
    assert table[5].startswith("| SCAFFOLD+RI | 85.50 ± 0.71 (2/3) |")
    gains = md[md.index("RI gain"):].split("\n\n")[1].splitlines()
    assert gains[2] == "| FedInit | +3.00 | +3.00 | +3.00 | +3.00 |"
    assert gains[3].startswith("| SCAFFOLD+RI | +2.50 |")
    write_report(grid, results, tmp_path / "report", "cmd")
    csv_lines = (tmp_path / "report" / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(grid.cells)
    assert sum(",pending," in line for line in csv_lines) == 4
    pngs = sorted(p.name for p in (tmp_path / "report" / "plots").glob("*.png"))
    assert pngs == ["curves-10-100-dir-0.1.png", "curves-10-100-dir-0.6.png",
                    "curves-5-200-dir-0.1.png", "curves-5-200-dir-0.6.png"]


def test_beta_rows_are_labelled_by_beta_and_metric_window_is_recomputed(tmp_path: Path) -> None:
    grid = load_plan(write(tmp_path, """
        grid: {beta: [-0.1, 0.0, 0.05]}
        metric: {window: 2, last: 2}
    """))
    for c in grid.cells:
        fake_run(tmp_path / "cells" / c.id, c, [0.2, 0.8, 0.4, 0.6])
    md = markdown(grid, collect(grid, tmp_path / "cells"), "cmd")
    # moving average (2): .5 .6 .5 -> last 2: .6 .5 -> 60.00 (not the summary's 80)
    assert "| FedInit (β=-0.1) | 60.00 |" in md
    assert "| FedAvg (β=0) | 60.00 |" in md and "| FedInit (β=0.05) | 60.00 |" in md
    assert metric_of({"smoothed-peak-acc": 0.8}, [], {}) == 0.8


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_two_cell_sweep_end_to_end_and_resume(tmp_path: Path) -> None:
    path = write(tmp_path, """
        name: e2e
        base: {num-clients: 4, fraction-train: 0.5, num-server-rounds: 2, train-limit: 2000}
        grid:
          beta: [0.0, 0.1]
    """)
    env = flower_env(tmp_path / "flwr-home", FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=SWEEP_HTTP_PORT,
                     FLWR_LOCAL_CONTROL_API_PORT=SWEEP_CONTROL_PORT)
    cmd = [sys.executable, "-m", "fedinit.cli.sweep", str(path),
           "--out", str(tmp_path / "out")]
    kill_local_superlink(SWEEP_HTTP_PORT)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                              check=False)
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                               check=False)
    finally:
        kill_local_superlink(SWEEP_HTTP_PORT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[2/2 fedavg-ri0.1-" in proc.stdout and "round 2/2 acc" in proc.stdout
    for rnd in (1, 2):  # each cell's rounds, read from its rounds.jsonl, each shown once
        assert proc.stdout.count(f"round {rnd}/2 acc ") == 2, proc.stdout[-3000:]
    assert "ETA" in proc.stdout
    assert again.returncode == 0 and "2 already finished, 0 to run" in again.stdout
    md = (tmp_path / "out" / "results.md").read_text()
    assert "Cells finished: 2 / 2" in md and "| FedInit |" in md
    assert len(list((tmp_path / "out" / "plots").glob("*.png"))) == 1


@pytest.mark.parametrize("script", ["sweep", "report"])
def test_a_grid_file_that_is_not_there_is_one_line_and_exit_2(
        tmp_path: Path, script: str, capsys: pytest.CaptureFixture[str]) -> None:
    from fedinit.cli import report, sweep

    missing = tmp_path / "nope.yaml"
    main = {"sweep": sweep.main, "report": report.main}[script]
    assert main([str(missing), "--out", str(tmp_path / "out")]) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and line.startswith(f"{script}: {missing}: cannot read")
    assert not (tmp_path / "out").exists()
