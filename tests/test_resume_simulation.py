"""Kill the server process of a real `flwr run` simulation mid-run, resume, compare (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import kill_simulation_at

SIMULATE = [sys.executable, "-m", "fedinit.cli.simulate"]
CONFIG = ["num-clients=4", "fraction-train=0.5", "num-server-rounds=6", "train-limit=2000",
          "local-epochs=1", "method=scaffold"]


def final_model(run_dir: Path) -> list[np.ndarray]:
    with np.load(run_dir / "final_model.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


@pytest.fixture(scope="module")
def uninterrupted(sim_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
                  ) -> list[np.ndarray]:
    """The final model of the run never killed, client state in its run directory: one run
    for both tests (where a client's state lives must not change the model)."""
    out = tmp_path_factory.mktemp("ref")
    ref = subprocess.run([*SIMULATE, *CONFIG, f"output-dir={out}"], env=sim_env,
                         capture_output=True, text=True, timeout=600, check=False)
    assert ref.returncode == 0, ref.stdout[-2000:]
    (ref_dir,) = list(out.iterdir())
    return final_model(ref_dir)


@pytest.mark.slow
@pytest.mark.parametrize("state_dir", ["", "state"])
def test_server_killed_mid_run_resumes_to_the_same_model(
        sim_env: dict[str, str], uninterrupted: list[np.ndarray], tmp_path: Path,
        state_dir: str) -> None:
    """The clients' state is in files (the default): in client-state-dir when it is set,
    else in the run directory, where the resumed run finds it."""
    state = [f"client-state-dir={tmp_path / state_dir}"] if state_dir else []

    out = tmp_path / "crash"
    proc = subprocess.Popen([*SIMULATE, *CONFIG, f"output-dir={out}", *state], env=sim_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows_file = kill_simulation_at(out, 2, "round")
    proc.kill()
    proc.wait(timeout=60)
    run_dir = rows_file.parent
    done = len(rows_file.read_text().splitlines())
    assert done < 6, "the run finished before it could be killed"
    assert not (run_dir / "summary.json").exists()

    resumed = subprocess.run([*SIMULATE, *CONFIG, f"output-dir={out}", *state,
                              f"resume-dir={run_dir}"],
                             env=sim_env, capture_output=True, text=True, timeout=600,
                             check=False)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resuming after round" in resumed.stdout
    got = final_model(run_dir)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, uninterrupted, strict=True))
    rows = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    files = (tmp_path / state_dir if state_dir else run_dir / "client-state") / run_dir.name
    assert list(files.glob("client-*/r*.npz")), f"no client state files in {files}"
