"""The scripts find a run and follow its rounds through the files it writes, not its log."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from fedinit.cli.deploy_local import results_line
from fedinit.cli.run_files import RoundsTail, run_dirs_since, run_of
from fedinit.cli.sweep import CellRun, run_cell
from fedinit.config import RunConfig


def _run_dir(out: Path, name: str, config: dict[str, Any], age: float = 0.0) -> Path:
    run = out / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if age:
        old = time.time() - age
        os.utime(run / "config.json", (old, old))
    return run


def test_rounds_tail_reads_complete_new_rows_of_the_new_run_once(tmp_path: Path) -> None:
    _run_dir(tmp_path, "older-run", {}, age=3600)
    (tmp_path / "older-run" / "rounds.jsonl").write_text('{"round": 9}\n')
    tail = RoundsTail(tmp_path, since=time.time())
    assert tail.poll() == [] and tail.run_dir is None  # only the old run is there
    run = _run_dir(tmp_path, "new-run", {})
    rows = run / "rounds.jsonl"
    rows.write_text('{"round": 1, "test-acc": 0.5}\n{"round": 2, "test-a')
    assert tail.poll() == [{"round": 1, "test-acc": 0.5}] and tail.run_dir == run
    assert tail.poll() == []  # the torn line waits for its end
    with rows.open("a") as f:
        f.write('cc": null}\n{"round": 3, "test-acc": 0.7}\n')
    assert [r["round"] for r in tail.poll()] == [2, 3]
    rows.write_text('{"round": 1}\n{"round": 2}\n{"round": 3}\n{"round": 4}\n')  # rewritten
    assert [r["round"] for r in tail.poll()] == [4]


def test_hidden_and_old_directories_are_not_runs(tmp_path: Path) -> None:
    since = time.time()
    _run_dir(tmp_path, ".stale", {})
    _run_dir(tmp_path, "old", {}, age=60)
    new = _run_dir(tmp_path, "new", {})
    assert run_dirs_since(tmp_path, since) == [new]
    assert run_dirs_since(tmp_path / "missing", since) == []


def test_run_of_is_the_new_directory_with_this_config(tmp_path: Path) -> None:
    config = RunConfig.parse({"output-dir": str(tmp_path), "seed": 3}).to_dict()
    other = {**config, "seed": 4}
    since = time.time()
    _run_dir(tmp_path, "earlier", config, age=60)
    _run_dir(tmp_path, "other", other)
    mine = _run_dir(tmp_path, "mine", config)
    assert run_of(config, since) == (mine, [mine])
    twin = _run_dir(tmp_path, "twin", config)
    assert run_of(config, since) == (None, [mine, twin])  # two runs of one config: unclear
    resumed = {**config, "resume-dir": str(tmp_path / "earlier")}
    (tmp_path / "earlier" / "config.json").write_text(json.dumps(resumed))
    assert run_of(resumed, since) == ((tmp_path / "earlier").resolve(),
                                      [(tmp_path / "earlier").resolve()])


def test_results_line_reads_the_summary(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "run", {})
    assert results_line(run, str(tmp_path)) == (f"results in {run} (no summary.json: the run "
                                                "wrote no final results)")
    (run / "summary.json").write_text(json.dumps(
        {"final-test-acc": 0.5, "best-test-acc": 0.625, "rounds": 2}))
    assert results_line(run, str(tmp_path)) == (f"results in {run} (final acc 50.00%, "
                                                "best 62.50%, 2 rounds)")
    assert "could not be told apart" in results_line(None, str(tmp_path))


def test_sweep_cell_progress_comes_from_rounds_jsonl(tmp_path: Path) -> None:
    """Every round is reported once, in order, evaluated or not, however the log reads."""
    server = textwrap.dedent("""
        import json, pathlib, sys, time
        run = pathlib.Path(sys.argv[1]) / "fedavg-ri0.1-x"
        run.mkdir()
        (run / "config.json").write_text("{}")
        print("Successfully started run 42", flush=True)
        with (run / "rounds.jsonl").open("a") as f:
            for r, acc in ((1, 0.25), (2, None), (3, 0.5)):
                f.write(json.dumps({"round": r, "test-acc": acc}) + "\\n")
                f.flush()
                print("[round %d/3] acc ...garbled..." % r, flush=True)
                time.sleep(0.3)
    """)
    seen: list[dict[str, Any]] = []
    run = CellRun()
    with (tmp_path / "sweep.log").open("w") as log:
        run_cell([sys.executable, "-c", server, str(tmp_path)], dict(os.environ), log,
                 RoundsTail(tmp_path, since=time.time()), seen.append, run, "local")
    assert seen == [{"round": 1, "test-acc": 0.25}, {"round": 2, "test-acc": None},
                    {"round": 3, "test-acc": 0.5}]
    assert run.run_id == "42" and run.code == 0
    assert "Successfully started run 42" in (tmp_path / "sweep.log").read_text()
