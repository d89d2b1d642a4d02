"""Keys added after runs were made: a run config without them means what those runs did
(``config_keys.BEFORE_KEY``), not today's default, for the sweep and for a resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedinit.cli.sweep_plan import load_plan, matches
from fedinit.config import RunConfig
from fedinit.config.keys import BEFORE_KEY, value_before
from server_app import run_basics
from server_app.checkpoint import CheckpointError


def _cell(tmp_path: Path, base: str) -> object:
    path = tmp_path / "g.yaml"
    path.write_text(f"name: g\nbase:\n  num-clients: 10\n{base}grid:\n  seed: [0]\n")
    return load_plan(path).cells[0]


def test_a_run_made_before_the_local_split_matches_only_a_cell_without_it(
        tmp_path: Path) -> None:
    old = {k: v for k, v in RunConfig.parse({"num-clients": 10}).to_dict().items()
           if k not in BEFORE_KEY}
    without = _cell(tmp_path, "  local-test-fraction: 0.0\n  personal-eval-every: 0\n")
    assert matches(old, without)  # type: ignore[arg-type]
    assert not matches(old, _cell(tmp_path, ""))  # type: ignore[arg-type]


def test_resuming_an_old_checkpoint_refuses_the_new_default(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    saved = {k: v for k, v in RunConfig.parse({"num-server-rounds": 2}).to_dict().items()
             if k not in BEFORE_KEY}
    ckpt = type("Ckpt", (), {"config": saved, "server_round": 2, "async_state": None})()
    monkeypatch.setattr(run_basics, "load_checkpoint", lambda _d: ckpt)
    cfg = RunConfig.parse({"num-server-rounds": 3, "resume-dir": str(tmp_path)})
    with pytest.raises(CheckpointError, match="local-test-fraction=0.0"):
        run_basics.resume_point(cfg)
    ok = RunConfig.parse({"num-server-rounds": 3, "resume-dir": str(tmp_path),
                          "local-test-fraction": 0.0, "personal-eval-every": 0})
    assert run_basics.resume_point(ok) is not None


def test_an_old_default_of_one_methods_key_binds_only_that_methods_runs() -> None:
    """Clustered FL assigned by k-means before ``cluster-assign`` existed: an old clustered
    run reads as kmeans (a cell of today's default, loss, is another experiment), while an old
    run of any other method never read the key and reads as today's default."""
    assert value_before("cluster-assign", "loss", {"method": "clustered"}) == "kmeans"
    assert value_before("cluster-assign", "loss", {"method": "fedavg"}) == "loss"
    assert value_before("cluster-assign", "loss") == "loss"
    assert value_before("local-test-fraction", 0.2, {"method": "fedavg"}) == 0.0
    # the warm-up, margin and probe came later still: an old clustered run had none of them
    old_run = {"method": "clustered", "cluster-assign": "loss"}
    assert [value_before(k, d, old_run) for k, d in (
        ("cluster-warmup", 3), ("cluster-margin", 0.1), ("cluster-newcomer", "probe"))] == [
        1, 0.0, "loss"]
    assert value_before("cluster-warmup", 3, {"method": "fedrelax"}) == 3
