"""Per-client state (w_prev, c_i, h_i) persists per client and changes only when it trains.

Six clients, three per round, five rounds, RI on; each client's state store is checked
before and after every round. The server's aggregates must match the clients' states:
SCAFFOLD's c = (1/N) * sum of ALL c_i, FedDyn's H = sum of ALL h_i (exact under ``update``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods.feddyn import H_LOCAL
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.registry import METHODS, composes_with_ri
from fedinit.methods.scaffold import C_LOCAL
from fedinit.store.client_store import W_PREV, ClientStore
from server_app.experiment import run_experiment
from testbeds.lsq_problem import Federation, lsq_problem

N = 6
RAW = {"fraction-train": 0.5, "batch-size": 5, "lr": 0.05, "beta": 0.1,
       "ri-aggregation": "update"}


def snapshot(store: RecordDict) -> dict[str, bytes]:
    return {k: b"".join(a.tobytes() for a in unpack(r))
            for k, r in store.array_records.items()}


def run_checked(method: str, rounds: int = 5) -> Federation:
    raw = RAW if composes_with_ri(method) else {**RAW, "beta": 0.0, "ri-aggregation": "auto"}
    f = Federation(lsq_problem(num_clients=N, dim=4, n=10, seed=2), {"method": method, **raw})
    keys = {W_PREV, *METHODS[method].client.state_keys}
    ever: set[int] = set()
    kept = 0  # times a client with state sat a round out
    for _ in range(rounds):
        before = {cid: snapshot(s) for cid, s in f.states.items()}
        trained = set(f.step())
        for cid, store in f.states.items():
            after = snapshot(store)
            if cid in trained:
                assert set(after) == keys
                for k in keys:
                    assert after[k] != before[cid].get(k), (method, cid, k)
            else:
                assert after == before[cid], (method, cid)
                kept += cid in ever
        ever |= trained
        assert {cid for cid, s in f.states.items() if snapshot(s)} == ever
    assert kept > 0
    return f


@pytest.mark.parametrize("method", list(METHODS))
def test_state_changes_only_for_clients_that_train(method: str) -> None:
    run_checked(method)


def test_w_prev_is_the_clients_last_final_model() -> None:
    f = Federation(lsq_problem(num_clients=N, dim=4, n=10, seed=2),
                   {**RAW, "method": "fedavg", "ri-aggregation": "model"})
    f.step()
    for reply in f.replies:  # under ``model`` the upload is the final model
        cid = reply.metadata.src_node_id - 1000
        np.testing.assert_array_equal(f.state_of(cid, W_PREV)[0],
                                      unpack(reply.content.array_records["arrays"])[0])


def test_scaffold_server_c_is_the_mean_of_all_client_c_i() -> None:
    f = run_checked("scaffold")
    c_i = [f.state_of(cid, C_LOCAL) or [np.zeros(4, np.float32)] for cid in range(N)]
    mean = np.sum([c[0] for c in c_i], axis=0) / N  # absent clients count as zeros
    np.testing.assert_allclose(f.strategy.state.c[0], mean, atol=1e-5)  # type: ignore[attr-defined]


def test_feddyn_server_h_is_the_sum_of_all_client_h_i() -> None:
    f = run_checked("feddyn")
    h = np.sum([(f.state_of(cid, H_LOCAL) or [np.zeros(4)])[0] for cid in range(N)], axis=0)
    np.testing.assert_allclose(f.strategy.state.h_sum[0], h, atol=1e-5)  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_short_fashion_mnist_run_through_the_client_app(method: str, tmp_path: Path) -> None:
    """Each method runs end to end (real ClientApp handlers, CNN, Fashion-MNIST), stays
    finite, and leaves its state exactly in the contexts of the clients that trained."""
    raw = {"method": method, "num-clients": 10, "fraction-train": 0.3, "num-server-rounds": 2,
           "train-limit": 2000, "eval-every": 2, "output-dir": str(tmp_path),
           **({} if composes_with_ri(method) else {"beta": 0.0})}
    if method == "fedadam":
        raw["server-lr"] = 0.1  # the paper's FedAdam setting
    grid = InProcessGrid(10, raw)
    summary = run_experiment(grid, RunConfig.parse(raw), tmp_path / "run")
    assert not [r.error.reason for r in grid.replies if r.has_error()]
    lines = (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["num-replies"] for r in rows] == [3, 3]
    for key in ("test-loss", "train-loss", "divergence"):
        assert math.isfinite(rows[-1][key]), (key, rows[-1])
    assert 0.0 <= summary["final-test-acc"] <= 1.0
    trained = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "train"}
    keys = {W_PREV, *METHODS[method].client.state_keys}
    for node, ctx in grid.contexts.items():
        assert set(ctx.state.array_records) == (keys if node in trained else set())
        for key in ctx.state.array_records:
            arrays = ClientStore(ctx.state).get(key) or []
            assert all(np.all(np.isfinite(a)) for a in arrays)
