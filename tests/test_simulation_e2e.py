"""End to end through `flwr run` in Flower's simulation engine (slow: starts Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedinit.cli.flower_env import REPO
from fedinit.cli.simulate import run_status, stream_run

SIMULATE = [sys.executable, "-m", "fedinit.cli.simulate"]


@pytest.mark.slow
def test_short_simulation_completes_and_writes_results(
        sim_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [*SIMULATE, "num-clients=4", "fraction-train=0.5", "num-server-rounds=3",
         "train-limit=3000", f"output-dir={out}"],
        env=sim_env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[round 3/3] acc" in proc.stdout  # the live progress line reached the user
    (run_dir,) = list(out.iterdir())
    for name in ("rounds.jsonl", "rounds.csv", "summary.json", "config.json",
                 "accuracy.png", "divergence.png", "final_model.npz", "model.pt"):
        assert (run_dir / name).stat().st_size > 0, name
    rows = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["num-replies"] == 2 and r["divergence"] > 0 for r in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config"]["beta"] == 0.1
    assert summary["best-test-acc"] > 0.4  # chance is 0.1


@pytest.mark.slow
def test_federation_size_mismatch_fails_fast_with_a_clear_reason(
        sim_env: dict[str, str], tmp_path: Path) -> None:
    """num-clients=4 on 3 simulated SuperNodes: the run fails in seconds, not a hang."""
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'num-clients = 4\nnum-server-rounds = 1\noutput-dir = "{tmp_path}"\n')
    t0 = time.monotonic()
    run_id, output = stream_run(["flwr", "run", str(REPO), "local", "--run-config", str(cfg),
                         "--federation-config", "num-supernodes=3", "--stream"], sim_env)
    assert run_id is not None
    assert run_status(sim_env, run_id) == "finished:failed"
    assert time.monotonic() - t0 < 180
    assert "num-partitions=3 but num-clients=4" in output, output[-3000:]


def test_bad_value_fails_before_any_flower_process(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = subprocess.run([*SIMULATE, "beta=1.5", f"output-dir={tmp_path}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "simulate: run config: beta=1.5 is not allowed; allowed: -1 < beta < 1 "
        "(the paper uses 0.01..0.15)"]
    assert time.monotonic() - t0 < 60
