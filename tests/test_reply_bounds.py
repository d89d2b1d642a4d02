"""Hostile but well-formed replies: false example counts and scaled uploads are rejected.

Most tests drive a method's server half directly with hand-made replies to the messages it
sent (a tiny two-array "model"), so every expected aggregate is a plain numpy computation.
The last ones run the real server loop and ClientApp in-process on Fashion-MNIST.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedinit.cli.inprocess_grid import InProcessGrid, set_task_identity
from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.scaffold import DELTA_C
from fedinit.methods.weights import Weights
from server_app.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from server_app.experiment import run_experiment
from strategies.method_strategy import MethodStrategy

pytestmark = pytest.mark.usefixtures("quick_runs")

SIZES = (30, 50, 70, 90)
"""The partitions' true example counts, as the ServerApp derives them from the config."""
RNG = np.random.default_rng(0)
W_T: Weights = [RNG.standard_normal((4, 3)).astype(np.float32),
                RNG.standard_normal(3).astype(np.float32)]


def server(method: str = "fedavg", n: int = 4, fraction: float = 1.0, **raw: Any) -> MethodStrategy:
    """A method's server half with the default reply checks, beta 0 and model aggregation."""
    set_task_identity()
    cfg = RunConfig.parse({"method": method, "num-clients": n, "fraction-train": fraction,
                           "beta": 0.0, "ri-aggregation": "model", "output-dir": "/tmp/x",
                           **raw})
    strategy = MethodStrategy(cfg, {p: 1000 + p for p in range(n)}, W_T, examples=SIZES[:n])
    return strategy


def send(strategy: MethodStrategy, rnd: int, w_t: Weights = W_T) -> list[Message]:
    return list(strategy.configure_train(rnd, ArrayRecord(w_t), ConfigRecord(),
                                         cast(Grid, None)))


def cid(msg: Message) -> int:
    return msg.metadata.dst_node_id - 1000


def move(i: int, scale: float = 0.05) -> Weights:
    """An honest-sized model move, a little different per client."""
    r = np.random.default_rng(100 + i)
    return [(scale * (1 + 0.1 * i) * r.standard_normal(a.shape)).astype(np.float32)
            for a in W_T]


STEPS = {0: 2, 1: 4, 2: 6, 3: 6}
"""True local steps of each partition: 2 epochs (default) of ceil(size / 32) batches."""


def answer(msg: Message, up: Weights, n: int | None = None,
           extra: dict[str, Weights] | None = None, steps: int | None = None) -> Message:
    """A well-formed reply uploading ``up`` and claiming ``n`` examples and ``steps`` local
    steps (the truth where None)."""
    metrics = MetricRecord({rk.NUM_EXAMPLES: SIZES[cid(msg)] if n is None else n,
                            rk.TRAIN_LOSS: 0.5,
                            rk.NUM_STEPS: STEPS[cid(msg)] if steps is None else steps})
    content = RecordDict({rk.ARRAYS: ArrayRecord(up), rk.METRICS: metrics,
                          rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: False}),
                          **{k: ArrayRecord(v) for k, v in (extra or {}).items()}})
    return Message(content=content, reply_to=msg)


def final(w_t: Weights, i: int, scale: float = 1.0) -> Weights:
    """Client i's final model w_t + scale * move_i (what ``model`` aggregation uploads)."""
    return [(w + scale * d).astype(np.float32) for w, d in zip(w_t, move(i), strict=True)]


def numpy_mean(ids: list[int]) -> list[np.ndarray]:
    """Example-weighted mean of the clients' final models, computed independently."""
    return [np.average(np.stack([final(W_T, i)[k].astype(np.float64) for i in ids]), axis=0,
                       weights=[SIZES[i] for i in ids]) for k in range(len(W_T))]


def weights_of(result: tuple[ArrayRecord | None, MetricRecord | None]) -> Weights:
    assert result[0] is not None
    return unpack(result[0])


# ---------------------------------------------------------------- example counts
@pytest.mark.parametrize("claim", [10**9, SIZES[2] + 1, SIZES[2] - 1])
def test_a_false_example_count_is_rejected_and_left_out(claim: int) -> None:
    s = server()
    msgs = send(s, 1)
    replies = [answer(m, final(W_T, cid(m)), claim if cid(m) == 2 else None) for m in msgs]
    got, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and metrics["num-rejected"] == 1
    for a, b in zip(weights_of((got, metrics)), numpy_mean([0, 1, 3]), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_a_ceiling_replaces_the_exact_count_for_clients_with_their_own_data() -> None:
    s = server(**{"max-examples-per-client": 100})
    msgs = send(s, 1)
    claims = {0: 7, 1: 100, 2: 101, 3: 99}
    _, metrics = s.aggregate_train(1, [answer(m, final(W_T, cid(m)), claims[cid(m)])
                                       for m in msgs])
    assert metrics is not None and metrics["num-rejected"] == 1


@pytest.mark.parametrize("claim", [1, 5])
def test_fedcm_rejects_a_false_step_count(claim: int) -> None:
    """FedCM's momentum is -D / (K eta): fewer claimed steps would inflate it."""
    s = server("fedcm")
    msgs = send(s, 1)
    replies = [answer(m, final(W_T, cid(m)), steps=claim if cid(m) == 2 else None)
               for m in msgs]
    got, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and metrics["num-rejected"] == 1
    for a, b in zip(weights_of((got, metrics)), numpy_mean([0, 1, 3]), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("said", [True, None])
def test_an_upload_of_another_kind_is_rejected(said: bool | None) -> None:
    """The round asks for final models; a reply that says (or does not say) otherwise would
    be averaged as a model while holding a delta."""
    s = server()
    msgs = send(s, 1)
    assert all(m.content.config_records[rk.CONFIG][rk.UPLOAD_DELTA] is False for m in msgs)
    replies = [answer(m, final(W_T, cid(m))) for m in msgs]
    bad = replies[1].content
    if said is None:
        del bad[rk.CONFIG]
    else:
        bad[rk.CONFIG] = ConfigRecord({rk.UPLOAD_DELTA: said})
    got, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and metrics["num-rejected"] == 1
    kept = [cid(m) for i, m in enumerate(msgs) if i != 1]
    for a, b in zip(weights_of((got, metrics)), numpy_mean(kept), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- norm filter
def test_a_move_scaled_by_50_among_3_replies_is_rejected() -> None:
    s = server(n=3)
    msgs = send(s, 1)
    replies = [answer(m, final(W_T, cid(m), 50.0 if cid(m) == 1 else 1.0)) for m in msgs]
    got, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and metrics["num-rejected"] == 1
    w = weights_of((got, metrics))
    want = [np.average(np.stack([final(W_T, i)[k] for i in (0, 2)]), axis=0,
                       weights=[SIZES[0], SIZES[2]]) for k in range(2)]
    for a, b in zip(w, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_a_huge_move_alone_in_round_1_is_rejected_without_any_history() -> None:
    s = server(n=3, fraction=0.34)
    (msg,) = send(s, 1)
    got, metrics = s.aggregate_train(1, [answer(msg, final(W_T, cid(msg), 1e6))])
    assert got is None and metrics is not None and metrics["num-rejected"] == 1
    (msg,) = send(s, 2)  # an honest single reply still gets in
    got, metrics = s.aggregate_train(2, [answer(msg, final(W_T, cid(msg)))])
    assert got is not None and metrics is not None and metrics["num-rejected"] == 0


@pytest.mark.parametrize("scale", [1e6, 50.0])
def test_a_scaled_move_alone_in_a_later_round_is_judged_by_the_history(scale: float) -> None:
    s = server(n=3)
    msgs = send(s, 1)
    s.aggregate_train(1, [answer(m, final(W_T, cid(m))) for m in msgs])
    msgs = send(s, 2)
    # only the attacker answers this round
    got, metrics = s.aggregate_train(2, [answer(msgs[0], final(W_T, cid(msgs[0]), scale))])
    assert got is None and metrics is not None and metrics["num-rejected"] == 1


def test_nan_or_inf_cannot_turn_the_norm_filter_off() -> None:
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ConfigError, match="max-update-norm-ratio"):
            RunConfig.parse({"max-update-norm-ratio": bad})


# ---------------------------------------------------------------- SCAFFOLD's Delta_c
def delta_c(i: int, scale: float = 1.0) -> Weights:
    return [(scale * 2.0 * d).astype(np.float32) for d in move(i)]


@pytest.mark.parametrize(("n", "fraction"), [(3, 1.0), (3, 0.34)])
def test_scaffold_delta_c_scaled_by_1e6_is_rejected_with_an_honest_model(
        n: int, fraction: float) -> None:
    s = server("scaffold", n=n, fraction=fraction)
    msgs = send(s, 1)
    victim = cid(msgs[0])
    replies = [answer(m, final(W_T, cid(m)),
                      extra={DELTA_C: delta_c(cid(m), 1e6 if cid(m) == victim else 1.0)})
               for m in msgs]
    _, metrics = s.aggregate_train(1, replies)
    assert metrics is not None and metrics["num-rejected"] == 1
    honest = [cid(m) for m in msgs if cid(m) != victim]
    # c = (1/N) sum of the honest Delta_c (zero when the attacker was the only one)
    want = [sum((delta_c(i)[k].astype(np.float64) for i in honest), np.zeros(a.shape)) / n
            for k, a in enumerate(W_T)]
    for a, b in zip(s.state.c, want, strict=True):  # type: ignore[attr-defined]
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- checkpoint and real runs
def test_the_norm_history_survives_a_checkpoint(tmp_path: Path) -> None:
    s = server("scaffold", n=3)
    msgs = send(s, 1)
    s.aggregate_train(1, [answer(m, final(W_T, cid(m)), extra={DELTA_C: delta_c(cid(m))})
                          for m in msgs])
    assert set(s.norm_history) == {rk.ARRAYS, DELTA_C}
    save_checkpoint(tmp_path, Checkpoint(1, W_T, s.server_state(), {}))
    resumed = server("scaffold", n=3, fraction=0.34)
    resumed.load_server_state(load_checkpoint(tmp_path).strategy_state)
    assert resumed.norm_history == s.norm_history  # exact floats: a resume filters alike
    (msg,) = send(resumed, 2)
    _, metrics = resumed.aggregate_train(2, [answer(msg, final(W_T, cid(msg), 50.0),
                                                    extra={DELTA_C: delta_c(cid(msg))})])
    assert metrics is not None and metrics["num-rejected"] == 1


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["fedavg", "scaffold"])
def test_an_honest_small_run_rejects_nothing(tmp_path: Path, method: str) -> None:
    """One client per round: the first-round bound, then the history; real client counts."""
    cfg = RunConfig.parse({"method": method, "num-clients": 3, "fraction-train": 0.34,
                           "num-server-rounds": 5, "train-limit": 600, "local-epochs": 1,
                           "eval-every": 5, "output-dir": str(tmp_path / "out")})
    run_experiment(InProcessGrid(3, cfg.to_dict()), cfg, out_dir=tmp_path / "run")
    got = rows(tmp_path / "run")
    assert [r["num-rejected"] for r in got] == [0] * 5
    assert all(0.0 < r["norm-limit-used"] < 1.0 for r in got)  # the filter was on


def test_a_false_example_count_is_rejected_in_a_real_run(tmp_path: Path) -> None:
    cfg = RunConfig.parse({"num-clients": 3, "fraction-train": 1.0, "num-server-rounds": 1,
                           "train-limit": 600, "local-epochs": 1,
                           "output-dir": str(tmp_path / "out")})
    grid = InProcessGrid(3, cfg.to_dict())

    def claim_more(reply: Message) -> Message:
        if reply.metadata.src_node_id == 1001 and reply.metadata.message_type == "train":
            m = dict(reply.content[rk.METRICS])
            reply.content[rk.METRICS] = MetricRecord({**m, rk.NUM_EXAMPLES: 10**9})
        return reply

    grid.reply_filter = claim_more
    run_experiment(grid, cfg, out_dir=tmp_path / "run")
    assert [r["num-rejected"] for r in rows(tmp_path / "run")] == [1]
