"""``strategies.client.method_train`` (the client half for a user's own ClientApp) does not
mask: under secure aggregation it refuses in one line, before training, never uploading in
the clear."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord

from fedinit.methods.packed_arrays import unpack
from fedinit.secure_aggregation import wire as sw
from strategies import client
from strategies.client import SECAGG_REFUSAL, stored_state
from tests.test_strategies import message, node, problem, user_train


def test_method_train_refuses_a_secure_round_in_one_line_before_training() -> None:
    assert client.SECAGG == sw.RECORD
    x, y = problem(0)
    w_t = np.array([0.3, 0.1, -0.2])
    msg = message("fedavg", {}, w_t, 1)
    msg.content.config_records[sw.RECORD] = ConfigRecord({sw.STAGE: "secagg-collect-masked"})
    ctx = node()
    with pytest.raises(ValueError) as err:
        user_train(msg, ctx, x, y, 1)
    assert str(err.value) == SECAGG_REFUSAL and "\n" not in SECAGG_REFUSAL
    assert "refusing to train and to upload in the clear" in SECAGG_REFUSAL
    assert stored_state(ctx) == {}  # nothing trained, nothing stored
    plain = message("fedavg", {}, w_t, 1)  # the same message without the record trains
    reply, _ = user_train(plain, node(), x, y, 1)
    assert unpack(reply.content.array_records["arrays"])[0].shape == (1, 3)
