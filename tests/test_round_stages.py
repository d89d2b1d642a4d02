"""The server's round stages (``strategies/round_stages/``), each on its own against a plain
numpy computation, and the pipeline they form: a stage can be inserted without touching the
others, and only the builder reads whether DP is on."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.sampling import sample_clients
from fedinit.methods.weights import Weights
from strategies.method_strategy import MethodStrategy
from strategies.round_stages import RoundReplies
from strategies.round_stages.combine import Combine, RobustMean
from strategies.round_stages.decode import DecodeReplies
from strategies.round_stages.held import HeldMethod
from strategies.round_stages.norm_filter import NormFilter
from strategies.round_stages.privacy import ClientLevelDp
from strategies.round_stages.quorum import MinReplies
from strategies.round_stages.sampling import AvailableSampler, RegisteredSampler

SIZES = (30, 50, 70, 90)
W_T: Weights = [np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3),
                np.array([0.5, -0.25, 2.0], np.float32)]
SENT_TO = {1000 + p: p for p in range(4)}


def config(**raw: Any) -> RunConfig:
    set_task_identity()
    return RunConfig.parse({"method": "fedavg", "num-clients": 4, "fraction-train": 1.0,
                            "beta": 0.0, "ri-aggregation": "update", "output-dir": "/tmp/x",
                            **raw})


def strategy(**raw: Any) -> MethodStrategy:
    cfg = config(**raw)
    return MethodStrategy(cfg, {p: 1000 + p for p in range(4)}, W_T, examples=SIZES)


def request(cid: int) -> Message:
    set_task_identity()
    return Message(content=RecordDict(), message_type="train", dst_node_id=1000 + cid)


def move(cid: int, length: float) -> Weights:
    """A model-shaped move of L2 norm ``length`` (all arrays jointly), different per client."""
    r = np.random.default_rng(10 + cid)
    vec = [r.standard_normal(a.shape) for a in W_T]
    scale = length / math.sqrt(sum(float(np.sum(v ** 2)) for v in vec))
    return [(scale * v).astype(np.float32) for v in vec]


def reply(cid: int, up: Weights | None = None, *, metrics: dict[str, Any] | None = None,
          delta: bool = True, drop: str = "") -> Message:
    """Client ``cid``'s well-formed reply (``up``, its true counts), or with ``metrics``
    overriding, the upload-delta flag ``delta``, or the record ``drop`` left out."""
    m = {rk.NUM_EXAMPLES: SIZES[cid], rk.TRAIN_LOSS: 0.5,
         rk.NUM_STEPS: math.ceil(SIZES[cid] / 32) * 2, **(metrics or {})}
    records: dict[str, Any] = {rk.ARRAYS: ArrayRecord(up if up is not None else move(cid, 0.1)),
                               rk.METRICS: MetricRecord(m),
                               rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: delta})}
    records.pop(drop, None)
    return Message(content=RecordDict(records), reply_to=request(cid))


def round_of(messages: list[Message], rnd: int = 1, sampled: int = 4) -> RoundReplies:
    return RoundReplies(rnd, W_T, SENT_TO, sampled, tuple(messages))


# ---------------------------------------------------------------- decoding and checks
NAN = [W_T[0].copy(), W_T[1].copy()]
NAN[1][2] = np.nan
BAD_REPLIES: list[tuple[str, Any, str]] = [
    ("client error", lambda: Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                           reason="boom"), reply_to=request(1)),
     "client error: boom"),
    ("not sampled", lambda: reply(1),
     "reply from a node that was not sampled this round"),
    ("no metrics", lambda: reply(1, drop=rk.METRICS), f"missing MetricRecord {rk.METRICS!r}"),
    ("no upload", lambda: reply(1, drop=rk.ARRAYS), f"missing ArrayRecord {rk.ARRAYS!r}"),
    ("wrong flag", lambda: reply(1, delta=False),
     f"the reply says {rk.UPLOAD_DELTA}=False; the round asked for Delta_i"),
    ("zero examples", lambda: reply(1, metrics={rk.NUM_EXAMPLES: 0}),
     f"{rk.NUM_EXAMPLES}=0 is not a positive integer"),
    ("false count", lambda: reply(1, metrics={rk.NUM_EXAMPLES: 51}),
     f"{rk.NUM_EXAMPLES}=51, but partition 1 holds 50 examples"),
    ("nan loss", lambda: reply(1, metrics={rk.TRAIN_LOSS: math.nan}),
     f"{rk.TRAIN_LOSS}=nan is not finite"),
    ("one array", lambda: reply(1, up=[W_T[0]]), f"{rk.ARRAYS!r} has 1 arrays, expected 2"),
    ("shape", lambda: reply(1, up=[W_T[0].T.copy(), W_T[1]]),
     f"{rk.ARRAYS!r}[0] has shape (3, 4), expected (4, 3)"),
    ("dtype", lambda: reply(1, up=[W_T[0].astype(np.float64), W_T[1]]),
     f"{rk.ARRAYS!r}[0] has dtype float64, expected float32"),
    ("nan upload", lambda: reply(1, up=NAN), f"{rk.ARRAYS!r}[1] holds NaN or Inf"),
]


@pytest.mark.parametrize(("kind", "make", "reason"), BAD_REPLIES, ids=[b[0] for b in BAD_REPLIES])
def test_the_decode_stage_rejects_each_bad_reply_with_its_reason(
        kind: str, make: Any, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    cfg = config()
    stage = DecodeReplies(cfg, cfg.spec.server(cfg.params), SIZES)
    sent_to = {n: p for n, p in SENT_TO.items() if kind != "not sampled" or p != 1}
    msg = make()
    assert stage.decode(msg, sent_to, W_T) == reason
    done = stage(RoundReplies(1, W_T, sent_to, 4, (reply(3), msg, reply(0))))
    assert done.rejected == 1 and [u.partition_id for _, u in done.accepted] == [0, 3]


def test_the_decode_stage_sorts_counts_missing_and_arrived() -> None:
    """4 sampled; replies of 3, 0 (good), 2 (never delivered: the SuperLink's own error) and
    1 (its ClientApp raised): accepted in client order, 2 rejected, 0 missing, 3 arrived."""
    cfg = config()
    stage = DecodeReplies(cfg, cfg.spec.server(cfg.params), SIZES)
    lost = Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="gone"),
                   reply_to=request(2))
    raised = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="x"),
                     reply_to=request(1))
    done = stage(round_of([reply(3, move(3, 0.2)), reply(0, move(0, 0.1)), lost, raised]))
    assert [u.partition_id for _, u in done.accepted] == [0, 3]
    assert [n for n, _ in done.accepted] == [1000, 1003]
    assert (done.rejected, done.missing, done.arrived) == (2, 0, 3)
    np.testing.assert_array_equal(done.accepted[1][1].upload[0], move(3, 0.2)[0])
    assert done.accepted[0][1].num_examples == SIZES[0]
    only_one = stage(round_of([reply(0)]))
    assert (only_one.rejected, only_one.missing, only_one.arrived) == (0, 3, 1)


# ---------------------------------------------------------------- norm filter
def filtered(stage: NormFilter, rnd: int, lengths: dict[int, float]) -> RoundReplies:
    decoder = DecodeReplies(stage.cfg, stage.method.rule, SIZES)
    return stage(decoder(round_of([reply(p, move(p, x)) for p, x in lengths.items()], rnd)))


def test_the_norm_filter_keeps_its_history_across_rounds_and_restores_it() -> None:
    """ratio 20. Round 1: norms 1, 1.5, 2 and 100: median 1.75, limit 35, so 100 goes and
    1, 1.5, 2 are remembered. Round 2, one reply of norm 30: its bar is 20 x median(30, 1,
    1.5, 2) = 35 (kept); a filter without history would use 5 x ||w_t|| and drop it. A filter
    restored from the first one's server state decides alike."""
    cfg = config()
    rule = cfg.spec.server(cfg.params)
    stage = NormFilter(cfg, HeldMethod(rule, rule.init(W_T)))
    one = filtered(stage, 1, {0: 1.0, 1: 1.5, 2: 2.0, 3: 100.0})
    assert [u.partition_id for _, u in one.accepted] == [0, 1, 2] and one.rejected == 1
    assert one.norm_limit_used == pytest.approx(100.0 / (20 * 1.75), rel=1e-5)
    assert stage.history[rk.ARRAYS] == pytest.approx([1.0, 1.5, 2.0], rel=1e-5)

    w_norm = math.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in W_T))
    assert 5.0 * w_norm < 30.0  # the first-round bound would drop it
    restored = NormFilter(cfg, stage.method)
    restored.load(stage.arrays())
    assert restored.history == stage.history
    fresh = NormFilter(cfg, stage.method)
    for kept_by, s in ((True, stage), (True, restored), (False, fresh)):
        two = filtered(s, 2, {0: 30.0})
        assert (len(two.accepted) == 1) is kept_by
    assert stage.history == restored.history
    assert stage.history[rk.ARRAYS][-1] == pytest.approx(30.0, rel=1e-5)
    # round 3, norm 50: bar 20 x median(50, 1, 1.5, 2, 30) = 40, so it goes (the round's own
    # norm alone would set a bar of 1000)
    for s in (stage, restored):
        three = filtered(s, 3, {1: 50.0})
        assert three.accepted == () and three.rejected == 1
        assert three.norm_limit_used == pytest.approx(50.0 / 40.0, rel=1e-5)


def test_the_strategy_checkpoints_and_restores_the_filters_history() -> None:
    s = strategy()
    s.pipeline.stage(NormFilter).history[rk.ARRAYS] = [1.0, 2.0]  # type: ignore[union-attr]
    state = s.server_state()
    np.testing.assert_array_equal(state["norms:" + rk.ARRAYS][0], [1.0, 2.0])
    other = strategy()
    other.load_server_state(state)
    assert other.norm_history == {rk.ARRAYS: [1.0, 2.0]}


# ---------------------------------------------------------------- quorum and sampling
def test_the_quorum_counts_usable_replies_or_under_dp_the_arrived_ones() -> None:
    cfg = config()
    decoded = DecodeReplies(cfg, cfg.spec.server(cfg.params), SIZES)(
        round_of([reply(0), reply(1, metrics={rk.NUM_EXAMPLES: 1})]))
    assert (len(decoded.accepted), decoded.arrived) == (1, 2)
    assert MinReplies(2)(decoded).halted
    assert not MinReplies(2, count_arrived=True)(decoded).halted
    assert not MinReplies(1)(decoded).halted


def test_the_samplers_draw_the_seeded_sample() -> None:
    want = sample_clients(7, 3, 10, 4)
    assert AvailableSampler(7, 10, 4)(3, range(10)).messaged == want
    absent = want[0]
    registered = RegisteredSampler(7, 10, 4)(3, [c for c in range(10) if c != absent])
    assert registered.sampled == 4 and registered.messaged == want[1:]
    replaced = AvailableSampler(7, 10, 4)(3, [c for c in range(10) if c != absent])
    assert len(replaced.messaged) == 4 and absent not in replaced.messaged


# ---------------------------------------------------------------- DP
def clipped(vec: Weights, bound: float) -> list[np.ndarray]:
    length = math.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in vec))
    return [a.astype(np.float64) * min(1.0, bound / length) for a in vec]


def test_the_dp_stage_sum_is_the_clipped_sum_plus_noise_of_the_stated_std() -> None:
    """3 replies of norms 0.5, 4, 9 with C = 2, z = 1.5, seeded: the sum of what the stage
    passes on is sum_i min(1, C/||v_i||) v_i plus, per reply, N(0, (z C / sqrt 3)^2) drawn in
    reply order, so the noise on the sum has std z C."""
    mech = Mechanism(mode="central", clip=2.0, clip_extra=2.0, noise_multiplier=1.5,
                     expected_clients=3)
    decoded = DecodeReplies(config(), config().spec.server(config().params), SIZES)(
        round_of([reply(p, move(p, x)) for p, x in ((0, 0.5), (1, 4.0), (2, 9.0))]))
    out = ClientLevelDp(mech, (), rng=np.random.default_rng(5))(decoded)
    got = [sum(u.upload[k].astype(np.float64) for u in out.contributions) for k in range(2)]
    rng = np.random.default_rng(5)
    want = [np.zeros(a.shape) for a in W_T]
    for p, x in ((0, 0.5), (1, 4.0), (2, 9.0)):
        for k, c in enumerate(clipped(move(p, x), 2.0)):
            noisy = (c.astype(np.float32).astype(np.float64)
                     + rng.normal(0.0, 1.5 * 2.0 / math.sqrt(3), size=c.shape))
            want[k] += noisy.astype(np.float32)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert out.real


def test_the_dp_stage_noise_has_the_stated_std_and_stands_in_for_no_reply() -> None:
    """No accepted reply: one zero contribution carries all the noise (std z C), and the
    round is marked as standing for no client."""
    big = [np.zeros(40_000, np.float32)]
    mech = Mechanism(mode="central", clip=0.8, clip_extra=0.8, noise_multiplier=1.25,
                     expected_clients=4)
    out = ClientLevelDp(mech, ())(RoundReplies(1, big, SENT_TO, 4))
    assert not out.real and len(out.contributions) == 1
    noise = out.contributions[0].upload[0].astype(np.float64)
    assert abs(noise.std() / (1.25 * 0.8) - 1.0) < 0.03 and abs(noise.mean()) < 0.03


# ---------------------------------------------------------------- combine
def test_the_combine_stage_is_the_example_weighted_mean_of_the_moves() -> None:
    cfg = config()
    decoded = DecodeReplies(cfg, cfg.spec.server(cfg.params), SIZES)(
        round_of([reply(p, move(p, 0.1 * (p + 1))) for p in range(4)]))
    out = Combine("update", "examples", RobustMean(cfg))(decoded)
    assert out.weights == tuple(float(n) for n in SIZES)
    for k in range(2):
        want = np.average(np.stack([move(p, 0.1 * (p + 1))[k].astype(np.float64)
                                    for p in range(4)]), axis=0, weights=SIZES)
        assert out.aggregate is not None
        np.testing.assert_allclose(out.aggregate[k], want, rtol=0, atol=1e-7)


# ---------------------------------------------------------------- the pipeline
@dataclasses.dataclass
class Recording:
    """A new stage: sees the round, passes it on unchanged."""

    seen: list[list[int]] = dataclasses.field(default_factory=list)

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        self.seen.append([u.partition_id for u in replies.contributions])
        return replies


def play(s: MethodStrategy, rnd: int, lengths: dict[int, float]) -> Weights:
    msgs = list(s.configure_train(rnd, ArrayRecord(W_T), ConfigRecord(), cast(Grid, None)))
    replies = [reply(m.metadata.dst_node_id - 1000,
                     move(m.metadata.dst_node_id - 1000, lengths[m.metadata.dst_node_id - 1000]))
               for m in msgs]
    arrays, _ = s.aggregate_train(rnd, replies)
    assert arrays is not None
    return unpack(arrays)


def test_a_new_stage_is_inserted_without_touching_the_others() -> None:
    lengths = {0: 1.0, 1: 1.5, 2: 2.0, 3: 100.0}
    plain, recorded = strategy(), strategy()
    recorder = Recording()
    recorded.pipeline = recorded.pipeline.inserted(recorder, before=Combine)
    kinds = [type(st).__name__ for st in recorded.pipeline.stages]
    assert kinds[kinds.index("Recording") + 1] == "Combine"
    assert recorder.seen == []
    a, b = play(plain, 1, lengths), play(recorded, 1, lengths)
    assert recorder.seen == [[0, 1, 2]]  # after the norm filter dropped partition 3
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))
    assert plain.server_state().keys() == recorded.server_state().keys()
    with pytest.raises(ValueError, match="before=Recording is not a stage of this pipeline"):
        plain.pipeline.inserted(Recording(), before=Recording)


@pytest.mark.parametrize("mode", ["off", "central", "local"])
def test_the_dp_decision_shapes_the_pipeline(mode: str) -> None:
    s = strategy(**({} if mode == "off" else {"dp": mode, "weighting": "uniform"}))
    kinds = {type(st) for st in s.pipeline.stages}
    dp = mode != "off"
    assert (ClientLevelDp in kinds) is dp and (NormFilter in kinds) is not dp
    assert isinstance(s.pipeline.sampler, RegisteredSampler if dp else AvailableSampler)
    assert (s.sampling_seed == s.cfg.seed) is not dp
    quorum = s.pipeline.stage(MinReplies)
    assert isinstance(quorum, MinReplies) and quorum.count_arrived is dp
    assert s.decoder.placeholders is (mode == "local")


def test_only_the_pipeline_builder_reads_whether_dp_is_on() -> None:
    repo = Path(__file__).resolve().parents[1]
    root = repo / "strategies"
    stages = sorted((root / "round_stages").glob("*.py"))
    assert len(stages) > 10, "the stages moved: point this check at them"
    readers = sorted(p.relative_to(repo).as_posix()
                     for p in [root / "method_strategy.py", *stages]
                     if re.search(r"\.on\b|\.mode\b|\bc(fg)?\.dp\b", p.read_text()))
    assert readers == ["strategies/round_stages/pipeline.py"]


def test_a_subclass_override_of_the_client_config_reaches_the_messages() -> None:
    """``bench/state_drift.py`` overrides ``_client_config``; the messages stage calls it."""

    class WithoutAccounted(MethodStrategy):
        def _client_config(self, round_config: ConfigRecord, cid: int) -> ConfigRecord:
            config = super()._client_config(round_config, cid)
            del config[rk.ACCOUNTED_ROUND]
            return config

    cfg = config()
    plain = MethodStrategy(cfg, {p: 1000 + p for p in range(4)}, W_T, examples=SIZES)
    other = WithoutAccounted(cfg, {p: 1000 + p for p in range(4)}, W_T, examples=SIZES)
    for s, has in ((plain, True), (other, False)):
        msgs = s.configure_train(1, ArrayRecord(W_T), ConfigRecord(), cast(Grid, None))
        assert all((rk.ACCOUNTED_ROUND in m.content.config_records[rk.CONFIG]) is has
                   for m in msgs)


def test_an_error_the_superlink_wrote_for_a_dead_node_names_that_node_and_client(
        caplog: pytest.LogCaptureFixture) -> None:
    """The SuperLink answers a dead node's task itself (``Node Unavailable``, its own source
    id): the rejection is the node the task went to, and the log names its client."""
    cfg = config()
    stage = DecodeReplies(cfg, cfg.spec.server(cfg.params), SIZES)
    sent = request(2)
    sent.metadata.__dict__["_message_id"] = "train-to-1002"
    err = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Node Unavailable"),
                  reply_to=sent)
    err.metadata.__dict__["_src_node_id"] = 1  # the SuperLink's, as on the wire
    assert err.metadata.src_node_id == 1
    with caplog.at_level("WARNING"):
        done = stage(RoundReplies(1, W_T, SENT_TO, 4, (reply(0), err),
                                  sent_ids={"train-to-1002": 1002}))
    assert done.rejections == ((1002, "client error: Node Unavailable"),)
    assert "rejected reply of node 1002 (partition 2)" in caplog.text
    # without the ids (an older caller) the source id is all there is, as before
    done = stage(RoundReplies(1, W_T, SENT_TO, 4, (reply(0), err)))
    assert done.rejections == ((1, "client error: Node Unavailable"),)
