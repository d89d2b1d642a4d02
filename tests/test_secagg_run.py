"""Secure aggregation wired into a round (``secure-aggregation=secagg+``).

Whole runs go through the real server loop, strategy, pipeline and ClientApp handlers in this
process (``fedinit.cli.inprocess_grid.InProcessGrid``); each is compared with the same run with
secure aggregation off, whose plain replies give the independent mean. The stage tests drive
``SecAggRound`` and ``SecureSum`` with protocol clients over a grid that can drop any of them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from client_app.app import evaluate_fn
from client_app.model_cache import initial_weights
from fedinit.cli.inprocess_grid import InProcessGrid, set_task_identity
from fedinit.config import RunConfig
from fedinit.methods.method import ClientUpdate
from fedinit.methods.packed_arrays import pack, unpack
from fedinit.secure_aggregation import SecAggClient, SecAggParams
from fedinit.secure_aggregation import wire as sw
from fedinit.secure_aggregation.envelope import token_length
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from server_app.run_basics import NothingTrained
from strategies.round_stages.decode import DecodeReplies
from strategies.round_stages.held import AccountedRounds
from strategies.round_stages.method_update import AccountRound
from strategies.round_stages.replies import RoundReplies, run_stages
from strategies.round_stages.secure_sum import SECAGG, SecAggRound, SecureSum, masked_problem
from strategies.secure_upload import STATE, mask_upload
from tests.test_device_privacy import EVALUATE_QUERIES, context, evaluate_message

pytestmark = pytest.mark.usefixtures("quick_runs")  # no test here reads a plot

BASE: dict[str, Any] = {
    "num-clients": 4, "fraction-train": 1.0, "num-server-rounds": 2, "train-limit": 400,
    "local-epochs": 1, "eval-every": 2, "personal-eval-every": 0, "tracking": "off",
    "weighting": "uniform", "max-update-norm-ratio": 0.0}
"""4 clients, all in each round (k = 5 >= 4: the complete graph), 2 short rounds."""


def run(tmp: Path, name: str, over: dict[str, Any]) -> tuple[InProcessGrid, Path]:
    cfg_raw = {**BASE, **over, "output-dir": str(tmp)}
    torch.set_num_threads(1)
    grid = InProcessGrid(4, cfg_raw)
    run_experiment(grid, RunConfig.parse(cfg_raw), out_dir=tmp / name)
    return grid, tmp / name


def train_msgs(grid: InProcessGrid, kind: str = MessageType.TRAIN) -> list[Message]:
    return [m for m in grid.sent if m.metadata.message_type == kind]


def train_replies(grid: InProcessGrid) -> list[Message]:
    return [r for r in grid.replies if r.metadata.message_type == MessageType.TRAIN]


def max_gap(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in
               zip(a, b, strict=True))


@pytest.mark.parametrize("beta", [0.0, 0.1], ids=["fedavg", "fedinit"])
def test_a_secure_run_ends_within_the_quantisation_bound_of_the_plain_run(
        tmp_path: Path, beta: float) -> None:
    plain, plain_dir = run(tmp_path, "plain", {"beta": beta})
    secure, secure_dir = run(tmp_path, "secure", {"beta": beta,
                                                  "secure-aggregation": "secagg+"})
    cfg = RunConfig.parse({**BASE, "secure-aggregation": "secagg+"})
    # the mean of n uploads is off by < 1 step
    step = 2 * cfg.privacy.secagg_clip / 2**cfg.privacy.secagg_bits
    w0 = unpack(train_msgs(plain)[0].content.array_records["arrays"])
    # the plain round 1: each client's delta (no coordinate clipped, or the bound is void),
    # and their mean, computed here from the plain replies
    deltas = [[u.astype(np.float64) - w for u, w in
               zip(unpack(r.content.array_records["arrays"]), w0, strict=True)]
              for r in train_replies(plain)[:4]]
    assert max(max_gap(d, [np.zeros_like(a) for a in d]) for d in deltas) < cfg.privacy.secagg_clip
    mean = [np.mean([d[i] for d in deltas], axis=0) for i in range(len(w0))]
    w1_secure = unpack(train_msgs(secure)[4].content.array_records["arrays"])  # round 2's w_t
    w1_plain = unpack(train_msgs(plain)[4].content.array_records["arrays"])
    assert max_gap(w1_plain, [w + m for w, m in zip(w0, mean, strict=True)]) < 1e-6
    gap1 = max_gap(w1_secure, w1_plain)
    assert 0.0 < gap1 <= step + 1e-6  # quantised, and within one step per coordinate
    # round 2 trains from w1's that differ by < 1 step: its gap is that, carried by training,
    # plus one more step
    gap2 = max_gap(load_checkpoint(secure_dir).weights, load_checkpoint(plain_dir).weights)
    assert gap2 <= 10 * step, (gap1, gap2, step)


def test_the_server_never_holds_a_plain_upload_nor_the_clients_secrets(tmp_path: Path) -> None:
    """Nor a per-client figure: no train or protocol reply carries a metric (train loss, step
    and example counts, compute time, state fallback), and the round's row has no train loss
    (the plain run's row has one: the field is really there to leak)."""
    grid, out = run(tmp_path, "secure", {"secure-aggregation": "secagg+",
                                         "num-server-rounds": 1, "eval-every": 1})
    replies = train_replies(grid)
    assert len(replies) == 4
    secrets = {"sk1", "sk2", "seed", "held-seeds", "held-sk1s", "enc-keys"}
    protocol = [r for r in grid.replies if r.metadata.message_type == MessageType.TRAIN
                or SECAGG in r.content.config_records]  # not the identity queries
    assert len(protocol) == 16
    for reply in grid.replies:
        assert not reply.content.array_records  # no plain arrays in any reply, of any stage
        for rec in reply.content.config_records.values():
            assert not secrets & set(rec)
    for reply in protocol:
        assert all(not dict(rec) for rec in reply.content.metric_records.values()), \
            dict(reply.content.metric_records)
        assert set(reply.content.config_records) <= {SECAGG, "config"}
        if "config" in reply.content.config_records:  # the round's own setting, no figure
            assert set(reply.content.config_records["config"]) == {"upload-delta"}
    row = load_checkpoint(out).rows[-1]
    assert row["num-replies"] == 4 and row["train-loss"] is None
    plain, plain_out = run(tmp_path, "plain", {"num-server-rounds": 1, "eval-every": 1})
    plain_metrics = dict(train_replies(plain)[0].content.metric_records["metrics"])
    assert {"train-loss", "num-examples", "num-steps"} <= set(plain_metrics)
    assert load_checkpoint(plain_out).rows[-1]["train-loss"] is not None
    for reply in replies:
        assert masked_problem(reply.content, unpack(train_msgs(grid)[0].content.array_records[
            "arrays"]), 0, 4) is None
    stages = [(m.metadata.message_type, m.content.config_records[SECAGG][sw.STAGE])
              for m in grid.sent if SECAGG in m.content.config_records]
    q, t = MessageType.QUERY, MessageType.TRAIN
    assert stages == ([(q, "secagg-setup")] * 4 + [(q, "secagg-share-keys")] * 4
                      + [(t, "secagg-collect-masked")] * 4 + [(q, "secagg-unmask")] * 4)
    for ctx in grid.contexts.values():  # the protocol state stayed on the node, done
        assert ctx.state.config_records[STATE]["next"] == "done"


VISIBLE: dict[str, set[tuple[str, str]]] = {
    "identity": {("config", "partition-id"), ("config", "num-partitions")},
    "secagg-setup": {("secagg", k) for k in ("stage", "pk1", "pk2", "sig")},
    "secagg-share-keys": {("secagg", k) for k in ("stage", "dsts", "ctxts", "seed-hash",
                                                   "unverified")},
    "secagg-collect-masked": {("secagg", k) for k in ("stage", "masked", "bad-srcs")}
    | {("config", "upload-delta")},
    "secagg-unmask": {("secagg", k) for k in ("stage", "nids", "shares", "reveal",
                                               "pair-keys")},
}
"""Every (record, key) a reply may carry under secure aggregation, by the reply's kind: the
fields docs/faults.md's table lists as visible in its secure-aggregation column."""


def test_every_reply_under_secagg_carries_only_the_fields_the_docs_list(tmp_path: Path) -> None:
    """Two secure rounds, each centrally evaluated: every reply the server receives (identity
    queries, the four protocol stages, the train replies) is walked record by record, key by
    key. No array and no metric leaves a client, no evaluate message is sent (the per-client
    evaluations are refused with secure aggregation), and nothing but the listed keys is
    there; the same walk over the plain run finds the per-client figures it would catch."""
    def kinds(grid: InProcessGrid) -> dict[str, set[tuple[str, str]]]:
        seen: dict[str, set[tuple[str, str]]] = {}
        for reply in grid.replies:
            assert not reply.has_error(), reply.error.reason
            recs = reply.content.config_records
            kind = str(recs[SECAGG][sw.STAGE]) if SECAGG in recs else (
                "identity" if reply.metadata.message_type == MessageType.QUERY else
                str(reply.metadata.message_type))
            seen.setdefault(kind, set()).update(
                {(name, key) for name, rec in recs.items() for key in rec}
                | {(name, key) for name, rec in reply.content.metric_records.items()
                   for key in rec}
                | {(name, "<arrays>") for name in reply.content.array_records})
        return seen

    over = {"secure-aggregation": "secagg+", "eval-every": 1, "beta": 0.1}
    secure, _ = run(tmp_path, "secure", over)
    seen = kinds(secure)
    assert set(seen) == set(VISIBLE), set(seen)  # every kind of reply, none else
    for kind, fields in seen.items():
        assert fields <= VISIBLE[kind], (kind, fields - VISIBLE[kind])
    assert not [m for m in secure.sent if m.metadata.message_type == MessageType.EVALUATE]
    plain, _ = run(tmp_path, "plain", {**over, "secure-aggregation": "off"})
    leaks = kinds(plain)[MessageType.TRAIN] - VISIBLE["secagg-collect-masked"]
    assert {("arrays", "<arrays>"), ("metrics", "train-loss"),
            ("metrics", "num-examples")} <= leaks, leaks


@pytest.mark.parametrize(("flag", "kind"), EVALUATE_QUERIES)
def test_a_device_in_a_secure_run_answers_no_evaluate_message(
        flag: str | None, kind: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A server that sends a secure run's device an evaluate message anyway (the run config
    refuses all of them) gets a one-line refusal and no figure: each is per client."""
    raw = {**BASE, "secure-aggregation": "secagg+", "local-test-fraction": 0.2,
           "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    with caplog.at_level(logging.INFO, logger="flwr"):
        reply = evaluate_fn(evaluate_message(list(initial_weights(cfg)), flag, 2),
                            context(tmp_path, raw))
    want = (f"device privacy: refused the evaluate message ({kind}) of round 2: under "
            "secure-aggregation='secagg+' this device sends no per-client evaluation (the "
            "server learns only sums)")
    assert reply.has_error() and reply.error.reason == want
    assert not reply.has_content()
    assert [r.getMessage() for r in caplog.records] == [want]


def _drop_train_reply_of(node: int) -> Callable[[Message], Message | None]:
    """A reply filter: ``node``'s train reply is lost (its protocol replies still arrive)."""
    def drop(reply: Message) -> Message | None:
        train = reply.metadata.message_type == MessageType.TRAIN
        return None if train and reply.metadata.src_node_id == node else reply
    return drop


def _run_four(tmp_path: Path, name: str, raw: dict[str, Any],
              reply_filter: Callable[[Message], Message | None]) -> Path:
    """``raw`` run on four in-process clients, each reply passed through ``reply_filter``;
    its run directory, ``tmp_path/name``."""
    raw = {**raw, "output-dir": str(tmp_path)}
    grid = InProcessGrid(4, raw)
    grid.reply_filter = reply_filter
    run_experiment(grid, RunConfig.parse(raw), out_dir=tmp_path / name)
    return tmp_path / name


def test_a_client_dropping_after_key_sharing_leaves_the_survivors_mean(tmp_path: Path) -> None:
    """Node 1003's train reply is lost (after it shared keys): the secure round's model is the
    plain round's over the other three, within one quantisation step."""
    over = {**BASE, "num-server-rounds": 1, "eval-every": 1, "beta": 0.1}
    drop = _drop_train_reply_of(1003)
    plain = load_checkpoint(_run_four(tmp_path, "plain", over, drop))
    secure = load_checkpoint(_run_four(tmp_path, "secure",
                                       {**over, "secure-aggregation": "secagg+"}, drop))
    cfg = RunConfig.parse({**BASE, "secure-aggregation": "secagg+"})
    assert secure.rows[-1]["num-replies"] == 3
    gap = max_gap(secure.weights, plain.weights)
    assert 0.0 < gap <= 2 * cfg.privacy.secagg_clip / 2**cfg.privacy.secagg_bits + 1e-6


def _tamper(stage: str, nodes: set[int], change: Callable[[ConfigRecord], None]
            ) -> Callable[[Message], Message | None]:
    """A reply filter: the ``stage`` protocol reply of each of ``nodes`` altered by ``change``."""
    def hostile(reply: Message) -> Message | None:
        rec = (reply.content.config_records.get(SECAGG)
               if not reply.has_error() else None)
        if reply.metadata.src_node_id in nodes and rec is not None and rec[sw.STAGE] == stage:
            change(rec)
        return reply
    return hostile


def _drop_pk1(rec: ConfigRecord) -> None:
    del rec[sw.PK1]


def _unknown_dst(rec: ConfigRecord) -> None:
    rec[sw.DSTS] = [*list(rec[sw.DSTS])[:-1], 77]  # type: ignore[arg-type]


def _short_masked(rec: ConfigRecord) -> None:
    rec[sw.MASKED] = [b[:-4] for b in rec[sw.MASKED]]  # type: ignore[union-attr]


HOSTILE_RUN = {"setup: no pk1": ("secagg-setup", _drop_pk1, "'pk1' must be non-empty bytes"),
               "share keys: a share for node 77": (
                   "secagg-share-keys", _unknown_dst, "destinations \\[.*77\\], its neighbours"),
               "masked upload 4 bytes short": (
                   "secagg-collect-masked", _short_masked, "masked array 0 has")}


ONE_ROUND: dict[str, Any] = {**BASE, "num-server-rounds": 1, "eval-every": 1}
"""The hostile-client runs: one round of four clients, evaluated."""


def _run_without_3_and_with_3_hostile(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                      stage: str, change: Callable[[ConfigRecord], None]) -> None:
    """Two one-round runs of four clients: plain without client 3's train reply (under
    ``tmp_path/plain``), and secure with its ``stage`` reply altered by ``change`` (under
    ``tmp_path/secure``, its warnings in ``caplog``)."""
    _run_four(tmp_path, "plain", ONE_ROUND, _drop_train_reply_of(1003))
    caplog.clear()  # the plain run's own line about node 1003 (no reply) is not the secure run's
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _run_four(tmp_path, "secure", {**ONE_ROUND, "secure-aggregation": "secagg+"},
                  _tamper(stage, {1003}, change))


def _assert_the_plain_round_of_the_other_three(tmp_path: Path) -> None:
    """The secure run aggregated three replies, and its model is the plain run's within one
    quantisation step (not equal: the sum is quantised)."""
    secure, plain = load_checkpoint(tmp_path / "secure"), load_checkpoint(tmp_path / "plain")
    assert secure.rows[-1]["num-replies"] == 3
    cfg = RunConfig.parse({**ONE_ROUND, "secure-aggregation": "secagg+"})
    gap = max_gap(secure.weights, plain.weights)
    assert 0.0 < gap <= 2 * cfg.privacy.secagg_clip / 2**cfg.privacy.secagg_bits + 1e-6


@pytest.mark.parametrize("name", sorted(HOSTILE_RUN))
def test_a_hostile_protocol_reply_drops_its_client_and_the_round_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str) -> None:
    """Node 1003's reply to one stage is malformed: it is rejected in one line naming client
    3 and node 1003, and the round is the plain round of the other three within one step."""
    stage, change, why = HOSTILE_RUN[name]
    _run_without_3_and_with_3_hostile(tmp_path, caplog, stage, change)
    lines = [r.getMessage() for r in caplog.records if "client 3" in r.getMessage()
             or "node 1003" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "node 1003" in lines[0] and re.search(why, lines[0]), lines[0]
    if stage != "secagg-collect-masked":  # the decoder's line names the node; this one both
        assert f"client 3 (node 1003) dropped at {stage}, its reply is rejected" in lines[0]
    _assert_the_plain_round_of_the_other_three(tmp_path)


def _garbage_ctxts(rec: ConfigRecord) -> None:
    """Every ciphertext replaced by bytes of the right length that no recipient can open."""
    rec[sw.CTXTS] = [bytes(len(c)) for c in rec[sw.CTXTS]]  # type: ignore[union-attr]


def _short_ctxts(rec: ConfigRecord) -> None:
    rec[sw.CTXTS] = [c[:-16] for c in rec[sw.CTXTS]]  # type: ignore[index,union-attr]


@pytest.mark.parametrize(("change", "server_line", "recipients"), [
    (_garbage_ctxts, "the encrypted shares client 3 sent to [0, 1, 2] do not open there", 3),
    (_short_ctxts, f"the ciphertext for 0 has {token_length() - 16} bytes, expected", 0)],
    ids=["undecryptable", "wrong length"])
def test_a_hostile_ciphertext_drops_its_sender_and_the_round_sums_the_rest(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        change: Callable[[ConfigRecord], None], server_line: str, recipients: int) -> None:
    """Node 1003 (client 3) sends encrypted shares its neighbours cannot use. The server
    rejects wrong-length ciphertexts itself; ones of the right length each recipient leaves
    out (one line on its side) and reports in its masked upload. Either way the server drops
    client 3 in one line naming it and its node, no honest client drops, and the round's
    model is the plain round of the other three within one quantisation step."""
    _run_without_3_and_with_3_hostile(tmp_path, caplog, "secagg-share-keys", change)
    lines = [r.getMessage() for r in caplog.records]
    server = [x for x in lines if x.startswith("round 1: secure aggregation:")]
    assert len(server) == 1, server
    assert server[0].startswith("round 1: secure aggregation: client 3 (node 1003) dropped at "
                                "secagg-share-keys, its reply is rejected: ") and \
        server_line in server[0], server[0]
    left_out = [x for x in lines if "left out client 3" in x]
    assert sorted(x.split(":")[0] for x in left_out) == [
        f"secagg client {i}" for i in (0, 1, 2)][:recipients]
    _assert_the_plain_round_of_the_other_three(tmp_path)


def test_hostile_replies_below_the_threshold_fail_the_round_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Two of four setup replies malformed (threshold 3): one line each, then the one line of
    a round without a sum; no train message is sent and the run ends as one whose every
    round had too few replies."""
    over = {**BASE, "num-server-rounds": 1, "eval-every": 1, "output-dir": str(tmp_path),
            "secure-aggregation": "secagg+"}
    grid = InProcessGrid(4, over)
    grid.reply_filter = _tamper("secagg-setup", {1001, 1002}, _drop_pk1)
    with caplog.at_level(logging.WARNING, logger="flwr"), pytest.raises(
            NothingTrained, match="no round of the run aggregated a reply"):
        run_experiment(grid, RunConfig.parse(over), out_dir=tmp_path / "secure")
    assert not train_msgs(grid)
    lines = [r.getMessage() for r in caplog.records if "secure aggregation" in r.getMessage()]
    assert lines == [
        f"round 1: secure aggregation: client {i} (node 100{i}) dropped at secagg-setup, its "
        f"reply is rejected: secagg reply from {i}: 'pk1' must be non-empty bytes, got NoneType"
        for i in (1, 2)] + [
        "round 1: secure aggregation: secagg-setup: 2 clients replied, fewer than the "
        "threshold 3; no sum; no train message is sent, the global model is unchanged"]


# ------------------------------------------------------------------ the stages, one by one
class ProtocolGrid:
    """Protocol clients by node id (node = 100 + client id); ``drop`` node ids answer
    nothing from the given stage on."""

    def __init__(self, ids: list[int]) -> None:
        self.clients = {100 + i: SecAggClient(i) for i in ids}
        self.drop: dict[int, str] = {}

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        out = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            body = dict(msg.content.config_records[SECAGG])
            if node in self.drop and body[sw.STAGE] in self.drop[node]:
                continue
            reply = self.clients[node].handle(body)
            out.append(Message(RecordDict({SECAGG: ConfigRecord(reply)}), reply_to=msg))
        return out


def masked_replies(grid: ProtocolGrid, session: SecAggRound, w_t: list[np.ndarray],
                   ids: list[int], upload_of: Callable[[int], list[np.ndarray] | None],
                   ) -> tuple[dict[int, int], list[Message], tuple[Any, ...]]:
    """Key exchange with clients ``ids`` (node 100 + id), then each one that got a train
    message masks ``upload_of(id)`` (None: it drops after key sharing); the round's sent_to,
    masked replies and their accepted updates (no plain upload, as the decoder makes them)."""
    sent_to = {100 + i: i for i in ids}
    msgs = [Message(RecordDict({"arrays": pack(w_t)}), dst_node_id=100 + i,
                    message_type=MessageType.TRAIN) for i in ids]
    sent = session.key_exchange(grid, 1, w_t, msgs, sent_to)  # type: ignore[arg-type]
    replies = []
    for msg in sent:
        node = msg.metadata.dst_node_id
        upload = upload_of(sent_to[node])
        if upload is None:
            continue
        masked = grid.clients[node].handle(dict(msg.content.config_records[SECAGG]), upload)
        replies.append(Message(RecordDict({SECAGG: ConfigRecord(masked)}), reply_to=msg))
    accepted = tuple((r.metadata.src_node_id,
                      ClientUpdate(partition_id=sent_to[r.metadata.src_node_id], upload=[],
                                   extras={}, num_examples=1, train_loss=0.0, num_steps=1))
                     for r in replies)
    return sent_to, replies, accepted


def one_round(ids: list[int], drop: dict[int, str], vectors: dict[int, list[np.ndarray]],
              params: SecAggParams) -> tuple[RoundReplies, AccountedRounds]:
    """Key exchange, masked train replies from the clients that got a train message and are
    not dropped at ``collect``, then SecureSum and AccountRound."""
    set_task_identity()
    grid = ProtocolGrid(ids)
    grid.drop = drop
    session = SecAggRound(params)
    w_t = [np.zeros(a.shape, dtype=np.float32) for a in next(iter(vectors.values()))]
    sent_to, replies, accepted = masked_replies(
        grid, session, w_t, ids,
        lambda i: None if "collect" in drop.get(100 + i, "") else vectors[i])
    rnd = RoundReplies(1, w_t, sent_to, len(ids), tuple(replies), accepted=accepted)
    accounted = AccountedRounds()
    return run_stages([SecureSum(session), _set_next, AccountRound(accounted,
                                                                    train_loss=False)],
                      rnd), accounted


def _set_next(replies: RoundReplies) -> RoundReplies:
    """The method update's place: w_next = w_t + D with w_t = 0."""
    assert replies.aggregate is not None
    return dataclasses.replace(replies, w_next=replies.aggregate)


def test_secure_sum_stage_is_the_survivors_exact_mean_after_a_dropout() -> None:
    ids = list(range(7))
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0, bits=16)
    rng = np.random.default_rng(3)
    vectors = {i: [rng.uniform(-0.9, 0.9, (3, 4)), rng.uniform(-0.9, 0.9, (5,))] for i in ids}
    # client 2 drops after key sharing (no upload), client 5 during unmask
    done, accounted = one_round(ids, {102: "collect", 105: "secagg-unmask"}, vectors, params)
    survivors = [i for i in ids if i != 2]
    mean = [np.mean([vectors[i][k] for i in survivors], axis=0) for k in range(2)]
    assert not done.halted and done.aggregate is not None
    assert done.weights == (1.0,) * 6
    gap = max_gap(done.aggregate, mean)
    assert gap <= params.step + 1e-6
    assert gap > 0.0
    assert accounted.rounds == {i: 1 for i in survivors}  # the survivors only, the dropped not
    # the mean over all seven is far from it: the dropped client is really left out
    assert max_gap(mean, [np.mean([vectors[i][k] for i in ids], axis=0)
                          for k in range(2)]) > 10 * params.step


def test_a_malformed_upload_past_the_decoder_is_dropped_by_the_sum_stage() -> None:
    """SecureSum on its own (no decoder before it): client 4's masked vector is 4 bytes
    short; it is dropped (not accepted, counted as rejected, not accounted), the others'
    mean is exact within a step."""
    set_task_identity()
    ids = list(range(6))
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0, bits=16)
    rng = np.random.default_rng(5)
    vectors = {i: [rng.uniform(-0.9, 0.9, (3, 4))] for i in ids}
    grid = ProtocolGrid(ids)
    session = SecAggRound(params)
    w_t = [np.zeros((3, 4), dtype=np.float32)]
    sent_to, replies, accepted = masked_replies(grid, session, w_t, ids, lambda i: vectors[i])
    bad = next(r for r in replies if sent_to[r.metadata.src_node_id] == 4)
    rec = bad.content.config_records[SECAGG]
    rec[sw.MASKED] = [b[:-4] for b in rec[sw.MASKED]]  # type: ignore[union-attr]
    rnd = RoundReplies(1, w_t, sent_to, len(ids), tuple(replies), accepted=accepted)
    accounted = AccountedRounds()
    done = run_stages([SecureSum(session), _set_next,
                       AccountRound(accounted, train_loss=False)], rnd)
    kept = [i for i in ids if i != 4]
    assert not done.halted and done.aggregate is not None
    assert [sent_to[n] for n, _ in done.accepted] == kept and done.weights == (1.0,) * 5
    assert done.rejected == 1 and done.rejections[-1][0] == 104
    assert accounted.rounds == {i: 1 for i in kept}
    mean = [np.mean([vectors[i][0] for i in kept], axis=0)]
    assert max_gap(done.aggregate, mean) <= params.step + 1e-6


def test_too_many_dropouts_halt_the_round_and_count_no_client() -> None:
    ids = list(range(5))
    params = SecAggParams(threshold=4, num_shares=5, clip=1.0, bits=16)
    vectors = {i: [np.full((2,), 0.1 * i)] for i in ids}
    done, accounted = one_round(ids, {101: "collect", 103: "collect"}, vectors, params)
    assert done.halted and done.aggregate is None and done.w_next is None
    assert accounted.rounds == {}


def test_a_plain_or_malformed_reply_is_rejected_in_one_line() -> None:
    w_t = [np.zeros((2, 3), dtype=np.float32)]
    plain = RecordDict({"arrays": pack(w_t)})
    assert "plain arrays ['arrays'] under secure aggregation" in str(
        masked_problem(plain, w_t, 0, 4))
    short = RecordDict({SECAGG: ConfigRecord({sw.STAGE: "secagg-collect-masked",
                                              sw.MASKED: [b"\x00" * 20]})})
    assert masked_problem(short, w_t, 0, 4) == "masked array 0 has 20 bytes, expected 24"
    assert "missing ConfigRecord 'secagg'" in str(masked_problem(RecordDict({}), w_t, 0, 4))
    assert DecodeReplies.__dataclass_fields__["secagg"].default is None  # plain by default


def test_a_client_refuses_to_upload_in_the_clear() -> None:
    received = RecordDict({"arrays": pack([np.zeros(2, dtype=np.float32)])})
    with pytest.raises(ValueError, match="refusing to upload in the clear"):
        mask_upload(received, RecordDict({}), RecordDict({}), 0)


def test_a_secure_round_through_flowers_simulation_engine(tmp_path: Path) -> None:
    """Flower's own engine (in this process): messages serialised through its LinkState, each
    ClientApp call on a pickled copy of the node's Context, so the protocol state must survive
    in ``context.state``; the round is aggregated from all four masked uploads."""
    from tests.sim_engine import InProcessSimulation

    over = {**BASE, "num-server-rounds": 1, "eval-every": 1, "output-dir": str(tmp_path),
            "secure-aggregation": "secagg+"}
    cfg = RunConfig.parse(over)
    with InProcessSimulation(cfg.num_clients, over) as sim:
        run_experiment(sim.grid, cfg, out_dir=tmp_path / "engine")
    row = load_checkpoint(tmp_path / "engine").rows[-1]
    assert (row["num-replies"], row["num-rejected"], row["num-missing"]) == (4, 0, 0)


@pytest.mark.parametrize("method", ["fedprox", "fedsam", "ditto", "fedcm", "fedadam"])
def test_each_accepted_method_runs_a_secure_round_near_its_plain_round(
        tmp_path: Path, method: str) -> None:
    """Their server rules read D and clear metrics only: one secure round is aggregated from
    all four masked uploads and lands within one quantisation step of the plain round."""
    over = {"method": method, "num-server-rounds": 1, "eval-every": 1}
    plain_grid, plain_dir = run(tmp_path, "plain", over)
    _, secure_dir = run(tmp_path, "secure", {**over, "secure-aggregation": "secagg+"})
    plain, secure = load_checkpoint(plain_dir), load_checkpoint(secure_dir)
    assert secure.rows[-1]["num-replies"] == 4
    assert secure.rows[-1]["divergence"] is None is not plain.rows[-1]["divergence"]
    cfg = RunConfig.parse({**BASE, "secure-aggregation": "secagg+"})
    step = 2 * cfg.privacy.secagg_clip / 2**cfg.privacy.secagg_bits
    gap = max_gap(secure.weights, plain.weights)
    w0 = unpack(train_msgs(plain_grid)[0].content.array_records["arrays"])
    assert max_gap(plain.weights, w0) > 10 * step  # the round moved the model by far more
    # linear in D but FedAdam: |d step / d D| <= eta_g (1 - beta1) / eps = 1 in round 1
    assert 0.0 < gap <= step + 1e-6, (gap, step)


# ------------------------------------------------------------------ SCAFFOLD and FedDyn: sums
def _state(ckpt_dir: Path, name: str) -> list[np.ndarray]:
    state = load_checkpoint(ckpt_dir).strategy_state
    keys = [k for k in state if k.endswith(name)]
    assert len(keys) == 1, sorted(state)
    return state[keys[0]]


@pytest.mark.parametrize("method", ["scaffold", "feddyn"])
def test_scaffold_and_feddyn_secure_rounds_land_within_a_step_of_their_plain_rounds(
        tmp_path: Path, method: str) -> None:
    """One round: the model and the server state (SCAFFOLD's c, FedDyn's H) computed here from
    the plain replies, and the secure round's within one quantisation step of each; no
    uploaded coordinate (the move nor Delta_c_i) reaches the default secagg-clip."""
    over = {"method": method, "num-server-rounds": 1, "eval-every": 1}
    plain_grid, plain_dir = run(tmp_path, "plain", over)
    secure_grid, secure_dir = run(tmp_path, "secure", {**over, "secure-aggregation": "secagg+"})
    cfg = RunConfig.parse({**BASE, **over, "secure-aggregation": "secagg+"})
    step = 2 * cfg.privacy.secagg_clip / 2**cfg.privacy.secagg_bits
    n = cfg.num_clients
    w0 = unpack(train_msgs(plain_grid)[0].content.array_records["arrays"])
    replies = train_replies(plain_grid)
    assert len(replies) == 4 and len(train_replies(secure_grid)) == 4
    delta = method == "feddyn"  # FedDyn's auto variant is ``update``: the upload is Delta_i
    moves = [[u.astype(np.float64) - (0.0 if delta else w) for u, w in
              zip(unpack(r.content.array_records["arrays"]), w0, strict=True)] for r in replies]
    total = [np.sum([m[i] for m in moves], axis=0) for i in range(len(w0))]
    zero = [np.zeros_like(a, dtype=np.float64) for a in w0]
    largest = {"move": max(max_gap(m, zero) for m in moves)}
    if method == "scaffold":
        dcs = [unpack(r.content.array_records["scaffold-delta-c"]) for r in replies]
        largest["delta-c"] = max(max_gap(d, zero) for d in dcs)
        state = [np.sum([d[i] for d in dcs], axis=0) / n for i in range(len(w0))]  # c
        w1 = [w + t / 4 for w, t in zip(w0, total, strict=True)]
        key, state_step = "c", step  # c = sum / N, its sum is within 4 steps: N = 4
    else:
        state = total  # H = the sum of the moves
        w1 = [w + t / 4 + t / n for w, t in zip(w0, total, strict=True)]
        key, state_step = "h_sum", 4 * step  # H is the sum itself: within 4 steps
    print(method, {k: round(v, 4) for k, v in largest.items()}, "clip", cfg.privacy.secagg_clip)
    assert max(largest.values()) < cfg.privacy.secagg_clip  # nothing clipped, or the bound is void
    plain_w, secure_w = load_checkpoint(plain_dir).weights, load_checkpoint(secure_dir).weights
    assert max_gap(plain_w, w1) < 1e-5  # the independent computation is the plain round's
    assert max_gap(_state(plain_dir, key), state) < 1e-5
    assert load_checkpoint(secure_dir).rows[-1]["num-replies"] == 4
    gap_w = max_gap(secure_w, plain_w)
    gap_s = max_gap(_state(secure_dir, key), _state(plain_dir, key))
    model_step = step * (2 if method == "feddyn" else 1)  # FedDyn: D + H / N, 1 step each
    assert 0.0 < gap_w <= model_step + 1e-6, (gap_w, step)
    assert 0.0 < gap_s <= state_step + 1e-6, (gap_s, step)
    assert max_gap(plain_w, w0) > 10 * step


def test_a_scaffold_client_dropping_after_key_sharing_leaves_the_survivors_means(
        tmp_path: Path) -> None:
    """Node 1003's train reply is lost after key sharing: the secure round's model and c are
    the plain round's over the other three (within a step), and client 3 is not accounted."""
    over = {**BASE, "method": "scaffold", "num-server-rounds": 1, "eval-every": 1}
    drop = _drop_train_reply_of(1003)
    dirs = {"plain": _run_four(tmp_path, "plain", over, drop),
            "secure": _run_four(tmp_path, "secure", {**over, "secure-aggregation": "secagg+"},
                                drop)}
    cfg = RunConfig.parse({**BASE, "secure-aggregation": "secagg+"})
    step = 2 * cfg.privacy.secagg_clip / 2**cfg.privacy.secagg_bits
    plain, secure = load_checkpoint(dirs["plain"]), load_checkpoint(dirs["secure"])
    assert secure.rows[-1]["num-replies"] == 3 == plain.rows[-1]["num-replies"]
    assert 0.0 < max_gap(secure.weights, plain.weights) <= step + 1e-6
    # c = (sum of 3 Delta_c_i) / N: within 3 steps / 4 of the plain c
    assert 0.0 < max_gap(_state(dirs["secure"], "c"), _state(dirs["plain"], "c")) <= step
    accounted = _state(dirs["secure"], "accounted-rounds")[0]
    assert accounted.tolist() == [1, 1, 1, 0]  # the lost client's c_i does not advance


def test_a_scaffold_round_without_a_sum_accounts_nobody() -> None:
    """Too many dropouts after key sharing: no sum, the round halts before the method update
    and the accounting, so no client's c_i is counted as aggregated (as for FedAvg)."""
    set_task_identity()
    ids = list(range(5))
    grid = ProtocolGrid(ids)
    params = SecAggParams(threshold=4, num_shares=5, clip=1.0, bits=16)
    session = SecAggRound(params, extra_keys=("scaffold-delta-c",))
    w_t = [np.zeros((2,), dtype=np.float32)]
    sent_to = {100 + i: i for i in ids}
    msgs = [Message(RecordDict({"arrays": pack(w_t)}), dst_node_id=100 + i,
                    message_type=MessageType.TRAIN) for i in ids]
    sent = session.key_exchange(grid, 1, w_t, msgs, sent_to)  # type: ignore[arg-type]
    assert len(sent) == 5
    replies = []
    for msg in sent[:3]:  # two of five upload nothing: 3 < t = 4
        node = msg.metadata.dst_node_id
        body = dict(msg.content.config_records[SECAGG])
        masked = grid.clients[node].handle(body, [np.full(2, 0.1), np.full(2, 0.4)])
        replies.append(Message(RecordDict({SECAGG: ConfigRecord(masked)}), reply_to=msg))
        assert masked_problem(replies[-1].content, w_t, 1, 4) is None
        assert masked_problem(replies[-1].content, w_t, 0, 4) is not None  # 2 vectors, not 1
    accepted = tuple((r.metadata.src_node_id,
                      ClientUpdate(partition_id=sent_to[r.metadata.src_node_id], upload=[],
                                   extras={}, num_examples=1, train_loss=0.0, num_steps=1))
                     for r in replies)
    rnd = RoundReplies(1, w_t, sent_to, 5, tuple(replies), accepted=accepted)
    accounted = AccountedRounds()
    done = run_stages([SecureSum(session), _set_next,
                       AccountRound(accounted, train_loss=False)], rnd)
    assert done.halted and done.sums is None and done.w_next is None
    assert accounted.rounds == {}


def test_the_secure_sum_is_split_into_the_model_and_each_extra_upload() -> None:
    set_task_identity()
    ids = list(range(5))
    grid = ProtocolGrid(ids)
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0, bits=16)
    session = SecAggRound(params, extra_keys=("scaffold-delta-c",))
    w_t = [np.zeros((3,), dtype=np.float32), np.zeros((2, 2), dtype=np.float32)]
    rng = np.random.default_rng(5)
    vecs = {i: [rng.uniform(-0.5, 0.5, a.shape) for a in w_t * 2] for i in ids}
    # client 4 (node 104) drops after key sharing
    sent_to, replies, accepted = masked_replies(
        grid, session, w_t, ids, lambda i: None if i == 4 else vecs[i])
    done = SecureSum(session)(RoundReplies(1, w_t, sent_to, 5, tuple(replies),
                                           accepted=accepted))
    assert done.sums is not None and done.aggregate is not None
    survivors = [0, 1, 2, 3]
    model = [np.sum([vecs[i][k] for i in survivors], axis=0) for k in range(2)]
    dc = [np.sum([vecs[i][k] for i in survivors], axis=0) for k in range(2, 4)]
    assert 0.0 < max_gap(done.sums["arrays"], model) <= 4 * params.step + 1e-6
    assert 0.0 < max_gap(done.sums["scaffold-delta-c"], dc) <= 4 * params.step + 1e-6
    assert max_gap(done.aggregate, [m / 4 for m in model]) <= params.step + 1e-6


def test_q8_under_secagg_masks_8_bit_values_in_a_16_bit_field(tmp_path: Path) -> None:
    """``compression=q8`` under SecAgg+: the field's quantisation is the codec (8 bits over
    [-secagg-clip, secagg-clip]), so the sum of 4 clients fits 2^16 and each masked
    coordinate travels in 2 bytes, half of the default 16 bits' 4; no train message asks a
    client to compress on its own (the masked upload is the codec); round 1's model is within
    one 8-bit step of the plain run's (the mean of the uploads is off by < 1 step)."""
    one = {"num-server-rounds": 1, "eval-every": 1}
    _, plain_dir = run(tmp_path, "plain", one)
    q8, q8_dir = run(tmp_path, "q8", {**one, "secure-aggregation": "secagg+",
                                      "compression": "q8"})
    _, wide_dir = run(tmp_path, "wide", {**one, "secure-aggregation": "secagg+"})
    w0 = unpack(train_msgs(q8)[0].content.array_records["arrays"])
    coordinates = sum(a.size for a in w0)
    assert load_checkpoint(q8_dir).rows[-1]["bytes-up"] == 4 * 2 * coordinates
    assert load_checkpoint(wide_dir).rows[-1]["bytes-up"] == 4 * 4 * coordinates
    assert all("compression" not in m.content.config_records["config"]
               for m in train_msgs(q8))
    cfg = RunConfig.parse({**BASE, "secure-aggregation": "secagg+", "compression": "q8"})
    step = 2 * cfg.privacy.secagg_clip / 2**8
    gap = max_gap(load_checkpoint(q8_dir).weights, load_checkpoint(plain_dir).weights)
    assert 0.0 < gap <= step + 1e-6, (gap, step)


def test_q2_under_secagg_masks_2_bit_values_in_an_8_bit_field(tmp_path: Path) -> None:
    """``compression=q2`` under SecAgg+: 4 clients' sums of 2-bit values (at most 4 x 3 = 12)
    fit the narrowest field, 8 bits, so each masked coordinate travels in 1 byte; round 1's
    model is within one 2-bit step (2 x secagg-clip / 4) of the plain run's."""
    one = {"num-server-rounds": 1, "eval-every": 1}
    _, plain_dir = run(tmp_path, "plain", one)
    q2, q2_dir = run(tmp_path, "q2", {**one, "secure-aggregation": "secagg+",
                                      "compression": "q2"})
    coordinates = sum(a.size for a in unpack(train_msgs(q2)[0].content
                                             .array_records["arrays"]))
    assert load_checkpoint(q2_dir).rows[-1]["bytes-up"] == 4 * 1 * coordinates
    cfg = RunConfig.parse({**BASE, "secure-aggregation": "secagg+", "compression": "q2"})
    step = 2 * cfg.privacy.secagg_clip / 2**2
    gap = max_gap(load_checkpoint(q2_dir).weights, load_checkpoint(plain_dir).weights)
    assert 0.0 < gap <= step + 1e-6, (gap, step)
