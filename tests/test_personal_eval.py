"""Personalized evaluation: the server's summary, the clients asked, and the client's promise
that evaluating never changes its stored state (memory or disk), run through the real loop."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MessageType

import client_app.app as client_app
from client_app.model_cache import client_test_tensors
from fedinit.cli import inprocess_grid
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.ditto import PERSONAL
from fedinit.methods.packed_arrays import unpack
from fedinit.store.client_store import W_PREV
from fedinit.store.simulated_state import STATE_ROOT
from fedinit.task.federated_data import dataset_of
from fedinit.task.models import initial_model, set_weights
from server_app.experiment import run_experiment
from strategies import personal_summary as pe

pytestmark = pytest.mark.usefixtures("small_central_test_set")


def scores(*accs: tuple[float, float, float | None]) -> list[pe.ClientScores]:
    return [pe.ClientScores(i, 10, {"global": g, "finetuned": f, "own": o})
            for i, (g, f, o) in enumerate(accs)]


def test_summary_is_mean_p10_and_min_over_clients() -> None:
    s = pe.summarize(scores((0.1, 0.5, 0.9), (0.3, 0.7, None), (0.5, 0.9, 0.7),
                            (0.7, 0.9, 0.8), (0.9, 1.0, 0.6)))
    assert s["local-eval-clients"] == 5 and s["local-own-clients"] == 4
    assert s["local-global-mean"] == pytest.approx(0.5)
    assert s["local-global-min"] == pytest.approx(0.1)
    # p10 of (.1 .3 .5 .7 .9): position 0.4 between .1 and .3
    assert s["local-global-p10"] == pytest.approx(0.18)
    assert s["local-own-mean"] == pytest.approx(0.75)  # the client without one is left out
    assert s["local-own-min"] == pytest.approx(0.6)


def test_summary_does_not_depend_on_the_order_replies_came_in() -> None:
    """Replies arrive in any order; a plain float sum can differ in the last bit between two
    orders (it did between two runs of one simulation), so two runs would not compare equal."""
    import itertools
    accs = [(0.1, 49 / 77, None), (0.3, 53 / 77, None), (0.5, 5 / 77, None),
            (0.7, 33 / 77, None)]
    means = {pe.summarize(scores(*order))["local-finetuned-mean"]
             for order in itertools.permutations(accs)}
    assert len(means) == 1
    assert means.pop() == pytest.approx(140 / 77 / 4, abs=1e-15)
    plain = {float(np.mean([f for _, f, _ in order])) for order in itertools.permutations(accs)}
    assert len(plain) > 1, "these values no longer show the order effect; pick others"


def test_replies_with_impossible_values_are_refused() -> None:
    assert isinstance(pe.decode(0, {rk.NUM_TEST: 5, rk.ACC_GLOBAL: 1.5,
                                    rk.ACC_FINETUNED: 0.5}), str)
    assert isinstance(pe.decode(0, {rk.NUM_TEST: -1}), str)
    assert isinstance(pe.decode(0, {rk.NUM_TEST: 5, rk.ACC_GLOBAL: 0.5}), str)
    ok = pe.decode(3, {rk.NUM_TEST: 5, rk.ACC_GLOBAL: 0.2, rk.ACC_FINETUNED: 0.4})
    assert isinstance(ok, pe.ClientScores) and ok.accs == {"global": 0.2, "finetuned": 0.4,
                                                            "own": None}


def test_evaluated_clients_are_a_fixed_seeded_sample_or_all() -> None:
    cfg = RunConfig.parse({"num-clients": 30, "personal-eval-clients": 8, "seed": 5})
    chosen = pe.eval_clients(cfg)
    assert len(chosen) == 8 == len(set(chosen)) and chosen == sorted(chosen)
    assert chosen == pe.eval_clients(RunConfig.parse({"num-clients": 30, "seed": 5,
                                                      "personal-eval-clients": 8}))
    assert chosen != pe.eval_clients(RunConfig.parse({"num-clients": 30, "seed": 6,
                                                      "personal-eval-clients": 8}))
    for k in (0, 30, 99):
        cfg = RunConfig.parse({"num-clients": 30, "personal-eval-clients": k})
        assert pe.eval_clients(cfg) == list(range(30))
    cfg = RunConfig.parse({"personal-eval-every": 20})
    assert [r for r in range(1, 61) if pe.due(cfg, r)] == [20, 40, 60]
    assert not any(pe.due(RunConfig.parse({"personal-eval-every": 0}), r) for r in range(9))


@pytest.mark.parametrize(("raw", "key"), [
    ({"personal-eval-every": -1}, "personal-eval-every"),
    ({"personal-eval-every": 5, "local-test-fraction": 0.0}, "personal-eval-every"),
    ({"personal-eval-clients": -2}, "personal-eval-clients"),
    ({"finetune-epochs": 0}, "finetune-epochs"),
    ({"ditto-lambda": -1.0}, "ditto-lambda"),
])
def test_bad_values_are_refused_in_one_line(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=f"{key}=") as err:
        RunConfig.parse(raw)
    assert "\n" not in str(err.value)


def _fingerprint(ctx: Context, disk: Path | None) -> str:
    """Every byte of a client's stored state: memory records and its state files."""
    h = hashlib.sha256()
    for key, record in sorted(ctx.state.array_records.items()):
        h.update(key.encode())
        for a in unpack(record):
            h.update(a.tobytes())
    for key, record in sorted(ctx.state.config_records.items()):
        h.update(f"{key}{sorted(dict(record).items())}".encode())
    if disk is not None and disk.exists():
        for path in sorted(disk.rglob("*")):
            if path.is_file():
                h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def _stored_models(msg: Message, ctx: Context, raw: dict[str, Any]) -> dict[str, Any]:
    """The client's stored w_prev and v_i after the evaluated round, read from its store by
    name (not through the evaluation's own choice of key); {} before it trained."""
    cfg = RunConfig.parse(raw)
    conf = msg.content.config_records[rk.CONFIG]
    cid = int(ctx.node_config["partition-id"])
    store = client_app.client_store(ctx, cfg, str(conf[rk.EXPERIMENT]), cid,
                                    str(conf.get(STATE_ROOT, ""))).snapshot()
    store.restore(str(conf[rk.EXPERIMENT]), int(conf[rk.ROUND]) + 1,
                  unpack(msg.content.array_records[rk.ARRAYS]))
    found = {k: store.get(k) for k in (W_PREV, PERSONAL)}
    return {k: v for k, v in found.items() if v is not None}


def _accuracy(weights: list[np.ndarray], ctx: Context, raw: dict[str, Any]) -> float:
    """The share of the client's local test split that ``weights`` classify right, by hand."""
    cfg = RunConfig.parse(raw)
    x, y = client_test_tensors(cfg, int(ctx.node_config["partition-id"]))
    model = initial_model(cfg, dataset_of(cfg))
    set_weights(model, weights)
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).sum()) / len(y)



@pytest.mark.parametrize(("method", "on_disk"), [("fedavg", False), ("ditto", True)])
def test_evaluation_leaves_every_clients_state_bit_identical(
        method: str, on_disk: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = tmp_path / "state" if on_disk else None
    raw = {"method": method, "beta": 0.1, "num-clients": 4, "fraction-train": 0.5,
           "num-server-rounds": 2, "train-limit": 400, "local-epochs": 1,
           "personal-eval-every": 1, "output-dir": str(tmp_path),
           **({"client-state-dir": str(disk)} if disk else {})}
    handler = inprocess_grid.HANDLERS[MessageType.EVALUATE]
    checked: list[dict[str, Any]] = []

    own_scores: list[tuple[Any, float | None]] = []  # (the reply's acc-own, ours from the store)
    differs = []  # clients whose v_i and w_prev score differently: the check can tell them apart

    def watched(msg: Message, ctx: Context) -> Message:
        before = _fingerprint(ctx, disk)
        reply = handler(msg, ctx)
        assert _fingerprint(ctx, disk) == before
        metrics = dict(reply.content.metric_records[rk.METRICS])
        checked.append(metrics)
        # a failed assert here would become the client's error reply: record, assert below
        stored = _stored_models(msg, ctx, raw)
        if stored:
            own = _accuracy(stored[PERSONAL if method == "ditto" else W_PREV], ctx, raw)
            own_scores.append((metrics.get(rk.ACC_OWN), own))
            if method == "ditto":
                differs.append(own != _accuracy(stored[W_PREV], ctx, raw))
        else:
            own_scores.append((metrics.get(rk.ACC_OWN), None))
        return reply

    monkeypatch.setitem(inprocess_grid.HANDLERS, MessageType.EVALUATE, watched)
    run_experiment(InProcessGrid(4, raw), RunConfig.parse(raw), tmp_path / "run")
    assert len(checked) == 8  # 4 clients x 2 rounds
    assert sum(rk.ACC_OWN in m for m in checked) >= 2  # own models were read, not only absent
    assert len(own_scores) == 8
    assert all(reply == ours for reply, ours in own_scores), own_scores
    assert method != "ditto" or any(differs), "v_i and w_prev score alike: pick another setup"
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").open()]
    assert all(r["local-eval-messages"] == 8 and r["local-eval-clients"] == 4 for r in rows)
    with (tmp_path / "run" / "rounds.csv").open(newline="") as f:
        header = next(csv.reader(f))
    assert set(pe.FIELDS) <= set(header)
    with (tmp_path / "run" / "personal_clients.csv").open(newline="") as f:
        clients = list(csv.DictReader(f))
    assert [int(c["partition-id"]) for c in clients] == [0, 1, 2, 3]
    assert {c["round"] for c in clients} == {"2"}
    for name in ("accuracy.png", "divergence.png", "personal.png", "personal_cdf.png"):
        assert (tmp_path / "run" / name).stat().st_size > 1000


@pytest.mark.slow
def test_fine_tuning_beats_the_global_model_on_label_skewed_local_tests(tmp_path: Path) -> None:
    """Dir-0.1: each client's local test mostly holds its own few classes, which one local
    epoch from the global model fits far better than the global model does (measured: mean
    25% global against 68% fine-tuned after 4 rounds)."""
    raw = {"num-clients": 10, "fraction-train": 0.3, "num-server-rounds": 4,
           "train-limit": 2000, "dirichlet-alpha": 0.1, "personal-eval-every": 2,
           "personal-eval-clients": 0, "output-dir": str(tmp_path)}
    run_experiment(InProcessGrid(10, raw), RunConfig.parse(raw), tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").open()]
    last = rows[-1]
    assert [r["round"] for r in rows if r["local-global-mean"] is not None] == [2, 4]
    assert last["local-finetuned-mean"] > last["local-global-mean"] + 0.15, last
    assert (tmp_path / "run" / "personal_cdf.png").exists()
