"""Client-level differential privacy (``dp``): clipping, noise, refusals and the accountant.

The clipping bound is checked on the real client path (``client_round`` through
``testbeds.lsq_problem.Federation``) for every method DP runs with, RI on. The noise is checked
statistically on the server's aggregate against the noiseless one computed here with plain
numpy: the tolerance (5%) fails a 20% error in the standard deviation. The accountant is
checked against ``dp_accounting`` called directly with the event the docs state.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedinit.cli.inprocess_grid import InProcessGrid, set_task_identity
from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism, clip, norm
from fedinit.methods.dp_budget import Budget
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.registry import METHODS, composes_with_ri
from fedinit.methods.scaffold import DELTA_C
from fedinit.methods.weights import Weights
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from strategies.method_strategy import MethodStrategy
from testbeds.lsq_problem import Federation, lsq_problem

pytestmark = pytest.mark.usefixtures("quick_runs")

DP = {"dp": "central", "weighting": "uniform"}
DP_METHODS = [m for m in METHODS if m != "fedcm" and composes_with_ri(m)]


# ---------------------------------------------------------------- clipping, client path
@pytest.mark.parametrize("method", DP_METHODS)
def test_clipping_bound_holds_for_every_uploaded_vector_with_ri(method: str) -> None:
    """Every reply's model upload (Delta_i from the RI start point) has norm <= dp-clip and
    every extra upload (SCAFFOLD's Delta_c_i) <= dp-clip-extra, and the bound is reached
    (the clip binds: the unclipped moves are longer)."""
    clip_c, clip_x = 1e-3, 2e-3
    f = Federation(lsq_problem(num_clients=6, dim=4, n=10, seed=2),
                   {"method": method, "fraction-train": 0.5, "batch-size": 5, "lr": 0.05,
                    "beta": 0.1, **DP, "dp-clip": clip_c, "dp-clip-extra": clip_x})
    assert f.cfg.train.ri_aggregation == "update"
    seen: dict[str, list[float]] = {}
    for _ in range(3):
        f.step()
        for reply in f.replies:
            for key, record in reply.content.array_records.items():
                seen.setdefault(key, []).append(norm(unpack(record)))
    assert set(seen) == {rk.ARRAYS, *f.strategy.rule.up_keys}
    for key, norms in seen.items():
        bound = clip_c if key == rk.ARRAYS else clip_x
        assert max(norms) <= bound * (1 + 1e-6), (key, max(norms))
        assert max(norms) >= bound * (1 - 1e-6), (key, max(norms))


def test_local_release_is_the_clipped_upload_plus_noise_of_z_times_the_bound() -> None:
    """Local DP: upload - clip(upload) is N(0, (z C)^2) per coordinate, drawn by the client;
    the extra channel gets z x its own bound."""
    mech = Mechanism(mode="local", clip=0.5, clip_extra=2.0, noise_multiplier=1.3,
                     expected_clients=4)
    rng = np.random.default_rng(0)
    up = [rng.standard_normal((100, 100)).astype(np.float32), np.ones(50_000, np.float32)]
    extra = [rng.standard_normal(60_000).astype(np.float32)]
    sent, extras = mech.release(up, {DELTA_C: extra})
    for got, plain, bound in ((sent, up, 0.5), (extras[DELTA_C], extra, 2.0)):
        noise = np.concatenate([(g.astype(np.float64) - c).ravel()
                                for g, c in zip(got, clip(plain, bound), strict=True)])
        assert abs(noise.std() / (1.3 * bound) - 1.0) < 0.05
        assert abs(noise.mean()) < 0.05 * 1.3 * bound


def test_off_releases_the_upload_unchanged() -> None:
    up = [np.full(3, 100.0, np.float32)]
    sent, extras = Mechanism("off", 1.0, 1.0, 1.0, 2).release(up, {"x": up})
    assert sent is up and extras == {"x": up}


# ---------------------------------------------------------------- noise on the server
D_MODEL = 30_000


def strategy(method: str, mode: str, n: int, **over: object) -> MethodStrategy:
    set_task_identity()
    cfg = RunConfig.parse({"method": method, "num-clients": n, "fraction-train": 1.0,
                           "output-dir": "/tmp/unused", "dp": mode, "weighting": "uniform",
                           **over})
    return MethodStrategy(cfg, {p: 1000 + p for p in range(n)},
                          [np.zeros(D_MODEL, np.float32)], examples=[10] * n)


def aggregate(s: MethodStrategy, uploads: dict[int, Weights],
              extras: dict[int, Weights] | None = None) -> Weights:
    """One round in which client i (of those in ``uploads``) replies ``uploads[i]``."""
    w_t = ArrayRecord([np.zeros(D_MODEL, np.float32)])
    msgs = list(s.configure_train(1, w_t, ConfigRecord(), cast(Grid, None)))
    replies = []
    for msg in msgs:
        i = msg.metadata.dst_node_id - 1000
        if i not in uploads:
            continue
        more = {DELTA_C: ArrayRecord(extras[i])} if extras else {}
        content = RecordDict({rk.ARRAYS: ArrayRecord(uploads[i]), rk.METRICS: MetricRecord(
            {rk.NUM_EXAMPLES: 10, rk.TRAIN_LOSS: 0.1, rk.NUM_STEPS: 2}),
            rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: True}), **more})
        replies.append(Message(content=content, reply_to=msg))
    arrays, metrics = s.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None and metrics[rk.NUM_REJECTED] == 0
    return unpack(arrays)


def big_moves(n: int, seed: int) -> dict[int, Weights]:
    """Moves of norm ~ 10..50: far above the clip, and above any norm-filter limit of one."""
    rng = np.random.default_rng(seed)
    return {i: [(rng.standard_normal(D_MODEL) * (0.06 + 0.2 * i)).astype(np.float32)]
            for i in range(n)}


def assert_noise_std(got: np.ndarray, noiseless: np.ndarray, want: float) -> None:
    noise = got.astype(np.float64) - noiseless
    assert abs(noise.std() / want - 1.0) < 0.05, (noise.std(), want)
    assert abs(noise.mean()) < 0.05 * want


@pytest.mark.parametrize("replying", [5, 3])
def test_central_noise_has_std_z_clip_over_the_fixed_m(replying: int) -> None:
    """w_{t+1} - (sum of the clipped moves) / m has std z C / m per coordinate, m = 5 the
    clients per round also when only 3 replied (fixed denominator, same noise on the sum);
    the outsized moves are clipped, not dropped by the norm filter."""
    s = strategy("fedavg", "central", 5, **{"dp-clip": 0.7, "dp-noise-multiplier": 1.5})
    moves = {i: m for i, m in big_moves(5, seed=1).items() if i < replying}
    got = aggregate(s, moves)[0]
    noiseless = sum(clip(m, 0.7)[0].astype(np.float64) for m in moves.values()) / 5
    assert_noise_std(got, noiseless, 1.5 * 0.7 / 5)


def test_local_server_adds_no_noise_and_divides_by_m() -> None:
    s = strategy("fedavg", "local", 4, **{"dp-clip": 0.7})
    moves = big_moves(3, seed=2)  # as if clipped and noised by the clients; one missing
    got = aggregate(s, moves)[0]
    want = sum(m[0].astype(np.float64) for m in moves.values()) / 4
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_scaffold_clips_and_noises_delta_c_as_its_own_channel() -> None:
    """c <- c + (sum clip(Delta_c_i, C_x) + N(0, (z C_x)^2)) / N and the model's own channel
    with C: both noises at their own scale."""
    s = strategy("scaffold", "central", 4, **{"dp-clip": 0.5, "dp-clip-extra": 3.0,
                                              "dp-noise-multiplier": 0.8})
    moves, dcs = big_moves(4, seed=3), big_moves(4, seed=4)
    got = aggregate(s, moves, dcs)[0]
    assert_noise_std(got, sum(clip(m, 0.5)[0].astype(np.float64) for m in moves.values()) / 4,
                     0.8 * 0.5 / 4)
    c = s.state.c[0]  # type: ignore[attr-defined]
    assert_noise_std(c, sum(clip(d, 3.0)[0].astype(np.float64) for d in dcs.values()) / 4,
                     0.8 * 3.0 / 4)


def test_dp_samples_from_a_secret_seed() -> None:
    """Under DP who is sampled must not follow from the public seed."""
    picks = set()
    for _ in range(3):
        s = strategy("fedavg", "central", 100, **{"fraction-train": 0.1})
        msgs = s.configure_train(1, ArrayRecord([np.zeros(D_MODEL, np.float32)]),
                                 ConfigRecord(), cast(Grid, None))
        picks.add(tuple(sorted(m.metadata.dst_node_id for m in msgs)))
    assert len(picks) == 3


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(("over", "key"), [
    ({"ri-aggregation": "model"}, "ri-aggregation='model'"),
    ({"weighting": "examples"}, "weighting='examples'"),
    ({"aggregation": "median"}, "aggregation='median'"),
    ({"method": "fedcm"}, "dp='central'"),
    ({"dp-clip": 0.0}, "dp-clip=0.0"),
    ({"dp-noise-multiplier": 0.0}, "dp-noise-multiplier=0.0"),
    ({"dp-delta": 1.0}, "dp-delta=1.0"),
    ({"dp": "centrl"}, "did you mean 'central'"),
])
def test_refused_with_one_line(over: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**DP, **over})
    assert key in str(err.value) and "\n" not in str(err.value)


def test_fedcm_refuses_dp_with_its_own_reason() -> None:
    """FedCM's server half says why DP cannot run with it (``dp_refusal``), as a method's
    robust refusal is said; the line is the one ``fedinit/methods/dp.py``'s table gave before."""
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**DP, "method": "fedcm"})
    assert str(err.value) == (
        "run config: dp='central' is not allowed; allowed: off with method='fedcm' (its "
        "momentum d = -D / (K eta) divides by the clients' reported step counts K, which "
        "depend on their data and are not privatized)")


def test_a_methods_dp_refusal_is_read_from_its_server_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Any method whose ``ServerRule`` names a reason is refused under every DP mode, with
    that reason; off, it runs."""
    rule = type("Refusing", (METHODS["scaffold"].server,), {"dp_refusal": "a reason"})
    monkeypatch.setattr("fedinit.methods.scaffold.SPEC",
                        dataclasses.replace(METHODS["scaffold"], server=rule))
    for mode in ("central", "local"):
        with pytest.raises(ConfigError, match=rf"dp='{mode}' is not allowed; allowed: off "
                                              r"with method='scaffold' \(a reason\)$"):
            RunConfig.parse({**DP, "dp": mode, "method": "scaffold"})
    assert RunConfig.parse({"method": "scaffold"}).privacy.dp == "off"


@pytest.mark.parametrize("method", DP_METHODS)
def test_auto_is_update_under_dp(method: str) -> None:
    assert RunConfig.parse({**DP, "method": method}).train.ri_aggregation == "update"


# ---------------------------------------------------------------- accountant
def test_epsilon_equals_the_library_reference() -> None:
    """Central DP, N=100, m=10 without replacement, z=1.1, 30 rounds: the library's RDP
    accountant on that event (replace-one: multiplier z / 2) gives the same epsilon."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    ref = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    ref.compose(dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(0.55)), 30)
    want = ref.get_epsilon(1e-5)
    budget = Budget("central", 1.1, 1, 100, 10, 1e-5)
    assert budget.epsilon(30) == pytest.approx(want, rel=1e-9)
    assert 0.0 < want < math.inf
    local = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    local.compose(dpa.GaussianDpEvent(0.55), 30)
    assert Budget("local", 1.1, 1, 100, 10, 1e-5).epsilon(30) == pytest.approx(
        local.get_epsilon(1e-5), rel=1e-9)
    assert Budget("local", 1.1, 1, 100, 10, 1e-5).epsilon(30) > want  # no amplification


def test_central_epsilon_is_never_above_the_unsampled_gaussian() -> None:
    """At small noise and half the clients sampled the library's sampling bound is the larger:
    the smaller of the two library bounds is reported (sampling never costs privacy)."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    sampled = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    sampled.compose(dpa.SampledWithoutReplacementDpEvent(10, 5, dpa.GaussianDpEvent(0.25)), 5)
    plain = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    plain.compose(dpa.GaussianDpEvent(0.25), 5)
    assert sampled.get_epsilon(1e-5) > plain.get_epsilon(1e-5)  # the case this guards
    assert Budget("central", 0.5, 1, 10, 5, 1e-5).epsilon(5) == pytest.approx(
        plain.get_epsilon(1e-5), rel=1e-9)


def test_two_channels_cost_as_one_gaussian_of_z_over_sqrt2() -> None:
    """Two channels each noised at z x bound are one Gaussian of multiplier z / sqrt(2)."""
    two = Budget("central", 2.0, 2, 50, 5, 1e-6)
    one = Budget("central", 2.0 / math.sqrt(2.0), 1, 50, 5, 1e-6)
    assert two.epsilon(7) == pytest.approx(one.epsilon(7), rel=1e-9)
    assert two.epsilon(7) > Budget("central", 2.0, 1, 50, 5, 1e-6).epsilon(7)


def test_epsilon_grows_with_rounds_and_recounts_backwards() -> None:
    b = Budget("central", 1.0, 1, 20, 4, 1e-5)
    eps = [b.epsilon(t) for t in (1, 2, 5, 10)]
    assert eps == sorted(eps) and len(set(eps)) == 4
    assert b.epsilon(2) == eps[1]
    assert Budget("central", 1.0, 1, 20, 4, 1e-5).epsilon(5) == eps[2]


# ---------------------------------------------------------------- a run
SMALL = {"num-clients": 3, "fraction-train": 0.67, "num-server-rounds": 4, "train-limit": 300,
         "local-epochs": 1, "batch-size": 50, "node-wait-timeout": 3.0, **DP,
         "dp-noise-multiplier": 2.0, "dp-clip": 0.05}


def test_run_reports_epsilon_each_round_and_stops_at_the_target(tmp_path: Path) -> None:
    """rounds.jsonl carries dp-epsilon, growing; a target between round 2's and round 3's
    epsilon stops the run after round 2 with its checkpoint and summary."""
    cfg0 = RunConfig.parse({**SMALL, "output-dir": str(tmp_path)})
    b = Budget.for_run(cfg0, channels=1)
    target = (b.epsilon(2) + b.epsilon(3)) / 2
    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp_path), "dp-target-epsilon": target})
    summary = run_experiment(InProcessGrid(3, cfg.to_dict()), cfg, out_dir=tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text()
            .splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert [r["dp-epsilon"] for r in rows] == pytest.approx([b.epsilon(1), b.epsilon(2)])
    assert rows[0]["dp-epsilon"] < rows[1]["dp-epsilon"] <= target
    assert summary["dp-epsilon"] == pytest.approx(b.epsilon(2))
    assert "dp-epsilon" in (tmp_path / "run" / "rounds.csv").read_text().splitlines()[0]
    assert load_checkpoint(tmp_path / "run").server_round == 2


def test_a_target_below_round_one_is_refused(tmp_path: Path) -> None:
    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp_path), "dp-target-epsilon": 1e-3})
    with pytest.raises(ConfigError, match="dp-target-epsilon=0.001"):
        run_experiment(InProcessGrid(3, cfg.to_dict()), cfg, out_dir=tmp_path / "run")
