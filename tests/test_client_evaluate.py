"""The ClientApp's evaluate handler, called as Flower calls it, against an evaluation written
here from the definitions (mean cross-entropy and accuracy on the client's own partition)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict

from client_app.app import evaluate_fn
from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.task.federated_data import client_examples, dataset_of
from fedinit.task.models import build_model, get_weights

RUN = {"num-clients": 4, "train-limit": 1000, "brightness-noise": 0.1}
NODE = 7


def _message(weights: list[np.ndarray]) -> Message:
    set_task_identity()
    msg = Message(content=RecordDict({rk.ARRAYS: ArrayRecord(weights)}), dst_node_id=NODE,
                  message_type=MessageType.EVALUATE)
    msg.metadata.__dict__["_message_id"] = "evaluate-1"  # the SuperLink assigns it in a run
    return msg


def _context(partition_id: int) -> Context:
    return Context(run_id=1, node_id=NODE, state=RecordDict(), run_config=dict(RUN),
                   node_config={"partition-id": partition_id, "num-partitions": 4})


def _independent(weights: list[np.ndarray], partition_id: int) -> tuple[float, float, int]:
    """Loss and accuracy from scratch: its own model, its own normalisation, one batch."""
    cfg = RunConfig.parse(RUN)
    data = dataset_of(cfg)
    model = build_model(cfg.train.model, data.num_classes, data.in_channels, 0, data.image_size)
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights, strict=True):
            p.copy_(torch.from_numpy(w))
    x, y = client_examples(cfg, partition_id)
    mean = np.asarray(data.mean, dtype=np.float32)
    std = np.asarray(data.std, dtype=np.float32)
    images = torch.from_numpy(((x.astype(np.float32) / 255.0 - mean) / std).transpose(0, 3, 1, 2))
    labels = torch.from_numpy(y.astype(np.int64))
    model.eval()
    with torch.no_grad():
        logits = model(images)
    loss = float(torch.nn.functional.cross_entropy(logits, labels))
    return loss, float((logits.argmax(1) == labels).double().mean()), len(y)


def test_evaluate_fn_scores_the_received_model_on_the_clients_partition() -> None:
    cfg = RunConfig.parse(RUN)
    data = dataset_of(cfg)
    # not the run's w_0 (seed 0), so a handler that ignored the message would be caught
    weights = get_weights(build_model(cfg.train.model, data.num_classes, data.in_channels, 5,
                                      data.image_size))
    msg = _message(weights)
    results = {}
    for cid in (1, 2):
        reply = evaluate_fn(msg, _context(cid))
        assert reply.metadata.reply_to_message_id == "evaluate-1"
        metrics = reply.content.metric_records[rk.METRICS]
        loss, acc, n = _independent(weights, cid)
        assert metrics[rk.NUM_EXAMPLES] == n
        assert metrics["eval-loss"] == pytest.approx(loss, rel=1e-5)
        assert metrics["eval-acc"] == pytest.approx(acc, abs=1.0 / n)
        results[cid] = (metrics["eval-loss"], n)
    assert results[1] != results[2]  # each client scores its own partition
    assert 0.0 < results[1][0] < 10.0


def test_evaluate_fn_refuses_a_node_without_a_valid_partition() -> None:
    cfg = RunConfig.parse(RUN)
    data = dataset_of(cfg)
    weights = get_weights(build_model(cfg.train.model, data.num_classes, data.in_channels, 0,
                                      data.image_size))
    with pytest.raises(ValueError, match="outside 0..3"):
        evaluate_fn(_message(weights), _context(4))
