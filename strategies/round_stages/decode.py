"""Stage 3, reply decoding and checks: each reply decoded once into a ``ClientUpdate``, or
rejected with a one-line reason (logged); sorted in client order, so a deployment and a
simulation of the same seed aggregate bit for bit alike."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from logging import WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common.constant import ErrorCode

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.compression import Compression, CompressionError
from fedinit.methods.method import ClientUpdate, ServerRule
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.upload_codec import channels, codec_problem, decode_channel
from fedinit.methods.weights import Weights
from fedinit.task.local_steps import num_steps
from strategies.operator_log import log_line
from strategies.round_stages.replies import Accepted, RoundReplies, log_rejected

if TYPE_CHECKING:  # the protocol loads only for a secure run
    from fedinit.secure_aggregation.params import SecAggParams

NOT_ARRIVED = frozenset({ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
                         ErrorCode.NODE_UNAVAILABLE})
"""Error codes of a reply that never came from the client (the SuperLink's own): under DP
only replies that arrived count against ``min-replies``; any other error is the client's
(its ClientApp raised or crashed, possibly because of its data) and counts as arrived."""


def log_silent(replies: RoundReplies, round_timeout: float, private: bool = False) -> None:
    """One warning per node sent a train message that sent nothing back (counted in
    ``num-missing``): a node on a dead link is named in the log, not only in the count
    (``private``, under DP: to the operator's file, as it names a sampled client)."""
    answered = {replies.node_of(m) for m in replies.messages}
    for node in sorted(set(replies.sent_to) - answered):
        log_line(private, WARNING, "round %d: no reply from node %s (partition %s) by the "
                 "round's end (round-timeout=%gs); counted in num-missing",
                 replies.server_round, node, replies.sent_to[node], round_timeout)


@dataclasses.dataclass(frozen=True)
class DecodeReplies:
    """The checks every reply passes before it may be aggregated.

    ``examples``: each client's true training-example count, which its replies must claim,
    or None where the server cannot know it (device data). ``placeholders``: under local DP
    a device reports nothing that depends on its data (strategies.device_privacy); weights
    are uniform under DP and no rule DP runs with reads the counts, so placeholders stand in,
    whatever a reply claims. ``secagg``: the run's SecAgg+ parameters under secure
    aggregation (None: off), where a reply carries its masked upload in the parameters'
    field and no plain array (``secure_sum.masked_problem``); its update's ``upload`` is
    empty, the sum is ``SecureSum``'s; no per-client metric is read (the client sends none):
    the counts are the server's own (``decode_masked``).
    """

    cfg: RunConfig
    rule: ServerRule
    examples: tuple[int, ...] | None
    placeholders: bool = False
    secagg: SecAggParams | None = None

    @property
    def secure(self) -> bool:
        """Under secure aggregation: only the sum may be learnt."""
        return self.secagg is not None

    @property
    def private(self) -> bool:
        """Under DP a line naming a sampled client goes to the operator's file, not the
        ServerApp's log (strategies/operator_log.py; docs/faults.md, "What each DP mode
        shows")."""
        return self.cfg.privacy.dp != "off"

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        good: list[Accepted] = []
        rejected = 0
        sizes: dict[int, int] = {}
        reasons: list[tuple[int, str]] = []
        arrived: set[int] = set()
        for msg in replies.messages:
            node = replies.node_of(msg)
            if node in replies.sent_to and not (msg.has_error()
                                                and msg.error.code in NOT_ARRIVED):
                arrived.add(node)
            decoded = self.decode(msg, replies.sent_to, replies.w_t)
            if isinstance(decoded, str):
                rejected += 1
                reasons.append((node, decoded))
                log_rejected(replies, node, decoded, self.private)
                continue
            good.append((node, decoded))
            sizes[decoded.partition_id] = decoded.upload_bytes
        log_silent(replies, self.cfg.fleet.round_timeout, self.private)
        good.sort(key=lambda item: item[1].partition_id)
        return dataclasses.replace(
            replies, accepted=tuple(good), rejected=rejected, arrived=len(arrived),
            upload_bytes=sizes,
            rejections=(*replies.rejections, *reasons),
            missing=replies.sampled - len(good) - rejected)

    def decode(self, msg: Message, sent_to: Mapping[int, int],
               w_t: Weights) -> ClientUpdate | str:
        """The reply as a typed update, or why it cannot be aggregated (one line)."""
        if msg.has_error():
            return f"client error: {msg.error.reason}"
        node = msg.metadata.src_node_id
        if node not in sent_to:
            return "reply from a node that was not sampled this round"
        cid = sent_to[node]
        content = msg.content
        if rk.METRICS not in content.metric_records:
            return f"missing MetricRecord {rk.METRICS!r}"
        metrics = content.metric_records[rk.METRICS]
        said = (content.config_records[rk.CONFIG].get(rk.UPLOAD_DELTA)
                if rk.CONFIG in content.config_records else None)
        if said is not (self.cfg.train.ri_aggregation == "update"):
            return (f"the reply says {rk.UPLOAD_DELTA}={said!r}; the round asked for "
                    f"{'Delta_i' if self.cfg.train.ri_aggregation == 'update' else 'w_iK'}")
        if self.secure:  # only the sum may be learnt: no per-client figure is read
            return self.decode_masked(content, cid, w_t)
        problem = codec_problem(self.cfg.train.compression,
                                content.config_records[rk.CONFIG].get(rk.COMPRESSION))
        if problem is not None:
            return problem
        local = self.placeholders
        for key in () if local else (rk.NUM_EXAMPLES, rk.TRAIN_LOSS, rk.NUM_STEPS):
            if key not in metrics:
                return f"missing metric {key!r}"
        n, steps, loss = ((1, 1, math.nan) if local else
                          (metrics[rk.NUM_EXAMPLES], metrics[rk.NUM_STEPS], metrics[rk.TRAIN_LOSS]))
        if not local:
            for key, value in ((rk.NUM_EXAMPLES, n), (rk.NUM_STEPS, steps)):
                if not isinstance(value, int) or value <= 0:
                    return f"{key}={value!r} is not a positive integer"
            assert isinstance(n, int) and isinstance(steps, int)
            problem = self.examples_problem(cid, n)
            if problem is not None:
                return problem
            if not isinstance(loss, int | float) or not math.isfinite(float(loss)):
                return f"train-loss={loss!r} is not finite"
        arrays: dict[str, Weights] = {}
        upload_bytes = 0
        codec = Compression.parse(self.cfg.train.compression)
        delta = self.cfg.train.ri_aggregation == "update"
        for key in channels(self.rule.up_keys):
            if key not in content.array_records:
                return f"missing ArrayRecord {key!r}"
            try:  # decoded first: every check and stage after sees the decoded vectors
                wire = unpack(content.array_records[key])
                upload_bytes += sum(a.nbytes for a in wire)
                arrays[key] = decode_channel(codec, key, wire, w_t, delta)
            except CompressionError as err:
                return str(err)
            except ValueError as err:
                return f"ArrayRecord {key!r}: {err}"
            problem = arrays_problem(key, arrays[key], w_t)
            if problem is not None:
                return problem
        update = ClientUpdate(partition_id=cid, upload=arrays.pop(rk.ARRAYS), extras=arrays,
                              num_examples=n, train_loss=float(loss), num_steps=steps,
                              metrics=dict(metrics), upload_bytes=upload_bytes)
        problem = self.rule.reply_problem(update, self.expected_steps(cid))
        return update if problem is None else problem

    def decode_masked(self, content: RecordDict, cid: int, w_t: Weights) -> ClientUpdate | str:
        """A masked reply: its counts are the ones the server derives itself (the
        partition's size and step count, else 1: uniform weighting reads neither), its train
        loss unknown (NaN); whatever metrics it carries are not read."""
        from fedinit.secure_aggregation import wire as sw  # only a secure run's replies
        from strategies.round_stages.secure_sum import SECAGG, masked_problem

        assert self.secagg is not None  # decode() calls this only under secure aggregation
        problem = masked_problem(content, w_t, len(self.rule.up_keys),
                                 self.secagg.field_bits // 8)
        if problem is not None:
            return problem
        steps = self.expected_steps(cid)
        blobs = content.config_records[SECAGG][sw.MASKED]
        assert isinstance(blobs, list)  # masked_problem checked: a list of bytes
        update = ClientUpdate(partition_id=cid, upload=[], extras={},
                              num_examples=self.true_examples(cid) or 1,
                              train_loss=math.nan, num_steps=steps or 1,
                              upload_bytes=sum(len(b) for b in blobs))
        problem = self.rule.reply_problem(update, steps)
        return update if problem is None else problem

    def examples_problem(self, partition_id: int, n: int) -> str | None:
        """Why a claimed example count (the reply's weight) cannot be true, or None.

        ``max-examples-per-client`` > 0 (clients with their own data) only caps the claim;
        otherwise it must equal the partition's size, which the server derives from the
        run config exactly as the client does.
        """
        ceiling = self.cfg.robust.max_examples_per_client
        if ceiling > 0:
            return None if n <= ceiling else (
                f"num-examples={n} > max-examples-per-client={ceiling}")
        want = self.true_examples(partition_id)
        return None if want is None or n == want else (
            f"num-examples={n}, but partition {partition_id} holds {want} examples")

    def true_examples(self, partition_id: int) -> int | None:
        """The partition's example count when the server knows it (exact-count mode)."""
        if self.examples is None or self.cfg.robust.max_examples_per_client > 0:
            return None
        return self.examples[partition_id]

    def expected_steps(self, partition_id: int) -> int | None:
        """The local SGD steps the partition takes, when the server knows its size."""
        n = self.true_examples(partition_id)
        c = self.cfg
        return None if n is None else num_steps(n, c.train.local_epochs, c.train.batch_size)


def arrays_problem(key: str, arrays: Sequence[np.ndarray], reference: Weights) -> str | None:
    """Shape, dtype and finiteness check of one model-shaped upload against the model."""
    if len(arrays) != len(reference):
        return f"{key!r} has {len(arrays)} arrays, expected {len(reference)}"
    for i, (a, r) in enumerate(zip(arrays, reference, strict=True)):
        if a.shape != r.shape:
            return f"{key!r}[{i}] has shape {a.shape}, expected {r.shape}"
        if a.dtype != r.dtype:
            return f"{key!r}[{i}] has dtype {a.dtype}, expected {r.dtype}"
        if not np.all(np.isfinite(a)):
            return f"{key!r}[{i}] holds NaN or Inf"
    return None
