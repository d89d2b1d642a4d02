"""Distributed DP (``dp=distributed`` with ``secure-aggregation=secagg+``): each device clips
its upload to C and adds N(0, (z C)^2 / t_min), t_min = ``min-replies``; the server unmasks
only sums of at least t_min uploads and adds nothing; the accountant counts the round as
``central`` does (docs/algorithms.md, "Distributed DP").

The stage tests drive ``SecAggRound`` and ``SecureSum`` with protocol clients whose inputs go
through the devices' own ``Mechanism.release``; the whole runs go through the real server
loop and ClientApp handlers in this process (``InProcessGrid``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Message, MessageType

import fedinit.methods.dp as dp_module
from fedinit.cli.inprocess_grid import InProcessGrid, set_task_identity
from fedinit.config import ConfigError, RunConfig
from fedinit.methods.dp import CLIP_SIGMAS, Mechanism, min_secagg_clip
from fedinit.methods.dp_budget import Budget
from fedinit.methods.packed_arrays import unpack
from fedinit.secure_aggregation import SecAggClient
from fedinit.secure_aggregation import wire as sw
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from strategies.round_stages.replies import RoundReplies
from strategies.round_stages.secure_sum import SECAGG, SecAggRound, SecureSum, params_of
from tests.test_secagg_run import ProtocolGrid, masked_replies

pytestmark = pytest.mark.usefixtures("quick_runs")  # no test here reads a plot

DDP: dict[str, Any] = {"secure-aggregation": "secagg+", "dp": "distributed",
                       "weighting": "uniform", "max-update-norm-ratio": 0.0, "min-replies": 3,
                       "personal-eval-every": 0}


# ------------------------------------------------------------------ the stage, many times
def secure_round(cfg: RunConfig, ids: list[int], inputs: dict[int, list[np.ndarray]],
                 lost: set[int], mech: Mechanism) -> tuple[RoundReplies, int]:
    """One SecAgg+ round: key exchange, each client not in ``lost`` masks
    ``mech.release(inputs[i])`` (its clip and its noise share, fresh OS entropy), then the
    pipeline's SecureSum; returns the stage's result and the unmask messages sent."""
    set_task_identity()
    grid = ProtocolGrid(ids)
    session = SecAggRound(params_of(cfg))
    w_t = [np.zeros(a.shape, dtype=np.float32) for a in inputs[ids[0]]]
    sent_to, replies, accepted = masked_replies(
        grid, session, w_t, ids,
        lambda i: None if i in lost else mech.release(inputs[i], {})[0])
    unmasks = []
    exchange = session.exchange

    def counting(outgoing: Any) -> Any:
        unmasks.append(len(outgoing))
        return exchange(outgoing)

    session.exchange = counting  # type: ignore[method-assign]
    stage = SecureSum(session, denominator=mech.expected_clients,
                      min_survivors=mech.noise_shares)
    rnd = RoundReplies(1, w_t, sent_to, len(ids), tuple(replies), accepted=accepted)
    return stage(rnd), sum(unmasks)


def test_the_unmasked_sum_carries_the_noise_the_accountant_assumes() -> None:
    """Per coordinate, the sum of s survivors' uploads minus their clipped inputs has variance
    z^2 C^2 s / t_min (>= z^2 C^2 when s >= t_min), estimated over many secure rounds on fixed
    small inputs and compared within 5 standard errors of the variance estimate."""
    z, clip = 1.3, 0.5
    cfg = RunConfig.parse({**DDP, "num-clients": 5, "fraction-train": 1.0,
                           "dp-noise-multiplier": z, "dp-clip": clip, "secagg-clip": 16.0})
    mech = Mechanism.from_config(cfg)
    t_min, m = 3, 5
    assert (mech.mode, mech.noise_shares, mech.expected_clients) == ("distributed", t_min, m)
    ids = list(range(5))
    rng = np.random.default_rng(7)
    inputs = {i: [rng.uniform(-1e-3, 1e-3, (40, 5)).astype(np.float32)] for i in ids}
    step = params_of(cfg).step  # the stochastic rounding adds < one step per upload
    for lost, rounds in ((set(), 12), ({4}, 12)):
        s = len(ids) - len(lost)
        clipped_sum = np.sum([inputs[i][0].astype(np.float64) for i in ids if i not in lost],
                             axis=0)  # each input's norm is < C: clip leaves it
        residuals = []
        for _ in range(rounds):
            done, _ = secure_round(cfg, ids, inputs, lost, mech)
            assert not done.halted and done.aggregate is not None
            total = done.aggregate[0].astype(np.float64) * m  # D = sum / m (fixed m)
            residuals.append(total - clipped_sum)
        res = np.concatenate([r.ravel() for r in residuals])
        n = res.size
        want = z**2 * clip**2 * s / t_min
        got = float(np.mean(res**2))  # the mean is 0: the noise is centred
        se = want * math.sqrt(2.0 / n)  # std of the estimate of a Gaussian's variance
        quant = s * step**2  # at most this much variance from the rounding
        assert abs(got - want) <= 5 * se + quant, (s, got, want, se)
        assert got >= z**2 * clip**2 - 5 * se  # at least the central mechanism's noise
        assert abs(float(np.mean(res))) <= 5 * math.sqrt(want / n)


def test_a_round_below_t_min_unmasks_nothing() -> None:
    """t_min = 4 of 5 and two uploads lost: SecAgg+ (threshold 3) could unmask the three, but
    their sum would carry 3/4 of the noise: the stage halts before any unmask query."""
    cfg = RunConfig.parse({**DDP, "num-clients": 5, "fraction-train": 1.0, "min-replies": 4,
                           "secagg-clip": 12.0})
    mech = Mechanism.from_config(cfg)
    ids = list(range(5))
    inputs = {i: [np.full((3,), 0.01, dtype=np.float32)] for i in ids}
    done, unmask_queries = secure_round(cfg, ids, inputs, {1, 3}, mech)
    assert done.halted and done.aggregate is None and unmask_queries == 0
    done, unmask_queries = secure_round(cfg, ids, inputs, {1}, mech)  # 4 = t_min: released
    assert not done.halted and unmask_queries == 4


# ------------------------------------------------------------------ the device's clip
def test_each_upload_is_clipped_to_c_then_noised_with_its_share() -> None:
    """The release is v C / ||v|| (for ||v|| > C) plus N(0, (z C)^2 / t_min) per coordinate:
    recomputed here from the same seeded generator, and OS-seeded when none is given."""
    cfg = RunConfig.parse({**DDP, "dp-noise-multiplier": 0.8, "dp-clip": 0.3,
                           "min-replies": 4, "secagg-clip": 5.0})
    mech = Mechanism.from_config(cfg)
    rng = np.random.default_rng(11)
    v = [rng.normal(size=(6, 7)).astype(np.float32), rng.normal(size=(9,)).astype(np.float32)]
    length = math.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in v))
    assert length > 10 * 0.3
    std = 0.8 * 0.3 / math.sqrt(4)
    out, _ = mech.release(v, {}, rng=np.random.default_rng(5))
    again = np.random.default_rng(5)
    noise = [again.normal(0.0, std, a.shape) for a in v]
    want = [a.astype(np.float64) * 0.3 / length + n for a, n in zip(v, noise, strict=True)]
    for o, w in zip(out, want, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-6, atol=1e-7)
    short = [a * np.float32(0.01 / length) for a in v]  # inside the bound: not scaled
    out, _ = mech.release(short, {}, rng=np.random.default_rng(5))
    again = np.random.default_rng(5)
    for o, a in zip(out, short, strict=True):
        np.testing.assert_allclose(o, a + again.normal(0.0, std, a.shape), rtol=1e-6,
                                   atol=1e-7)
    a1, _ = mech.release(v, {})
    a2, _ = mech.release(v, {})
    assert not np.array_equal(a1[0], a2[0])  # fresh OS entropy: never the same draw
    assert Mechanism.from_config(RunConfig.parse({})).device_std() == 0.0


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(("over", "line"), [
    ({"secure-aggregation": "off"},
     "dp='distributed' is not allowed; allowed: off | central | local with secure-aggregation="
     "'off' (distributed: each upload carries only 1/min-replies of the noise's variance, "
     "safe only inside the secure sum; set secure-aggregation='secagg+')"),
    ({"min-replies": 2},
     "min-replies=2 is not allowed; allowed: secagg-threshold (3) to the clients per round "
     "(10) with dp='distributed' (min-replies is t_min"),
    ({"secagg-clip": 12.0},
     "secagg-clip=12.0 is not allowed; allowed: >= 12.55 with dp='distributed' (dp-clip + 20 "
     "device noise stds z dp-clip / sqrt(min-replies)"),
    ({"dp": "central"}, "dp='central' is not allowed; allowed: off | distributed with "
                        "secure-aggregation='secagg+' (central clips and noises each reply"),
    ({"dp": "local"}, "dp='local' is not allowed; allowed: off | distributed with"),
    ({"method": "fedcm"}, "dp='distributed' is not allowed; allowed: off with method='fedcm'"),
])
def test_what_cannot_hold_is_refused_in_one_line(over: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError, match="^run config: ") as err:
        RunConfig.parse({**DDP, "secagg-clip": 12.6, **over})
    assert "\n" not in str(err.value)
    assert line in str(err.value), str(err.value)


def test_the_defaults_with_the_smallest_clip_are_accepted() -> None:
    c = min_secagg_clip(1.0, 1.0, 3)
    assert c == pytest.approx(1.0 + CLIP_SIGMAS / math.sqrt(3))
    cfg = RunConfig.parse({**DDP, "secagg-clip": c})
    assert (cfg.privacy.dp, cfg.fleet.min_replies, cfg.privacy.secagg_threshold) == (
        "distributed", 3, 3)


# ------------------------------------------------------------------ whole runs
BASE: dict[str, Any] = {
    "num-clients": 4, "fraction-train": 0.75, "num-server-rounds": 2, "train-limit": 300,
    "local-epochs": 1, "eval-every": 2, "personal-eval-every": 0, "tracking": "off",
    "dp-clip": 0.05, "dp-noise-multiplier": 0.7}
"""4 clients, 3 of them per round (t = 3, the complete graph), 2 short rounds; the clip at
0.05 is active (a round's move of the CNN is longer) and c = 1 is above 0.05 + 20 std."""


def epsilons(n: int, m: int, z: float, rounds: int, delta: float) -> float:
    """Replace-one epsilon recomputed from dp-accounting: m of n without replacement, each
    round a Gaussian of multiplier z / 2 (sensitivity 2 C), the smaller of the sampled and the
    plain bound (both hold)."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    out = []
    for event in (dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(z / 2)),
                  dpa.GaussianDpEvent(z / 2)):
        acc = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
        acc.compose(event, rounds)
        out.append(float(acc.get_epsilon(delta)))
    return min(out)


def test_a_distributed_dp_run_completes_clipped_and_accounted_as_central(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = {**BASE, **DDP, "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    noises: list[list[np.ndarray]] = []
    masked_inputs: list[list[np.ndarray]] = []
    real_noise, real_handle = dp_module.gaussian_like, SecAggClient.handle

    def noise(vec: Any, std: float, rng: np.random.Generator) -> Any:
        out = real_noise(vec, std, rng)
        noises.append(out)
        return out

    def handle(self: SecAggClient, msg: dict[str, Any], upload: Any = None) -> Any:
        if upload is not None:
            masked_inputs.append([np.asarray(a, dtype=np.float64) for a in upload])
        return real_handle(self, msg, upload) if upload is not None else real_handle(self, msg)

    monkeypatch.setattr(dp_module, "gaussian_like", noise)
    monkeypatch.setattr(SecAggClient, "handle", handle)
    torch.set_num_threads(1)
    grid = InProcessGrid(4, raw)
    run_experiment(grid, cfg, out_dir=tmp_path / "ddp")
    ck = load_checkpoint(tmp_path / "ddp")
    # (e) it completes: 2 rounds of 3 uploads each, a finite accuracy, a finite model
    assert [r["num-replies"] for r in ck.rows] == [3, 3]
    assert math.isfinite(ck.rows[-1]["test-acc"])
    assert all(np.isfinite(w).all() for w in ck.weights)
    # (b) every masked input minus its own noise draw is within C: clipped before noise;
    # and the noise had the share's std z C / sqrt(t_min)
    assert len(noises) == len(masked_inputs) == 6
    std = 0.7 * 0.05 / math.sqrt(3)
    norms = []
    for up, n in zip(masked_inputs, noises, strict=True):
        norms.append(math.sqrt(sum(float(np.sum((u - x) ** 2)) for u, x in
                                   zip(up, n, strict=True))))
        flat = np.concatenate([x.ravel() for x in n])
        assert abs(float(np.std(flat)) / std - 1) < 0.01  # 10^5 coordinates
    assert max(norms) <= 0.05 * (1 + 1e-4), norms
    assert min(norms) >= 0.05 * (1 - 1e-4)  # the clip was active: every move was longer
    # no train reply carries a plain array (the server saw only the masked uploads)
    for reply in grid.replies:
        assert not reply.content.array_records or reply.metadata.message_type != \
            MessageType.TRAIN
    # (c) epsilon as central for the same z, m, N, rounds: recomputed from dp-accounting
    # and the project's accountant for the same config with dp=central
    central = RunConfig.parse({**BASE, "dp": "central", "weighting": "uniform",
                               "max-update-norm-ratio": 0.0})
    budget = Budget.for_run(central, channels=1)
    for row in ck.rows:
        rounds = row["dp-rounds-counted"]
        indep = epsilons(4, 3, 0.7, rounds, cfg.privacy.dp_delta)
        assert row["dp-epsilon"] == pytest.approx(indep, rel=1e-9)
        assert row["dp-epsilon"] == pytest.approx(budget.epsilon(rounds), rel=1e-12)
        assert row["dp-epsilon-add-remove"] == pytest.approx(
            budget.epsilon_add_remove(rounds), rel=1e-12)
    assert [r["dp-rounds-counted"] for r in ck.rows] == [1, 2]
    assert (tmp_path / "ddp" / "privacy_ledger.json").is_file()
    # the sample is DP's: m of all N from a secret seed, who trained left out of the rows
    assert all("clients-trained" not in r for r in ck.rows)


def test_a_round_with_too_few_uploads_releases_nothing_and_still_counts(
        tmp_path: Path) -> None:
    """One of the 3 uploads of round 1 is lost: 2 < t_min = 3, nothing is unmasked, the model
    stays, and the round was counted before its train messages left (count before release);
    round 2 releases."""
    raw = {**BASE, **DDP, "output-dir": str(tmp_path)}
    grid = InProcessGrid(4, raw)
    first: list[int] = []

    def drop(reply: Message) -> Message | None:
        if reply.metadata.message_type != MessageType.TRAIN:
            return reply
        first.append(reply.metadata.src_node_id)
        return None if len(first) == 1 else reply

    grid.reply_filter = drop
    torch.set_num_threads(1)
    run_experiment(grid, RunConfig.parse(raw), out_dir=tmp_path / "ddp")
    rows = load_checkpoint(tmp_path / "ddp").rows
    assert [r["num-replies"] for r in rows] == [2, 3]
    assert [r["dp-rounds-counted"] for r in rows] == [1, 2]
    trains = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    w0, w1 = (unpack(trains[i].content.array_records["arrays"]) for i in (0, 3))
    for a, b in zip(w0, w1, strict=True):
        np.testing.assert_array_equal(a, b)  # round 1 released nothing
    unmasks = [m for m in grid.sent if SECAGG in m.content.config_records
               and m.content.config_records[SECAGG][sw.STAGE] == "secagg-unmask"]
    assert len(unmasks) == 3  # round 2's only
