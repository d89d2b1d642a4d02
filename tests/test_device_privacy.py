"""A hostile server against a device that owns its local DP (``strategies.device_privacy``).

The server side controls the run config and every message; the device controls only its own
node config. Each attack is driven through the real ClientApp handlers (``train_fn``,
``evaluate_fn``) with Flower ``Message`` and ``Context`` objects:

- a run config below the device's floor (dp off or central, a larger clip on either upload,
  a lower noise multiplier) is refused: an error reply, one log line, nothing read or kept;
- the divergence query (whose exact answers reconstruct w_prev_i: shown to work with DP off)
  and every other evaluate message are refused under local DP;
- a train reply under local DP carries no metric that depends on the data;
- the device's epsilon, persisted across a restart, equals ``dp_accounting`` called here for
  its number of participations, and lies within 15% above the exact epsilon of the composed
  Gaussian (Balle & Wang's formula, written here);
- a user's own ClientApp guarded by ``device_floor_mod``: its evaluate handler never runs
  under the device's floor.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from client_app.app import evaluate_fn, query_fn, train_fn
from client_app.model_cache import cached_model, client_tensors, initial_weights
from client_app.round import client_round
from fedinit.cli.deploy_local import pids_mentioning
from fedinit.cli.inprocess_grid import InProcessGrid, set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism, norm
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.scaffold import DELTA_C
from fedinit.store.client_store import ClientStore
from fedinit.store.privacy_ledger import LEDGER_NAME, PrivacyLedger
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from strategies.device_privacy import (
    REFUSED,
    DeviceFloor,
    DeviceRelease,
    FloorError,
    device_floor_mod,
)
from strategies.method_strategy import MethodStrategy
from strategies.operator_log import OPERATOR_LOG
from tests.deploy_helpers import rounds, run_dir
from tests.test_strategies import D
from tests.test_strategies import message as user_message

pytestmark = pytest.mark.usefixtures("quick_runs")  # 1,000 central test images, no plots

NODE = 7
RUN: dict[str, Any] = {"num-clients": 4, "train-limit": 400, "batch-size": 50,
                       "local-epochs": 1, "weighting": "uniform", "dp": "local",
                       "dp-clip": 0.5, "dp-noise-multiplier": 1.2, "output-dir": "/tmp/unused"}
FLOOR = {"dp-floor": "local", "dp-max-clip": 1.0, "dp-min-noise": 1.0}


def context(state_dir: Path | None, run: dict[str, Any], cid: int = 1,
            **node: Any) -> Context:
    nc: dict[str, Any] = {"partition-id": cid, "num-partitions": 4, **node}
    if state_dir is not None:
        nc["state-dir"] = str(state_dir)
    return Context(run_id=1, node_id=NODE, node_config=nc, state=RecordDict(),
                   run_config=dict(run))


def train_message(cfg: RunConfig, server_round: int = 1, cid: int = 1) -> Message:
    set_task_identity()
    w0 = list(initial_weights(cfg))
    records: dict[str, Any] = {
        rk.ARRAYS: ArrayRecord(w0),
        rk.CONFIG: ConfigRecord({rk.ROUND: server_round, rk.LR: 0.05, rk.BETA: 0.0,
                                 rk.UPLOAD_DELTA: True, rk.EXPERIMENT: "exp",
                                 rk.CLIENT_ID: cid})}
    for key in cfg.spec.client.down_keys:  # SCAFFOLD's c: zeros, as at the start
        records[key] = ArrayRecord([np.zeros_like(a) for a in w0])
    msg = Message(content=RecordDict(records), dst_node_id=NODE,
                  message_type=MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = f"train-{server_round}"
    return msg


EVALUATE_QUERIES: list[tuple[str | None, str]] = [
    (rk.DIVERGENCE_EVAL, "divergence"), (rk.PERSONAL_EVAL, "personalized evaluation"),
    (rk.FEDERATED_EVAL, "federated evaluation"), (None, "evaluation")]
"""Every kind of evaluate message (its flag; None: the plain one) and how the device names it."""


def evaluate_message(weights: list[np.ndarray], flag: str | None, server_round: int = 1,
                     cid: int = 1) -> Message:
    set_task_identity()
    conf: dict[str, Any] = {rk.ROUND: server_round, rk.LR: 0.05, rk.EXPERIMENT: "exp",
                            rk.CLIENT_ID: cid}
    if flag is not None:
        conf[flag] = True
    msg = Message(content=RecordDict({rk.ARRAYS: ArrayRecord(weights),
                                      rk.CONFIG: ConfigRecord(conf)}),
                  dst_node_id=NODE, message_type=MessageType.EVALUATE)
    msg.metadata.__dict__["_message_id"] = f"evaluate-{server_round}"
    return msg


def privacy_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "device privacy" in r.getMessage()]


# ---------------------------------------------------------------- the floor, as configured
def test_floor_from_node_config_and_from_its_file(tmp_path: Path) -> None:
    floor = DeviceFloor.of({**FLOOR, "state-dir": str(tmp_path)})
    assert (floor.local, floor.max_clip, floor.min_noise, floor.delta) == (True, 1.0, 1.0, 1e-5)
    assert floor.ledger == tmp_path / LEDGER_NAME
    (tmp_path / "dp-floor.toml").write_text(
        'dp-floor = "local"\ndp-max-clip = 0.5\ndp-min-noise = 2\ndp-delta = 1e-6\n')
    from_file = DeviceFloor.of({"state-dir": str(tmp_path)})  # found in the state dir
    assert (from_file.local, from_file.max_clip, from_file.min_noise, from_file.delta) == (
        True, 0.5, 2.0, 1e-6)
    other = tmp_path / "elsewhere.toml"
    other.write_text('dp-floor = "local"\ndp-max-clip = 3.0\ndp-min-noise = 1.5\n')
    named = DeviceFloor.of({"dp-floor-file": str(other), "dp-ledger": str(tmp_path / "l.json")})
    assert (named.max_clip, named.min_noise, named.ledger) == (3.0, 1.5, tmp_path / "l.json")
    assert DeviceFloor.of({"partition-id": 0, "num-partitions": 4}) == DeviceFloor()


@pytest.mark.parametrize(("node", "says"), [
    ({"dp-floor": "central", "dp-max-clip": 1.0, "dp-min-noise": 1.0}, "dp-floor='central'"),
    ({"dp-floor": "local", "dp-min-noise": 1.0}, "needs dp-max-clip"),
    ({"dp-floor": "local", "dp-max-clip": 1.0}, "needs dp-min-noise"),
    ({**FLOOR, "dp-min-noise": 0.0}, "dp-min-noise=0.0"),
    ({**FLOOR, "dp-max-clip": "1"}, "dp-max-clip='1'"),
    ({**FLOOR, "dp-delta": 1.0}, "dp-delta=1.0"),
    ({**FLOOR, "dp-min-nosie": 2.0}, "'dp-min-nosie' is not a device privacy key"),
    ({"dp-max-clip": 1.0}, "dp-max-clip is set but dp-floor is 'off'"),
    ({**FLOOR, "dp-max-epsilon": 0}, "dp-max-epsilon=0.0"),
    ({"dp-floor": "local", "dp-max-clip": 1.0, "dp-min-noise": 1.0, "state-dir": ""},
     "needs state-dir or dp-ledger"),
    ({"dp-floor-file": "/nonexistent/floor.toml"}, "is not a file"),
])
def test_a_bad_floor_is_one_line_naming_the_value(node: dict[str, Any], says: str,
                                                   tmp_path: Path) -> None:
    node = {"state-dir": str(tmp_path), **node}
    with pytest.raises(FloorError) as err:
        DeviceFloor.of(node)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_key_in_both_places_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dp-floor.toml").write_text('dp-min-noise = 2.0\n')
    with pytest.raises(FloorError, match="dp-min-noise is set both"):
        DeviceFloor.of({**FLOOR, "state-dir": str(tmp_path)})


# ---------------------------------------------------------------- hostile run configs
HOSTILE = [
    ({"dp": "off"}, "run config dp='off'; this device's floor is dp-floor='local' (allowed: "
                    "dp='local' or dp='distributed')"),
    ({"dp": "central"}, "run config dp='central'; this device's floor is dp-floor='local' "
                        "(allowed: dp='local' or dp='distributed')"),
    ({"dp-clip": 1.5}, "run config dp-clip=1.5 > this device's dp-max-clip=1"),
    ({"dp-noise-multiplier": 0.5},
     "run config dp-noise-multiplier=0.5 < this device's dp-min-noise=1"),
    ({"method": "scaffold", "dp-clip-extra": 4.0},
     "run config dp-clip-extra=4 > this device's dp-max-clip=1"),
]


@pytest.mark.parametrize(("over", "reason"), HOSTILE)
def test_a_run_below_the_floor_is_refused_with_one_line(
        over: dict[str, Any], reason: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Train and evaluate alike: an error reply naming the shortfall, one warning, and
    nothing read or written (no state, no ledger)."""
    run = {**RUN, **over}
    cfg = RunConfig.parse(run)
    ctx = context(tmp_path, run, **FLOOR)
    with caplog.at_level(logging.INFO, logger="flwr"):
        replies = [train_fn(train_message(cfg), ctx),
                   evaluate_fn(evaluate_message(list(initial_weights(cfg)),
                                                rk.DIVERGENCE_EVAL), ctx)]
    for reply, task in zip(replies, ("train message", "evaluate message (divergence)"),
                           strict=True):
        assert reply.has_error() and not reply.has_content()
        assert reply.error.code == REFUSED
        assert reply.error.reason == f"device privacy: refused the {task} of round 1: {reason}"
    assert privacy_lines(caplog) == [r.error.reason for r in replies]
    assert list(tmp_path.iterdir()) == [] and not ctx.state.array_records


def test_the_same_device_trains_a_run_that_meets_its_floor(tmp_path: Path) -> None:
    """The control: the floor refuses exactly the runs below it."""
    cfg = RunConfig.parse(RUN)
    reply = train_fn(train_message(cfg), context(tmp_path, RUN, **FLOOR))
    assert not reply.has_error()
    assert norm(unpack(reply.content.array_records[rk.ARRAYS])) > 0


def test_an_unusable_floor_refuses_every_task(tmp_path: Path) -> None:
    """A typo in the device's settings fails closed: refused, not run without a floor."""
    cfg = RunConfig.parse({**RUN, "dp": "off"})
    ctx = context(tmp_path, {**RUN, "dp": "off"}, **{**FLOOR, "dp-min-nosie": 1.0})
    reply = train_fn(train_message(cfg), ctx)
    assert reply.has_error() and "'dp-min-nosie' is not a device privacy key" in \
        reply.error.reason


# ---------------------------------------------------------------- queries under local DP
def _attack_coordinates(ask: Any, w_t: list[np.ndarray], coords: int) -> np.ndarray | None:
    """The divergence attack: q(x) = ||w_prev - x||^2 at x = w_t and x = w_t + e_j gives
    w_prev_j = w_t_j + (1 - (q(w_t + e_j) - q(w_t))) / 2; None when a query is refused."""
    def q(x: list[np.ndarray]) -> float | None:
        reply = ask(x)
        if reply.has_error():
            return None
        return float(reply.content.metric_records[rk.METRICS][rk.SQ_DISTANCE])

    base = q(w_t)
    if base is None:
        return None
    found = []
    for j in range(coords):
        x = [a.copy() for a in w_t]
        x[0].flat[j] += 1.0
        qj = q(x)
        if qj is None:
            return None
        found.append(float(w_t[0].flat[j]) + (1.0 - (qj - base)) / 2.0)
    return np.asarray(found)


@pytest.mark.parametrize("floor", [True, False], ids=["floor", "run-config-local"])
def test_divergence_queries_recover_nothing_under_local_dp(
        floor: bool, tmp_path: Path) -> None:
    """With DP off, 4 divergence queries recover 3 coordinates of w_prev_i to 1e-6 (the
    attack works); under local DP, from the floor or from the run config alone, the
    same queries get refusals: no answer to reconstruct from."""
    results = {}
    for dp in ("off", "local"):
        run = {**RUN, "dp": dp}
        cfg = RunConfig.parse(run)
        nodes = FLOOR if (floor and dp == "local") else {}
        ctx = context(tmp_path / dp, run, **nodes)
        assert not train_fn(train_message(cfg), ctx).has_error()
        w_t = list(initial_weights(cfg))
        results[dp] = _attack_coordinates(
            lambda x, c=ctx: evaluate_fn(evaluate_message(x, rk.DIVERGENCE_EVAL, 2), c),
            w_t, 3)
    truth = _saved_w_prev(tmp_path / "off")
    assert results["off"] is not None
    np.testing.assert_allclose(results["off"], truth[:3], atol=1e-6)
    assert not np.allclose(truth[:3], np.asarray(initial_weights(RunConfig.parse(RUN))[0]
                                                 ).ravel()[:3])  # it trained
    assert results["local"] is None


def _saved_w_prev(state_dir: Path) -> np.ndarray:
    from fedinit.store.state_dir import StateDir

    cfg = RunConfig.parse(RUN)
    saved = StateDir(state_dir, "exp", 1).load_version(1, list(initial_weights(cfg)))
    return saved["w_prev"][0].ravel().astype(np.float64)


@pytest.mark.parametrize(("flag", "kind"), EVALUATE_QUERIES)
def test_every_evaluate_query_is_refused_under_local_dp(
        flag: str | None, kind: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = RunConfig.parse({**RUN, "local-test-fraction": 0.2})
    ctx = context(tmp_path, {**RUN, "local-test-fraction": 0.2}, **FLOOR)
    with caplog.at_level(logging.INFO, logger="flwr"):
        reply = evaluate_fn(evaluate_message(list(initial_weights(cfg)), flag, 3), ctx)
    want = (f"device privacy: refused the evaluate message ({kind}) of round 3: under local "
            "DP this device answers no exact query about its data or state")
    assert reply.has_error() and reply.error.reason == want
    assert privacy_lines(caplog) == [want]


# ---------------------------------------------------------------- train metrics
def test_a_local_dp_reply_carries_no_data_dependent_metric(tmp_path: Path) -> None:
    """Two clients with different data (and a floor or only the run config): the replies'
    metrics are the same data-independent record; with DP off they differ."""
    for dp, nodes in (("local", FLOOR), ("local", {})):
        run = {**RUN, "dp": dp}
        cfg = RunConfig.parse(run)
        metrics = [dict(train_fn(train_message(cfg, cid=p), context(
            tmp_path / f"{dp}{bool(nodes)}{p}", run, cid=p, **nodes)
        ).content.metric_records[rk.METRICS]) for p in (0, 1)]
        assert metrics == [{rk.STATE_FALLBACK: 0}] * 2
    off = {**RUN, "dp": "off"}
    cfg = RunConfig.parse(off)
    plain = [train_fn(train_message(cfg, cid=p), context(None, off, cid=p)).content
             .metric_records[rk.METRICS] for p in (0, 1)]
    assert {rk.NUM_EXAMPLES, rk.TRAIN_LOSS, rk.NUM_STEPS} <= set(plain[0])
    assert plain[0][rk.TRAIN_LOSS] != plain[1][rk.TRAIN_LOSS]


def test_the_server_aggregates_replies_without_metrics_under_local_dp() -> None:
    """strategies.method_strategy: under dp=local a reply without num-examples, train-loss and
    num-steps is accepted (placeholders; uniform weights), and no train-loss is reported."""
    set_task_identity()
    cfg = RunConfig.parse({**RUN, "fraction-train": 1.0})
    w0 = list(initial_weights(cfg))
    s = MethodStrategy(cfg, {p: 1000 + p for p in range(4)}, w0, examples=None)
    msgs = list(s.configure_train(1, ArrayRecord(w0), ConfigRecord(), None))  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    moves = {m.metadata.dst_node_id: [rng.standard_normal(a.shape).astype(np.float32) * 0.01
                                      for a in w0] for m in msgs}
    replies = [Message(content=RecordDict({
        rk.ARRAYS: ArrayRecord(moves[m.metadata.dst_node_id]),
        rk.METRICS: MetricRecord({rk.STATE_FALLBACK: 0}),
        rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: True})}), reply_to=m) for m in msgs]
    arrays, metrics = s.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None
    assert metrics[rk.NUM_REJECTED] == 0 and metrics[rk.NUM_REPLIES] == 4
    assert rk.ROUND_TRAIN_LOSS not in metrics
    want = [w + sum(mv[i].astype(np.float64) for mv in moves.values()) / 4
            for i, w in enumerate(w0)]
    for got, ref in zip(unpack(arrays), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- the device's accountant
def _reference_epsilon(z: float, releases: int, delta: float) -> float:
    """dp_accounting called here: each release one Gaussian of multiplier z / 2 (a clipped
    vector's sensitivity is 2C under replacement), composed, RDP, replace-one."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.GaussianDpEvent(z / 2.0), releases)
    return float(acc.get_epsilon(delta))


def _exact_gaussian_epsilon(z: float, releases: int, delta: float) -> float:
    """The exact epsilon of k composed Gaussians of sensitivity 2, std z: one Gaussian of
    mu = 2 sqrt(k) / z, delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
    (Balle & Wang 2018), solved for eps by bisection."""
    mu = 2.0 * math.sqrt(releases) / z

    def phi(t: float) -> float:
        return 0.5 * math.erfc(-t / math.sqrt(2.0))

    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if phi(-mid / mu + mu / 2) - math.exp(mid) * phi(-mid / mu - mu / 2) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def test_the_device_epsilon_survives_a_restart_and_equals_the_library(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Two rounds, a restart (a new Context: nothing in memory), a third round of a
    SCAFFOLD run (two channels): the ledger in the state dir counts 2 x 1 + 1 x 2 Gaussian
    releases at z = 1.2, logs each round's epsilon, and the epsilon is the library's for 4
    releases, 0-15% above the exact Gaussian epsilon."""
    with caplog.at_level(logging.INFO, logger="flwr"):
        cfg = RunConfig.parse(RUN)
        ctx = context(tmp_path, RUN, **FLOOR)
        for rnd in (1, 2):
            assert not train_fn(train_message(cfg, rnd), ctx).has_error()
        scaffold = {**RUN, "method": "scaffold", "dp-clip-extra": 1.0}
        restarted = context(tmp_path, scaffold, **FLOOR)
        reply = train_fn(train_message(RunConfig.parse(scaffold), 3), restarted)
        assert set(reply.content.array_records) == {rk.ARRAYS, DELTA_C}
    ledger = json.loads((tmp_path / LEDGER_NAME).read_text())
    assert ledger["participations"] == 3
    assert ledger["releases"] == [{"noise-multiplier": 1.2, "channels": 1, "count": 2},
                                  {"noise-multiplier": 1.2, "channels": 2, "count": 1}]
    want = _reference_epsilon(1.2, 4, 1e-5)
    assert ledger["epsilon"] == pytest.approx(want, rel=1e-9)
    exact = _exact_gaussian_epsilon(1.2, 4, 1e-5)
    assert exact <= ledger["epsilon"] <= 1.15 * exact
    assert PrivacyLedger.at(tmp_path / LEDGER_NAME, 1e-5).epsilon() == pytest.approx(want)
    lines = privacy_lines(caplog)
    assert len(lines) == 3
    assert lines[-1] == (f"device privacy: round 3: released 2 channels at noise multiplier "
                         f"1.2; epsilon {want:.4g} at delta 1e-05 after 3 participations "
                         f"(ledger {tmp_path / LEDGER_NAME})")
    assert f"epsilon {_reference_epsilon(1.2, 1, 1e-5):.4g}" in lines[0]


def test_a_device_stops_before_its_epsilon_passes_its_own_limit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """dp-max-epsilon between the library's epsilon after 2 and after 3 releases: a hostile
    server that keeps asking gets two releases, then the refusal; the ledger stays at 2."""
    limit = (_reference_epsilon(1.2, 2, 1e-5) + _reference_epsilon(1.2, 3, 1e-5)) / 2
    cfg = RunConfig.parse(RUN)
    ctx = context(tmp_path, RUN, **FLOOR, **{"dp-max-epsilon": limit})
    with caplog.at_level(logging.INFO, logger="flwr"):
        replies = [train_fn(train_message(cfg, rnd), ctx) for rnd in (1, 2, 3)]
    assert [r.has_error() for r in replies] == [False, False, True]
    after = _reference_epsilon(1.2, 3, 1e-5)
    want = (f"device privacy: refused the train message of round 3: one more release at "
            f"noise multiplier 1.2 would take this device's epsilon to "
            f"{after:.4g} > dp-max-epsilon={limit:.4g} (delta 1e-05)")
    assert float(f"{after:.4g}") > float(f"{limit:.4g}")  # the line reads as true as it is
    assert replies[2].error.reason == want and privacy_lines(caplog)[-1] == want
    assert json.loads((tmp_path / LEDGER_NAME).read_text())["participations"] == 2


def test_a_damaged_ledger_stops_the_release(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Forgetting releases would understate epsilon: an unreadable ledger fails the task
    before it trains (no state saved, nothing released) and is left as it was."""
    (tmp_path / LEDGER_NAME).write_text("{not json")
    cfg = RunConfig.parse(RUN)
    with caplog.at_level(logging.INFO, logger="flwr"):
        reply = train_fn(train_message(cfg), context(tmp_path, RUN, **FLOOR))
    assert reply.has_error() and not reply.has_content()
    assert privacy_lines(caplog) == [
        f"device privacy: the train message of round 1 failed: LedgerError: privacy ledger "
        f"{tmp_path / LEDGER_NAME} is not JSON (Expecting property name enclosed in double "
        "quotes at line 1) (the reply says only that it failed)"]
    assert (tmp_path / LEDGER_NAME).read_text() == "{not json"
    assert not list(tmp_path.rglob("*.npz"))


def test_a_failure_under_local_dp_says_only_that_it_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """An error's text can tell of the data (a schema error names a file and its size):
    under local DP the reply says the task failed and the device's log says why; with DP
    off the error is raised as before (Flower's error reply carries it)."""
    def bad_data(*_: Any) -> Any:
        raise ValueError("/data/mine/coat/0007.png: image is 32x32, the schema says 28x28")

    monkeypatch.setattr("client_app.app.client_tensors", bad_data)
    cfg = RunConfig.parse(RUN)
    with caplog.at_level(logging.INFO, logger="flwr"):
        reply = train_fn(train_message(cfg, 4), context(tmp_path, RUN, **FLOOR))
    assert reply.error.reason == ("device privacy: the train message of round 4 failed on "
                                  "this device; the reason is in its log")
    assert "0007.png: image is 32x32" in privacy_lines(caplog)[0]
    off = {**RUN, "dp": "off"}
    with pytest.raises(ValueError, match="image is 32x32"):
        train_fn(train_message(RunConfig.parse(off)), context(tmp_path / "off", off))


def test_without_a_state_dir_the_ledger_lives_in_the_nodes_memory() -> None:
    cfg = RunConfig.parse(RUN)
    ctx = context(None, RUN)
    for rnd in (1, 2):
        assert not train_fn(train_message(cfg, rnd), ctx).has_error()
    text = ctx.state.config_records["device-privacy-ledger"]["json"]
    assert json.loads(str(text))["participations"] == 2


# ---------------------------------------------------------------- nothing changes without it
def test_without_floor_and_local_dp_train_is_client_round_and_writes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """dp=off, no floor: the reply's arrays are client_round's bit for bit, its metrics the
    usual four (+ state-fallback), no ledger, no privacy log line."""
    run = {**RUN, "dp": "off"}
    cfg = RunConfig.parse(run)
    msg = train_message(cfg)
    with caplog.at_level(logging.INFO, logger="flwr"):
        reply = train_fn(msg, context(tmp_path, run))
    x, y = client_tensors(cfg, 1)
    direct = client_round(cfg, cfg.spec.client(cfg.params), msg.content, ClientStore(),
                          cached_model(cfg), x, y, initial=lambda: initial_weights(cfg),
                          partition_id=1)
    for got, ref in zip(unpack(reply.content.array_records[rk.ARRAYS]),
                        unpack(direct.array_records[rk.ARRAYS]), strict=True):
        assert np.array_equal(got, ref)
    assert set(reply.content.metric_records[rk.METRICS]) == {
        rk.NUM_EXAMPLES, rk.TRAIN_LOSS, rk.NUM_STEPS, rk.COMPUTE_SECONDS, rk.STATE_FALLBACK}
    assert not list(tmp_path.rglob(LEDGER_NAME)) and privacy_lines(caplog) == []


def test_a_diverged_channel_is_released_as_zeros_plus_noise() -> None:
    """Whether training diverged depends on the data: a NaN upload leaves as noise around
    zero (std z C), never as a NaN the server would see and reject."""
    mech = Mechanism(mode="local", clip=0.5, clip_extra=0.5, noise_multiplier=2.0,
                     expected_clients=4)
    bad = [np.full(40_000, np.nan, np.float32)]
    sent, _ = mech.release(bad, {})
    assert np.isfinite(sent[0]).all()
    assert abs(float(sent[0].std()) / (2.0 * 0.5) - 1.0) < 0.05
    assert abs(float(sent[0].mean())) < 0.05
    central, _ = Mechanism("central", 0.5, 0.5, 2.0, 4).release(bad, {})
    assert np.array_equal(central[0], np.zeros(40_000, np.float32))


# ---------------------------------------------------------------- a whole run, in process
def test_a_run_under_device_floors_completes_without_data_dependent_fields(
        tmp_path: Path) -> None:
    """The real server loop against three floored devices, divergence and personalized
    evaluation asked every round: training aggregates, every query is refused and logged by
    the server, rows carry no train-loss, and each device's ledger counts its rounds."""
    run = {**RUN, "num-clients": 3, "fraction-train": 1.0, "num-server-rounds": 2,
           "train-limit": 300, "node-wait-timeout": 3.0, "divergence-every": 1,
           "personal-eval-every": 1, "personal-eval-clients": 0, "local-test-fraction": 0.2,
           "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(run)
    grid = InProcessGrid(3, cfg.to_dict())
    for cid in range(3):
        ctx = grid.context_of(cid)
        ctx.node_config.update({**FLOOR, "state-dir": str(tmp_path / f"node{cid}")})
    summary = run_experiment(grid, cfg, out_dir=tmp_path / "run")
    rows = load_checkpoint(tmp_path / "run").rows  # the server's own rows, withheld ones too
    assert [r["num-replies"] for r in rows] == [3, 3]
    assert all(r["train-loss"] is None and r["client-seconds-max"] is None for r in rows)
    assert all(r.get("divergence-clients") == 0 and r.get("local-eval-clients") == 0
               for r in rows)
    assert summary["final-test-acc"] is not None
    for cid in range(3):
        ledger = json.loads((tmp_path / f"node{cid}" / LEDGER_NAME).read_text())
        assert ledger["participations"] == 2
        assert ledger["epsilon"] == pytest.approx(_reference_epsilon(1.2, 2, 1e-5))
    refused = [r for r in grid.replies if r.has_error()]
    assert len(refused) == 2 * 2 * 3  # divergence + personal evaluation, each round, each node
    assert all(r.error.code == REFUSED for r in refused)


# ---------------------------------------------------------------- distributed DP and the floor
DDP_RUN = {**RUN, "dp": "distributed", "secure-aggregation": "secagg+", "min-replies": 3,
           "personal-eval-every": 0,
           "fraction-train": 1.0, "max-update-norm-ratio": 0.0, "secagg-clip": 8.0}
"""z = 1.2, t_min = 3: each device adds noise multiplier 1.2 / sqrt(3) = 0.6928 itself."""


def test_a_distributed_run_below_the_devices_own_noise_floor_is_refused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A floor of 1.0 against z / sqrt(t_min) = 0.693 (z = 1.2 alone would pass): the
    secure-aggregation query, the train and the evaluate message are each refused in one
    line naming the per-device multiplier; nothing is read or written."""
    cfg = RunConfig.parse(DDP_RUN)
    ctx = context(tmp_path, DDP_RUN, **FLOOR)
    setup = train_message(cfg)
    setup.content.config_records["secagg"] = ConfigRecord({"stage": "secagg-setup"})
    with caplog.at_level(logging.INFO, logger="flwr"):
        replies = [query_fn(setup, ctx), train_fn(train_message(cfg), ctx),
                   evaluate_fn(evaluate_message(list(initial_weights(cfg)), None), ctx)]
    reason = ("run config dp='distributed' gives this device noise multiplier "
              "dp-noise-multiplier / sqrt(min-replies) = 1.2 / sqrt(3) = 0.6928 < this "
              "device's dp-min-noise=1")
    for reply, task in zip(replies, ("secure-aggregation query", "train message",
                                     "evaluate message (evaluation)"), strict=True):
        assert reply.has_error() and reply.error.code == REFUSED
        assert reply.error.reason == f"device privacy: refused the {task} of round 1: {reason}"
    assert privacy_lines(caplog) == [r.error.reason for r in replies]
    assert list(tmp_path.iterdir()) == [] and not ctx.state.config_records
    # the same floor admits z / sqrt(t_min) >= 1 (z = 1.8: 1.039), and a larger clip not
    floor = DeviceFloor.of({**FLOOR, "state-dir": str(tmp_path)})
    assert floor.shortfall(DeviceRelease.of_run(RunConfig.parse(
        {**DDP_RUN, "dp-noise-multiplier": 1.8, "secagg-clip": 12.0}))) is None
    assert floor.shortfall(DeviceRelease.of_run(RunConfig.parse(
        {**DDP_RUN, "dp-noise-multiplier": 1.8, "secagg-clip": 33.0, "dp-clip": 1.5}))) == \
        "run config dp-clip=1.5 > this device's dp-max-clip=1"


def test_a_floored_device_leaves_a_distributed_run_that_goes_on_and_one_meeting_it_counts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """4 devices, all in each round (t_min = 3), z = 0.7: device 3's floor (1.0) is above
    its share 0.7 / sqrt(3) = 0.404 and it refuses at the first query, logging one line;
    device 2's floor (0.3) is met: it trains and its own ledger counts one channel at
    0.404 per round. The rounds go on with 3 uploads."""
    run = {**DDP_RUN, "dp-noise-multiplier": 0.7, "dp-clip": 0.05, "secagg-clip": 1.0,
           "num-server-rounds": 2, "train-limit": 300, "eval-every": 2,
           "personal-eval-every": 0, "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(run)
    grid = InProcessGrid(4, cfg.to_dict())
    grid.context_of(3).node_config.update({**FLOOR, "state-dir": str(tmp_path / "node3")})
    grid.context_of(2).node_config.update({**FLOOR, "dp-min-noise": 0.3,
                                           "state-dir": str(tmp_path / "node2")})
    with caplog.at_level(logging.DEBUG, logger="flwr"):
        run_experiment(grid, cfg, out_dir=tmp_path / "run")
    rows = load_checkpoint(tmp_path / "run").rows  # the server's own rows, withheld ones too
    assert [r["num-replies"] for r in rows] == [3, 3]
    z_dev = 0.7 / math.sqrt(3)
    lines = [ln for ln in privacy_lines(caplog) if ln.startswith("device privacy: refused")]
    # the server's, once a round, in the operator's file: under DP who was sampled is secret
    private = (tmp_path / "run" / OPERATOR_LOG).read_text()
    assert private.count("client 3 (node 1003) dropped: client error: device privacy: "
                         "refused") == 2, private
    assert lines == [f"device privacy: refused the secure-aggregation query of round {r}: run "
                     f"config dp='distributed' gives this device noise multiplier "
                     f"dp-noise-multiplier / sqrt(min-replies) = 0.7 / sqrt(3) = {z_dev:.4g} "
                     f"< this device's dp-min-noise=1" for r in (1, 2)]
    assert not [m for m in grid.sent if m.metadata.dst_node_id == 1003
                and m.metadata.message_type == MessageType.TRAIN]
    ledger = json.loads((tmp_path / "node2" / LEDGER_NAME).read_text())
    assert ledger["participations"] == 2
    assert ledger["releases"] == [{"noise-multiplier": pytest.approx(z_dev), "channels": 1,
                                   "count": 2}]
    assert ledger["epsilon"] == pytest.approx(_reference_epsilon(z_dev, 2, 1e-5))
    assert not (tmp_path / "node3").exists() or not (tmp_path / "node3" / LEDGER_NAME).exists()


# ---------------------------------------------------------------- a process deployment
DEPLOY_PORT = int(os.environ.get("FEDINIT_TEST_DEVICE_PRIVACY_PORT", "43770"))  # +0 +1 +10..12


@pytest.mark.slow
def test_a_deployed_device_refuses_a_run_below_its_floor_file(tmp_path: Path) -> None:
    """fedinit/cli/deploy_local.py, 3 SuperNodes, each with a dp-floor.toml in its state dir; node
    2's floor asks for noise 2 and the run gives 1: node 2 refuses every train message
    (its log has the line, the server logs the rejected reply), the run completes on nodes
    0 and 1, whose ledgers count their two releases."""
    work, out = tmp_path / "deploy", tmp_path / "out"
    for i, noise in ((0, 1.0), (1, 1.0), (2, 2.0)):
        state = work / f"node-{i}" / "client-state"
        state.mkdir(parents=True)
        (state / "dp-floor.toml").write_text(
            f'dp-floor = "local"\ndp-max-clip = 1.0\ndp-min-noise = {noise}\n')
    dep = subprocess.run(
        [sys.executable, "-m", "fedinit.cli.deploy_local", "--num-nodes", "3", "--work-dir",
         str(work), "--base-port", str(DEPLOY_PORT), "--insecure", "--run-timeout", "300",
         "num-server-rounds=2", "fraction-train=1.0", "train-limit=600", "seed=0",
         "dp='local'", "weighting='uniform'", "dp-clip=0.5", "dp-noise-multiplier=1.0",
         "personal-eval-every=0", f"output-dir={out}"],
        capture_output=True, text=True, timeout=400, check=False)
    assert dep.returncode == 0, dep.stdout[-4000:] + dep.stderr[-3000:]
    assert "status finished:completed" in dep.stdout
    rows = load_checkpoint(run_dir(out)).rows  # the server's own rows, withheld ones too
    assert [(r["num-replies"], r["num-rejected"], r["train-loss"]) for r in rows] == [
        (2, 1, None), (2, 1, None)]
    assert all("train-loss" not in r for r in rounds(run_dir(out)))
    for i in (0, 1):
        ledger = json.loads((work / f"node-{i}" / "client-state" / LEDGER_NAME).read_text())
        assert ledger["participations"] == 2
        assert ledger["epsilon"] == pytest.approx(_reference_epsilon(1.0, 2, 1e-5))
    assert not (work / "node-2" / "client-state" / LEDGER_NAME).exists()
    line = ("device privacy: refused the train message of round 1: run config "
            "dp-noise-multiplier=1 < this device's dp-min-noise=2")
    logs = {p.name: p.read_text() for p in (work / "logs").iterdir()}
    assert any(line in text for name, text in logs.items() if "supernode-2" in name), logs.keys()
    # the server's line names a sampled client: under DP in the operator's file, not the log
    assert f"client error: {line}" in (run_dir(out) / OPERATOR_LOG).read_text()
    assert f"client error: {line}" not in dep.stdout
    assert pids_mentioning(str(work)) == []


def guarded_node(state_dir: Path, **floor: object) -> Context:
    """A node of a user's ClientApp whose config holds the device's own floor."""
    return Context(run_id=1, node_id=7, node_config={"state-dir": str(state_dir), **floor},
                   state=RecordDict(), run_config={})


def _guarded_app(asked: list[str]) -> ClientApp:
    """A user's ClientApp with its own train and evaluate handlers, guarded by the mod."""
    app = ClientApp(mods=[device_floor_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        asked.append("train")
        return Message(RecordDict({"metrics": MetricRecord({"n": 1})}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        asked.append("evaluate")  # an exact figure of the device's data
        return Message(RecordDict({"metrics": MetricRecord({"accuracy": 0.93})}),
                       reply_to=msg)

    return app


def _evaluate_message() -> Message:
    msg = user_message("fedavg", {}, np.zeros(D), 1)
    return Message(content=msg.content, message_type=MessageType.EVALUATE, dst_node_id=7)


def test_the_mod_refuses_a_users_own_evaluate_under_the_devices_floor(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Under a local-DP floor a user's ``@app.evaluate()`` never runs: the mod replies a
    refusal in one line; a train message goes on to the handler (where ``method_train``
    applies the floor). Without a floor both run; with an unusable floor neither does."""
    floor = {"dp-floor": "local", "dp-max-clip": 1.0, "dp-min-noise": 1.0}
    asked: list[str] = []
    app = _guarded_app(asked)
    with caplog.at_level(logging.WARNING):
        reply = app(_evaluate_message(), guarded_node(tmp_path / "a", **floor))
    assert reply.has_error() and reply.error.code == REFUSED
    assert reply.error.reason == (
        "device privacy: refused the evaluate message of round 1: under this device's "
        "local-DP floor it answers no exact query about its data; allowed: train messages "
        "(their uploads noised on the device)")
    assert reply.error.reason in caplog.text and asked == []
    trained = app(user_message("fedavg", {}, np.zeros(D), 1), guarded_node(tmp_path / "b", **floor))
    assert not trained.has_error() and asked == ["train"]

    asked.clear()
    plain = app(_evaluate_message(), guarded_node(tmp_path / "c"))
    assert not plain.has_error() and asked == ["evaluate"]
    assert plain.content.metric_records["metrics"]["accuracy"] == 0.93

    asked.clear()
    bad = {"dp-floor": "local", "dp-min-noise": 1.0}  # no dp-max-clip: unusable
    for msg in (_evaluate_message(), user_message("fedavg", {}, np.zeros(D), 1)):
        refused = app(msg, guarded_node(tmp_path / "d", **bad))
        assert refused.has_error() and refused.error.code == REFUSED
        assert "dp-floor='local' needs dp-max-clip" in refused.error.reason
    assert asked == []
