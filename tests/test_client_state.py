"""RI's per-client state across rounds, through the real server loop and ClientApp."""

from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.store.client_store import W_PREV, ClientStore
from server_app.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 4, "train-limit": 1200,
         "local-epochs": 1}


def run(tmp: Path, **over: object) -> tuple[InProcessGrid, dict]:
    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp), **over})
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    summary = run_experiment(grid, cfg, out_dir=tmp / "run")
    return grid, summary


def final_model(tmp: Path) -> list[np.ndarray]:
    with np.load(tmp / "run" / "final_model.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def test_w_prev_is_the_model_the_client_trained_last_not_the_global(tmp_path: Path) -> None:
    grid, _ = run(tmp_path)
    last_upload: dict[int, list[np.ndarray]] = {}
    for reply in grid.replies:
        if reply.metadata.message_type == "train":
            last_upload[reply.metadata.src_node_id] = (
                unpack(reply.content[rk.ARRAYS]))  # model variant: w_iK
    assert len(last_upload) >= 3  # several clients trained, some more than once
    final_global = final_model(tmp_path)
    for node, ctx in grid.contexts.items():
        stored = ClientStore(ctx.state).get(W_PREV)
        if node not in last_upload:
            assert stored is None  # never selected: w_prev is still w_0, nothing stored
            continue
        assert stored is not None
        for a, b in zip(stored, last_upload[node], strict=True):
            np.testing.assert_array_equal(a, b)
        assert any(not np.array_equal(a, g) for a, g in zip(stored, final_global, strict=True))


def test_clients_selected_twice_start_from_their_own_w_prev(tmp_path: Path) -> None:
    """A client's second start point differs from the global model by beta*(w - w_prev)."""
    grid, _ = run(tmp_path, beta=0.5)
    trained = [r.metadata.src_node_id for r in grid.replies
               if r.metadata.message_type == "train"]
    assert len(trained) > len(set(trained)), "the sample should repeat some clients"


def test_beta_zero_ignores_w_prev_bit_for_bit(tmp_path: Path) -> None:
    """With beta = 0 a poisoned w_prev (NaN) changes nothing: RI is exactly off."""
    _, a = run(tmp_path / "a", beta=0.0)
    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp_path / "b"), "beta": 0.0})
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    w0 = final_model(tmp_path / "a")  # any model-shaped arrays
    for ctx in grid.contexts.values():
        ClientStore(ctx.state).put(W_PREV, [np.full_like(x, np.nan) for x in w0])
    run_experiment(grid, cfg, out_dir=tmp_path / "b" / "run")
    for x, y in zip(final_model(tmp_path / "a"), final_model(tmp_path / "b"), strict=True):
        assert x.tobytes() == y.tobytes()


def test_state_is_per_client(tmp_path: Path) -> None:
    grid, _ = run(tmp_path)
    stored = [ClientStore(c.state).get(W_PREV) for c in grid.contexts.values()]
    present = [s for s in stored if s is not None]
    assert len(present) >= 2
    assert not np.array_equal(present[0][0], present[1][0])
    assert isinstance(next(iter(grid.contexts.values())).state, RecordDict)
