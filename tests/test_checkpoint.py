"""Server checkpoints: round trip, corruption and config mismatch give one-line errors."""

from pathlib import Path

import numpy as np
import pytest

from fedinit.config import RunConfig
from server_app.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from server_app.run_basics import resume_point


def sample() -> Checkpoint:
    rng = np.random.default_rng(0)
    w = [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    state = {"m": [a.astype(np.float64) for a in w], "v": [a * 0 for a in w]}
    return Checkpoint(7, w, state, RunConfig.parse({"num-server-rounds": 20}).to_dict())


def test_round_trip_is_exact(tmp_path: Path) -> None:
    ck = sample()
    save_checkpoint(tmp_path, ck)
    got = load_checkpoint(tmp_path)
    assert got.server_round == 7 and got.config == ck.config
    for a, b in zip(got.weights, ck.weights, strict=True):
        assert a.tobytes() == b.tobytes() and a.dtype == b.dtype
    assert got.strategy_state["m"][1].dtype == np.float64
    assert not list(tmp_path.glob(".*tmp"))  # no temp file left behind


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_checkpoint_is_one_line_error(tmp_path: Path, damage: str) -> None:
    save_checkpoint(tmp_path, sample())
    path = tmp_path / CHECKPOINT_FILE
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x00" * 500,
                      "empty": b""}[damage])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path)


def test_resume_refuses_a_different_config(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, sample())
    cfg = RunConfig.parse({"num-server-rounds": 20, "beta": 0.05, "resume-dir": str(tmp_path)})
    with pytest.raises(CheckpointError, match="made with beta=0.1, this run has beta=0.05"):
        resume_point(cfg)
    ok = RunConfig.parse({"num-server-rounds": 30, "resume-dir": str(tmp_path)})
    assert resume_point(ok) is not None  # more rounds is allowed
    done = RunConfig.parse({"num-server-rounds": 7, "resume-dir": str(tmp_path)})
    with pytest.raises(CheckpointError, match="nothing to do"):
        resume_point(done)


@pytest.mark.parametrize(("part", "name"), [("weights", "weights[1]"), ("state", "m[0]")])
def test_non_finite_checkpoint_is_refused_at_resume(tmp_path: Path, part: str,
                                                    name: str) -> None:
    ck = sample()
    if part == "weights":
        ck.weights[1][2] = np.nan
    else:
        ck.strategy_state["m"][0][0, 0] = np.inf
    save_checkpoint(tmp_path, ck)
    with pytest.raises(CheckpointError) as err:
        resume_point(RunConfig.parse({"num-server-rounds": 20, "resume-dir": str(tmp_path)}))
    msg = str(err.value)
    assert "\n" not in msg and f"NaN or Inf in {name}" in msg and "cannot be resumed" in msg


def test_rows_round_trip_with_the_checkpoint(tmp_path: Path) -> None:
    ck = sample()
    ck.rows = [{"round": r, "test-acc": 0.5 + r / 100, "test-loss": None} for r in range(1, 8)]
    save_checkpoint(tmp_path, ck)
    assert load_checkpoint(tmp_path).rows == ck.rows
