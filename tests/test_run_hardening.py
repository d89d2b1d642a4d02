"""Runs that must not end as "completed", damaged client state, torn result rows (in-process).

Each test drives the real server loop and ClientApp through ``InProcessGrid``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import ConfigError
from fedinit.methods import wire as rk
from fedinit.methods.fedavg import FedAvgServer
from fedinit.store.state_dir import StateDir
from server_app.app import RunAborted, main
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from server_app.results import TIMING_FIELDS
from server_app.run_basics import ModelDiverged
from tests.test_resume_and_faults import CrashingGrid, config, corrupt, rows

pytestmark = pytest.mark.usefixtures("quick_runs")


def round_of(messages: list[Any]) -> int | None:
    conf = messages[0].content.config_records.get(rk.CONFIG, {}) if messages else {}
    return conf.get(rk.ROUND)


# ---------------------------------------------------------------- runs that trained nothing
def test_unwritable_output_dir_fails_before_any_message(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cfg = config(tmp_path, **{"output-dir": str(tmp_path / "file" / "out")})
    grid = InProcessGrid(4, cfg.to_dict())
    with pytest.raises(ConfigError, match="output-dir="):
        run_experiment(grid, cfg)
    assert grid.sent == []


def test_a_diverged_model_stops_the_run_and_keeps_the_good_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serverapp_without_patches: None,
) -> None:
    step = FedAvgServer.update

    def poisoned(self: FedAvgServer, state: Any, w_t: Any, rnd: Any) -> tuple[Any, Any]:
        w, new_state = step(self, state, w_t, rnd)
        poison = rnd.server_round == 2
        return ([np.full_like(a, np.nan) for a in w] if poison else w), new_state

    monkeypatch.setattr(FedAvgServer, "update", poisoned)
    cfg = config(tmp_path)
    run_dir = tmp_path / "run"
    with pytest.raises(ModelDiverged, match=r"round 2: .* NaN or Inf in weights\[0\]"):
        run_experiment(InProcessGrid(4, cfg.to_dict()), cfg, out_dir=run_dir)
    ckpt = load_checkpoint(run_dir)  # loads: it is finite
    assert ckpt.server_round == 1
    assert [r["round"] for r in rows(run_dir)] == [1]
    assert not (run_dir / "summary.json").exists()


def test_a_run_whose_every_reply_is_rejected_fails(tmp_path: Path) -> None:
    """2 rounds < max-failed-rounds=3: before, this ended 'completed' with the initial model."""
    cfg = config(tmp_path, **{"num-server-rounds": 2})
    grid = InProcessGrid(4, cfg.to_dict())
    grid.reply_filter = lambda r: corrupt("nan", r.metadata.src_node_id)(r)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=cfg.to_dict())
    with pytest.raises(RunAborted, match="no round of the run aggregated a reply"):
        main(grid, context)
    (run_dir,) = list((tmp_path / "out").iterdir())
    assert [r["num-replies"] for r in rows(run_dir)] == [0, 0]
    assert not (run_dir / "summary.json").exists()


# ---------------------------------------------------------------- damaged client state
def damage(path: Path, kind: str, cid: int) -> None:
    """Spoil one saved state file the way a crash, a person or a bad copy would."""
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif kind == "tampered":  # a readable file that claims to be another client's
        with np.load(path) as z:
            data = {k: z[k] for k in z.files}
        meta = json.loads(data["meta"].tobytes().decode())
        meta["partition-id"] = cid + 1
        data["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with path.open("wb") as f:
            np.savez(f, **data)
    else:  # wrong shapes: one array too few
        exp = path.parent.parent  # <root>/<experiment>/client-<cid>/r<round>.npz
        mirror = StateDir(exp.parent, exp.name, cid)
        with np.load(path) as z:
            arrays = [z[f"w_prev/{i}"] for i in range(sum(k.startswith("w_prev/")
                                                          for k in z.files))]
        path.unlink()
        mirror.save(int(path.stem[1:]), {"w_prev": arrays[:-1]})


@pytest.mark.parametrize("kind", ["truncated", "tampered", "wrong-shape"])
def test_damaged_client_state_falls_back_and_is_counted(tmp_path: Path, kind: str) -> None:
    cfg = config(tmp_path, **{"num-server-rounds": 4, "eval-every": 4})
    grid = InProcessGrid(4, cfg.to_dict())
    original = grid.send_and_receive
    damaged: list[Path] = []

    def restart_with_damaged_state(messages: Any, *, timeout: float | None = None) -> Any:
        msgs = list(messages)
        out = original(msgs, timeout=timeout)
        if round_of(msgs) == 2:  # every node restarts; one finds its newest file spoiled
            for node, ctx in list(grid.contexts.items()):
                grid.contexts[node] = Context(run_id=1, node_id=node,
                                              node_config=dict(ctx.node_config),
                                              state=RecordDict(), run_config=dict(ctx.run_config))
            for cid in range(4):
                files = sorted((tmp_path / "state" / "run").glob(f"client-{cid}/r*.npz"))
                if files:
                    damage(files[-1], kind, cid)
                    damaged.append(files[-1])
        return out

    grid.send_and_receive = restart_with_damaged_state  # type: ignore[method-assign]
    summary = run_experiment(grid, cfg, out_dir=tmp_path / "run")
    got = rows(tmp_path / "run")
    assert damaged
    assert sum(r["num-rejected"] for r in got) == 0  # nobody locked out
    assert all(r["num-replies"] == 2 for r in got)
    assert sum(r["state-fallbacks"] for r in got) >= 1
    assert summary["state-fallbacks"] == sum(r["state-fallbacks"] for r in got)
    csv_header = (tmp_path / "run" / "rounds.csv").read_text().splitlines()[0]
    assert "state-fallbacks" in csv_header.split(",")
    assert any(p.with_name(p.name + ".damaged").exists() for p in damaged)


# ---------------------------------------------------------------- torn result rows
def tear(path: Path, where: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    i = {"first": 0, "middle": len(lines) // 2, "last": len(lines) - 1}[where]
    lines[i] = lines[i][: len(lines[i]) // 2] + ("" if where == "last" else "\n")
    path.write_text("".join(lines))


def without_timing(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]


@pytest.fixture(scope="module")
def reference_rows(tmp_path_factory: pytest.TempPathFactory,
                   quick_runs: None) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ref")
    cfg = config(tmp, **{"num-server-rounds": 5})
    run_experiment(InProcessGrid(4, cfg.to_dict()), cfg, out_dir=tmp / "run")
    return rows(tmp / "run")


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_resume_rebuilds_every_row_when_rounds_jsonl_is_torn(
        tmp_path: Path, where: str, reference_rows: list[dict[str, Any]]) -> None:
    cfg = config(tmp_path, **{"num-server-rounds": 5})
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(CrashingGrid(4, 4, cfg.to_dict()), cfg, out_dir=run_dir)
    tear(run_dir / "rounds.jsonl", where)
    (run_dir / "rounds.csv").write_text("garbage\n")
    resumed = config(tmp_path, **{"num-server-rounds": 5, "resume-dir": str(run_dir)})
    run_experiment(InProcessGrid(4, resumed.to_dict()), resumed)
    got = rows(run_dir)
    assert [r["round"] for r in got] == [1, 2, 3, 4, 5]
    assert without_timing(got) == without_timing(reference_rows)
    csv_rounds = [line.split(",")[0] for line in
                  (run_dir / "rounds.csv").read_text().splitlines()[1:]]
    assert csv_rounds == ["1", "2", "3", "4", "5"]
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 5
